"""What a data set is (:class:`Dataset`, the base of every registered one) and the in-memory
forms its loader returns, before partitioning: decoded images (:class:`RawData`) or labelled
texts (:class:`RawText`, tokenized by the prepare step into a :class:`RawData` of token-id
arrays)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from mpifed.data.image_rows import ImageRows
from mpifed.plugin.options import NoOptions


class DataMissing(FileNotFoundError):
    """The raw files of a data set are not where the config says."""


class Dataset:
    """A registered data set (see :mod:`mpifed.data.sets`): its config keys (``Options``), what
    it holds (``modality``: "image" or "text"), the augmentation its papers use by default
    (``crop_padding``, ``flip``), the names of its classes in label order when it has them
    (``class_names``, for figures), and ``load(options) -> RawData | RawText``.

    A data set read from files under ``options.root`` names them in ``needs`` (``"train/"`` a
    folder, ``"train.csv"`` a file; :meth:`needed` when they depend on the options). It then
    has :meth:`raw_missing`, a cheap check that reads nothing (``python -m mpifed.table
    --list`` marks the runs whose data is missing), and :meth:`root`, the folder once the files
    are there, else a :class:`DataMissing` that names the missing ones and ``how_to_get``.
    """

    Options: ClassVar[type] = NoOptions
    title: ClassVar[str] = ""            # the data set's name in messages
    modality: ClassVar[str] = "image"
    crop_padding: ClassVar[int] = 0
    flip: ClassVar[bool] = False
    class_names: ClassVar[tuple[str, ...] | None] = None
    needs: ClassVar[tuple[str, ...]] = ()
    how_to_get: ClassVar[str] = ""       # the end of the DataMissing message: where the files come from

    @classmethod
    def needed(cls, options: Any) -> list[str]:
        """The files and folders (ending in ``/``) that ``options.root`` must hold."""
        return list(cls.needs)

    @classmethod
    def raw_missing(cls, options: Any) -> Path | None:
        """The folder expected to hold the raw files when some are not there; None when they all are."""
        return Path(options.root) if cls._absent(options) else None

    @classmethod
    def root(cls, options: Any) -> Path:
        """``options.root``, once every needed file is there."""
        absent = cls._absent(options)
        if absent:
            raise DataMissing(f"{cls.title}: {', '.join(absent)} not found in {options.root}. {cls.how_to_get}")
        return Path(options.root)

    @classmethod
    def _absent(cls, options: Any) -> list[str]:
        needed = cls.needed(options)
        root = Path(options.root) if needed else None
        return [n for n in needed if not ((root / n).is_dir() if n.endswith("/") else (root / n).is_file())]


def class_names(dataset: object, num_classes: int) -> list[str] | None:
    """The class names of a data set's entry, when it has them for this many classes."""
    names = getattr(dataset, "class_names", None)
    return list(names) if names is not None and len(names) == num_classes else None


def modality(dataset: object) -> str:
    """"image" or "text": what a data set (or a model entry) works on."""
    return getattr(dataset, "modality", "image")


Arrays = np.ndarray | ImageRows | dict[str, np.ndarray]


def select(x: Arrays, idx: np.ndarray | slice) -> Arrays:
    """Rows ``idx`` of an input array or of every array of a dict (of images in a file: a view, read later)."""
    return x.select(idx) if isinstance(x, ImageRows) else take(x, idx)


def take(x: Arrays, idx: np.ndarray | slice) -> np.ndarray | dict[str, np.ndarray]:
    """Rows ``idx`` of an input array or of every array of a dict, in memory."""
    return {k: v[idx] for k, v in x.items()} if isinstance(x, dict) else x[idx]


@dataclass
class RawText:
    """Texts and int64 labels of a train and a test split (tokenized later, by the prepare step),
    and the raw files read (for the manifest's fingerprint)."""

    train_texts: list[str]
    train_y: np.ndarray
    test_texts: list[str]
    test_y: np.ndarray
    num_classes: int
    source: str
    files: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("train", "test"):
            texts, y = getattr(self, f"{name}_texts"), getattr(self, f"{name}_y")
            if y.dtype != np.int64 or y.shape != (len(texts),):
                raise ValueError(f"{name} labels must be int64 of length {len(texts)}, got {y.dtype} {y.shape}")
            if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
                raise ValueError(f"{name} labels must lie in [0, {self.num_classes}), got [{y.min()}, {y.max()}]")


@dataclass
class RawData:
    """Model inputs and int64 labels of a train and a test split.

    Inputs are decoded images (uint8, N x C x H x W) or a dict of named integer arrays with
    N rows (token ids and attention masks, N x length). Training images too large to hold in
    memory may be an :class:`~mpifed.data.image_rows.ImageRows` (a file), read a block of clients
    at a time when prepared.

    ``train_groups``/``test_groups`` give each sample's natural group (a writer, a domain)
    where the data set has one; ``group_names`` names the groups that evaluation reports
    separately (the ids in ``test_groups``; empty when test accuracy is not split by group).
    ``files`` lists the raw files (or, for folders of images, the folders) read, whose
    fingerprint the manifest keeps (see :mod:`mpifed.data.fingerprint`).
    """

    train_x: Arrays
    train_y: np.ndarray
    test_x: Arrays
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
            if isinstance(x, dict):
                bad = {k: (v.dtype.name, v.shape) for k, v in x.items() if v.dtype.kind not in "iu" or v.ndim != 2}
                if not x or bad:
                    raise ValueError(f"{name} inputs must be 2-D integer arrays (N x length), got {bad or 'none'}")
                rows = {len(v) for v in x.values()}
                if len(rows) != 1:
                    raise ValueError(f"{name} input arrays differ in length: {sorted(rows)}")
                n = rows.pop()
            elif x.dtype != np.uint8 or x.ndim != 4:
                raise ValueError(f"{name} images must be uint8 N x C x H x W, got {x.dtype} {x.shape}")
            else:
                n = len(x)
            if y.dtype != np.int64 or y.shape != (n,):
                raise ValueError(f"{name} labels must be int64 of length {n}, got {y.dtype} {y.shape}")
            if len(y) and (y.min() < 0 or y.max() >= self.num_classes):
                raise ValueError(f"{name} labels must lie in [0, {self.num_classes}), got [{y.min()}, {y.max()}]")
        if _shapes(self.train_x) != _shapes(self.test_x):
            raise ValueError(f"train and test inputs differ in shape: {_shapes(self.train_x)} vs "
                             f"{_shapes(self.test_x)}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        """One sample's shape: C, H, W for images; the sequence length for token ids."""
        first = next(iter(self.train_x.values())) if isinstance(self.train_x, dict) else self.train_x
        return tuple(first.shape[1:])


def _shapes(x: Arrays) -> dict[str, tuple[int, ...]]:
    return {k: v.shape[1:] for k, v in x.items()} if isinstance(x, dict) else {"images": x.shape[1:]}


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
