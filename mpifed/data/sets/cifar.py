"""CIFAR-10 and CIFAR-100 from their python pickle batches, laid out as torchvision downloads them."""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from mpifed.data.raw import DataMissing, Dataset, RawData
from mpifed.plugin.options import opt
from mpifed.plugin.registry import DATASETS


def read_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One pickle batch: (N x 3 x 32 x 32 uint8 images, int64 labels)."""
    try:
        with open(path, "rb") as f:
            d = pickle.load(f, encoding="bytes")
    except FileNotFoundError:
        raise DataMissing(f"{path} not found") from None
    except (pickle.UnpicklingError, EOFError) as exc:
        raise ValueError(f"{path} is not a CIFAR pickle batch ({exc})") from None
    data = np.asarray(d[b"data"], dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"{path}: 'data' must be N x 3072 uint8, got {data.shape}")
    return data.reshape(-1, 3, 32, 32), np.asarray(d[label_key], dtype=np.int64)


def _load(root: Path, folder: str, train: list[str], test: list[str], label_key: bytes, classes: int,
          download: bool, tv_name: str, title: str) -> RawData:
    base = root / folder
    if not base.is_dir():
        if not download:
            raise DataMissing(f"{title}: folder {base} not found. Point data.dataset.root at the folder that holds "
                              f"{folder}/, or set data.dataset.download=true to fetch it with torchvision")
        import torchvision
        getattr(torchvision.datasets, tv_name)(str(root), train=True, download=True)
    tr = [read_batch(base / name, label_key) for name in train]
    te = [read_batch(base / name, label_key) for name in test]
    return RawData(np.concatenate([x for x, _ in tr]), np.concatenate([y for _, y in tr]),
                   np.concatenate([x for x, _ in te]), np.concatenate([y for _, y in te]), classes,
                   f"{title} pickle batches in {base}", files=[base / name for name in train + test])


def _missing(options, folder: str) -> Path | None:
    base = Path(options.root) / folder
    return None if base.is_dir() or options.download else base


CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


@DATASETS.register("cifar10")
class Cifar10(Dataset):
    """CIFAR-10 (50,000 + 10,000 32x32 colour images, 10 classes) from ``cifar-10-batches-py``."""

    @dataclass
    class Options:
        root: str = opt("data/raw", "folder that holds cifar-10-batches-py/")
        download: bool = opt(False, "fetch with torchvision when missing (needs internet)", math=False)

    crop_padding = 4
    flip = True
    class_names = CIFAR10_CLASSES

    @staticmethod
    def raw_missing(options) -> Path | None:
        return _missing(options, "cifar-10-batches-py")

    @staticmethod
    def load(options) -> RawData:
        return _load(Path(options.root), "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)],
                     ["test_batch"], b"labels", 10, options.download, "CIFAR10", "CIFAR-10")


@DATASETS.register("cifar100")
class Cifar100(Dataset):
    """CIFAR-100 (50,000 + 10,000 32x32 colour images) from ``cifar-100-python``: 100 fine or 20 coarse classes."""

    @dataclass
    class Options:
        root: str = opt("data/raw", "folder that holds cifar-100-python/")
        labels: Literal["fine", "coarse"] = opt("fine", "the 100 fine classes or the 20 superclasses")
        download: bool = opt(False, "fetch with torchvision when missing (needs internet)", math=False)

    crop_padding = 4
    flip = True

    @staticmethod
    def raw_missing(options) -> Path | None:
        return _missing(options, "cifar-100-python")

    @staticmethod
    def load(options) -> RawData:
        key = b"fine_labels" if options.labels == "fine" else b"coarse_labels"
        return _load(Path(options.root), "cifar-100-python", ["train"], ["test"], key,
                     100 if options.labels == "fine" else 20, options.download, "CIFAR100", "CIFAR-100")
