"""Data sets that need no download: scikit-learn's digits and synthetic patterns."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpifed.data.image_rows import ImageRows
from mpifed.data.raw import Dataset, RawData, stratified_split
from mpifed.plugin.options import opt
from mpifed.plugin.registry import DATASETS

CHUNK_VALUES = 2**22      # the synthetic images are drawn this many values at a time (32 MiB of float noise)
STREAM_BYTES = 2**28      # training images beyond this many bytes go to a file (ImageRows), not memory


@DATASETS.register("digits")
class Digits(Dataset):
    """scikit-learn's 8x8 handwritten digits (1,797 images, shipped with scikit-learn; no download).

    Pixel values 0..16 are scaled to 0..255. There is no official test split: a
    stratified ``test_fraction`` is held out with ``split_seed``.
    """

    @dataclass
    class Options:
        test_fraction: float = opt(0.2, "fraction of each class held out as the "
                                        "test set", min=0, max=1, exclusive_min=True)
        split_seed: int = opt(0, "seed of the train/test split", min=0)

    @staticmethod
    def load(options: "Digits.Options") -> RawData:
        from sklearn.datasets import load_digits
        bunch = load_digits()
        x = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
        y = bunch.target.astype(np.int64)
        tr, te = stratified_split(y, options.test_fraction, options.split_seed)
        return RawData(x[tr], y[tr], x[te], y[te], 10, "scikit-learn load_digits")


@DATASETS.register("synthetic")
class Synthetic(Dataset):
    """Class-dependent random patterns plus noise: tiny, learnable, for tests and benchmarks. Training
    images of more than 256 MiB (a population of millions of clients) are written to a temporary
    file as they are drawn, the same images either way."""

    @dataclass
    class Options:
        train_samples: int = opt(600, "training images", min=1)
        test_samples: int = opt(200, "test images", min=1)
        num_classes: int = opt(10, "classes", min=2)
        channels: int = opt(1, "image channels", min=1)
        size: int = opt(8, "image height and width", min=4)
        noise: float = opt(40.0, "standard deviation of the pixel noise (0..255 scale)", min=0)
        data_seed: int = opt(0, "seed of the class patterns and samples", min=0)

    @staticmethod
    def load(options: "Synthetic.Options") -> RawData:
        rng = np.random.default_rng(options.data_seed)
        shape = (options.channels, options.size, options.size)
        templates = rng.uniform(0, 255, size=(options.num_classes, *shape))

        def draw(n: int, stream: bool) -> tuple[np.ndarray | ImageRows, np.ndarray]:
            y = rng.integers(0, options.num_classes, size=n).astype(np.int64)
            x = ImageRows(shape) if stream else np.empty((n, *shape), dtype=np.uint8)
            step = max(1, CHUNK_VALUES // templates[0].size)
            for i in range(0, n, step):                     # chunks draw the same numbers as one draw would
                chunk = templates[y[i:i + step]] + rng.normal(0, options.noise, size=(len(y[i:i + step]), *shape))
                images = np.clip(np.rint(chunk), 0, 255).astype(np.uint8)
                if stream:
                    x.append(images)
                else:
                    x[i:i + step] = images
            return x, y

        trx, try_ = draw(options.train_samples, stream=options.train_samples * templates[0].size > STREAM_BYTES)
        tex, tey = draw(options.test_samples, stream=False)
        return RawData(trx, try_, tex, tey, options.num_classes, f"synthetic (seed {options.data_seed})")
