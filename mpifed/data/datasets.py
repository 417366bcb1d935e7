"""Registry of data sets: each reads its real on-disk format into :class:`RawData`.

A data set is a class with ``Options`` (its config keys), ``load(options)`` and the
augmentation its papers use by default (``crop_padding``, ``flip``). New data sets
register with :func:`register`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from mpifed.config import opt
from mpifed.data.idx import load_idx_split
from mpifed.data.raw import RawData, stratified_split


class Dataset(Protocol):
    Options: type
    crop_padding: int
    flip: bool

    @staticmethod
    def load(options) -> RawData: ...


DATASETS: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    def add(cls: type) -> type:
        DATASETS[name] = cls
        return cls
    return add


class DataMissing(FileNotFoundError):
    """The raw files of a data set are not where the config says."""


@register("digits")
class Digits:
    """scikit-learn's 8x8 handwritten digits (1,797 images, shipped with scikit-learn; no download).

    Pixel values 0..16 are scaled to 0..255. There is no official test split: a
    stratified ``test_fraction`` is held out with ``split_seed``.
    """

    @dataclass
    class Options:
        test_fraction: float = opt(0.2, "fraction of each class held out as the test set", min=0, max=1, exclusive_min=True)
        split_seed: int = opt(0, "seed of the train/test split", min=0)

    crop_padding = 0
    flip = False

    @staticmethod
    def load(options: "Digits.Options") -> RawData:
        from sklearn.datasets import load_digits
        bunch = load_digits()
        x = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
        y = bunch.target.astype(np.int64)
        tr, te = stratified_split(y, options.test_fraction, options.split_seed)
        return RawData(x[tr], y[tr], x[te], y[te], 10, "scikit-learn load_digits")


@register("synthetic")
class Synthetic:
    """Class-dependent random patterns plus noise: tiny, learnable, for tests and benchmarks."""

    @dataclass
    class Options:
        train_samples: int = opt(600, "training images", min=1)
        test_samples: int = opt(200, "test images", min=1)
        num_classes: int = opt(10, "classes", min=2)
        channels: int = opt(1, "image channels", min=1)
        size: int = opt(8, "image height and width", min=4)
        noise: float = opt(40.0, "standard deviation of the pixel noise (0..255 scale)", min=0)
        data_seed: int = opt(0, "seed of the class patterns and samples", min=0)

    crop_padding = 0
    flip = False

    @staticmethod
    def load(options: "Synthetic.Options") -> RawData:
        rng = np.random.default_rng(options.data_seed)
        shape = (options.channels, options.size, options.size)
        templates = rng.uniform(0, 255, size=(options.num_classes, *shape))

        def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
            y = rng.integers(0, options.num_classes, size=n).astype(np.int64)
            x = templates[y] + rng.normal(0, options.noise, size=(n, *shape))
            return np.clip(np.rint(x), 0, 255).astype(np.uint8), y

        trx, try_ = draw(options.train_samples)
        tex, tey = draw(options.test_samples)
        return RawData(trx, try_, tex, tey, options.num_classes, f"synthetic (seed {options.data_seed})")


def _idx_dataset(title: str, default_root: str, torchvision_name: str) -> type:
    @dataclass
    class Options:
        root: str = opt(default_root, f"folder with the {title} IDX files (train-images-idx3-ubyte[.gz], ...)")
        download: bool = opt(False, "fetch the files with torchvision when they are missing (needs internet)", math=False)

    class IdxDataset:
        __doc__ = f"{title} from its IDX files (60,000 training and 10,000 test 28x28 grey images)."
        crop_padding = 0
        flip = False

        @staticmethod
        def load(options) -> RawData:
            root = Path(options.root)
            try:
                return IdxDataset._read(root)
            except FileNotFoundError as missing:
                if not options.download:
                    raise DataMissing(
                        f"{title}: cannot read the IDX files in {root}: {missing}. Point data.dataset.root at the folder "
                        f"with the IDX files, or set data.dataset.download=true to fetch them with torchvision") from None
            import torchvision
            getattr(torchvision.datasets, torchvision_name)(str(root), train=True, download=True)
            return IdxDataset._read(root / torchvision_name / "raw")

        @staticmethod
        def _read(root: Path) -> RawData:
            if not root.is_dir():
                raise FileNotFoundError("the folder does not exist")
            trx, try_ = load_idx_split(root, "train")
            tex, tey = load_idx_split(root, "t10k")
            return RawData(trx, try_, tex, tey, 10, f"{title} IDX files in {root}")

    IdxDataset.Options = Options
    return IdxDataset


register("mnist")(_idx_dataset("MNIST", "data/raw/mnist", "MNIST"))
register("fashion_mnist")(_idx_dataset("Fashion-MNIST", "/usr/share/datasets/fashion-mnist", "FashionMNIST"))


from mpifed.data import cifar, folders, leaf  # noqa: E402,F401  (register the paper data sets)
