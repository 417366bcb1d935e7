"""The in-memory form every data-set loader returns, before partitioning."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np


class DataMissing(FileNotFoundError):
    """The raw files of a data set are not where the config says."""


class Dataset(Protocol):
    """What a registered data set provides (see :mod:`mpifed.data.sets`)."""

    Options: type
    crop_padding: int
    flip: bool

    @staticmethod
    def load(options) -> "RawData": ...

    # Data sets read from files also define ``raw_missing(options) -> Path | None``: the folder
    # they expect when their files are not there (None when present or fetched on demand), a
    # cheap check that reads nothing (``python -m mpifed.table --list`` marks such runs).


@dataclass
class RawData:
    """Decoded images (uint8, N x C x H x W) and int64 labels of a train and a test split.

    ``train_groups``/``test_groups`` give each sample's natural group (a writer, a domain)
    where the data set has one; ``group_names`` names the groups that evaluation reports
    separately (the ids in ``test_groups``; empty when test accuracy is not split by group).
    ``files`` lists the raw files (or, for folders of images, the folders) read, whose
    fingerprint the manifest keeps (see :mod:`mpifed.data.fingerprint`).
    """

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    source: str
    train_groups: np.ndarray | None = None
    test_groups: np.ndarray | None = None
    group_names: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("train", "test"):
            x, y = getattr(self, f"{name}_x"), getattr(self, f"{name}_y")
            if x.dtype != np.uint8 or x.ndim != 4:
                raise ValueError(f"{name} images must be uint8 N x C x H x W, got {x.dtype} {x.shape}")
            if y.dtype != np.int64 or y.shape != (len(x),):
                raise ValueError(f"{name} labels must be int64 of length {len(x)}, got {y.dtype} {y.shape}")
            if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
                raise ValueError(f"{name} labels must lie in [0, {self.num_classes}), got [{y.min()}, {y.max()}]")
        if self.train_x.shape[1:] != self.test_x.shape[1:]:
            raise ValueError(f"train and test images differ in shape: {self.train_x.shape[1:]} vs {self.test_x.shape[1:]}")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])  # type: ignore[return-value]


def stratified_split(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test) with ``fraction`` of every class in test, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = int(round(len(idx) * fraction))
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
