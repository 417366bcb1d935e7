"""MNIST-family IDX files (``train-images-idx3-ubyte[.gz]`` and friends)."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

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


def load_idx_split(root: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N x 1 x H x W uint8) and int64 labels of the ``train`` or ``t10k`` split."""
    images = read_idx(find_idx(root, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find_idx(root, f"{prefix}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise ValueError(f"IDX files under {root} ({prefix}) do not pair up: images {images.shape}, labels {labels.shape}")
    return images[:, None].astype(np.uint8), labels.astype(np.int64)
