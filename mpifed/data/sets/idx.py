"""MNIST and Fashion-MNIST from their IDX files (``train-images-idx3-ubyte[.gz]`` and friends)."""
from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpifed.data.raw import DataMissing, Dataset, RawData
from mpifed.plugin.options import opt
from mpifed.plugin.registry import DATASETS

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """One IDX file (optionally gzipped) as a numpy array of its declared shape."""
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_DTYPES[raw[2]])
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"{path} is truncated or corrupt: {len(raw)} bytes, the header promises {expected}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write ``array`` (uint8) as an IDX file; gzipped when the name ends in .gz."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    data = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(s).to_bytes(4, "big") for s in array.shape) + array.tobytes()
    path = Path(path)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def find_idx(root: Path, stem: str) -> Path:
    """``root/stem`` or ``root/stem.gz``, also under ``raw/`` (torchvision's layout)."""
    for folder in (root, root / "raw"):
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    raise FileNotFoundError(f"{stem}(.gz) is missing")


def idx_files(root: Path, prefix: str) -> tuple[Path, Path]:
    """The images and labels files of the ``train`` or ``t10k`` split."""
    return find_idx(root, f"{prefix}-images-idx3-ubyte"), find_idx(root, f"{prefix}-labels-idx1-ubyte")


def load_idx_split(root: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N x 1 x H x W uint8) and int64 labels of the ``train`` or ``t10k`` split."""
    images_file, labels_file = idx_files(root, prefix)
    images, labels = read_idx(images_file), read_idx(labels_file)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"IDX files under {root} ({prefix}) do not pair up: images {images.shape}, labels "
                         f"{labels.shape}")
    return images[:, None].astype(np.uint8), labels.astype(np.int64)


def _idx_dataset(title: str, default_root: str, torchvision_name: str, classes: tuple[str, ...] | None = None) -> type:
    @dataclass
    class Options:
        root: str = opt(default_root, f"folder with the {title} IDX files (train-images-idx3-ubyte[.gz], ...)")
        download: bool = opt(False, "fetch the files with torchvision when they are missing (needs "
                                    "internet)", math=False)

    class IdxDataset(Dataset):
        __doc__ = f"{title} from its IDX files (60,000 training and 10,000 test 28x28 grey images)."
        class_names = classes

        @staticmethod
        def load(options) -> RawData:
            root = Path(options.root)
            try:
                return IdxDataset._read(root)
            except FileNotFoundError as missing:
                if not options.download:
                    raise DataMissing(
                        f"{title}: cannot read the IDX files in {root}: {missing}. Point data.dataset.root at the "
                        "folder with the IDX files, or set data.dataset.download=true to fetch them with "
                        "torchvision") from None
            import torchvision
            getattr(torchvision.datasets, torchvision_name)(str(root), train=True, download=True)
            return IdxDataset._read(root / torchvision_name / "raw")

        @staticmethod
        def raw_missing(options) -> Path | None:
            root = Path(options.root)
            try:
                find_idx(root, "train-images-idx3-ubyte")
            except FileNotFoundError:
                return None if options.download else root
            return None

        @staticmethod
        def _read(root: Path) -> RawData:
            if not root.is_dir():
                raise FileNotFoundError("the folder does not exist")
            trx, try_ = load_idx_split(root, "train")
            tex, tey = load_idx_split(root, "t10k")
            return RawData(trx, try_, tex, tey, 10, f"{title} IDX files in {root}",
                           files=[*idx_files(root, "train"), *idx_files(root, "t10k")])

    IdxDataset.Options = Options
    return IdxDataset


DATASETS.register("mnist")(_idx_dataset("MNIST", "data/raw/mnist", "MNIST"))
DATASETS.register("fashion_mnist")(_idx_dataset("Fashion-MNIST", "/usr/share/datasets/fashion-mnist", "FashionMNIST", (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")))
