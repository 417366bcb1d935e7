"""Image-folder data sets: CINIC-10, Tiny-ImageNet and the four domains of Office-Caltech-10."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpifed.data.raw import DataMissing, Dataset, RawData, stratified_split
from mpifed.data.sets.cifar import CIFAR10_CLASSES
from mpifed.plugin.options import opt
from mpifed.plugin.registry import DATASETS

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp"}


def load_image(path: Path, size: int | None) -> np.ndarray:
    """An RGB image as a 3 x H x W uint8 array (resized to size x size when given)."""
    from PIL import Image
    with Image.open(path) as im:
        im = im.convert("RGB")
        if size is not None and im.size != (size, size):
            im = im.resize((size, size), Image.BILINEAR)
        return np.asarray(im, dtype=np.uint8).transpose(2, 0, 1)


def read_class_folders(root: Path, classes: list[str], size: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``root/<class>/<image>`` for each class (sorted file order), as images and labels."""
    xs, ys = [], []
    for label, name in enumerate(classes):
        folder = root / name
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if folder.is_dir() else []
        xs += [load_image(p, size) for p in files]
        ys += [label] * len(files)
    if not xs:
        raise DataMissing(f"no images under {root}/<class>/")
    return np.stack(xs), np.asarray(ys, dtype=np.int64)


def class_names(root: Path) -> list[str]:
    if not root.is_dir():
        raise DataMissing(f"folder {root} not found")
    return sorted(p.name for p in root.iterdir() if p.is_dir())


@DATASETS.register("cinic10")
class Cinic10(Dataset):
    """CINIC-10 (Darlow et al.): 32x32 images in ``train/``, ``valid/``, ``test/`` with a folder per
    class (90,000 each). FedNTD trains on ``train`` (90,000) and tests on ``test``."""

    @dataclass
    class Options:
        root: str = opt("data/raw/cinic-10", "folder with train/, valid/ and test/")
        include_valid: bool = opt(False, "add valid/ to the training set")

    title = "CINIC-10"
    crop_padding = 4
    flip = True
    class_names = CIFAR10_CLASSES     # its class folders, sorted, are CIFAR-10's classes in label order
    how_to_get = "Set data.dataset.root to the folder that holds CINIC-10's train/, valid/ and test/"

    @classmethod
    def needed(cls, options) -> list[str]:
        return ["train/", "test/"] + (["valid/"] if options.include_valid else [])

    @classmethod
    def load(cls, options) -> RawData:
        root = cls.root(options)
        classes = class_names(root / "train")
        trx, try_ = read_class_folders(root / "train", classes, 32)
        if options.include_valid:
            vx, vy = read_class_folders(root / "valid", classes, 32)
            trx, try_ = np.concatenate([trx, vx]), np.concatenate([try_, vy])
        tex, tey = read_class_folders(root / "test", classes, 32)
        splits = ["train", "test"] + (["valid"] if options.include_valid else [])
        return RawData(trx, try_, tex, tey, len(classes), f"CINIC-10 folders in {root}",
                       files=[root / s / c for s in splits for c in classes])


@DATASETS.register("tiny_imagenet")
class TinyImageNet(Dataset):
    """Tiny-ImageNet-200: 64x64 images; ``train/<wnid>/images/*.JPEG`` (500 per class) and
    ``val/images`` labelled by ``val/val_annotations.txt`` (50 per class), used as the test set
    (the official test labels are not public)."""

    @dataclass
    class Options:
        root: str = opt("data/raw/tiny-imagenet-200", "folder with wnids.txt, train/ and val/")

    title = "Tiny-ImageNet"
    crop_padding = 4
    flip = True
    needs = ("wnids.txt",)
    how_to_get = "Set data.dataset.root to the folder tiny-imagenet-200.zip unpacks to"

    @classmethod
    def load(cls, options) -> RawData:
        root = cls.root(options)
        wnids = (root / "wnids.txt").read_text().split()
        xs, ys = [], []
        for label, wnid in enumerate(wnids):
            folder = root / "train" / wnid / "images"
            for p in sorted(folder.iterdir()):
                xs.append(load_image(p, 64))
                ys.append(label)
        index = {w: i for i, w in enumerate(wnids)}
        vx, vy = [], []
        for line in (root / "val" / "val_annotations.txt").read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 2:
                vx.append(load_image(root / "val" / "images" / parts[0], 64))
                vy.append(index[parts[1]])
        return RawData(np.stack(xs), np.asarray(ys, dtype=np.int64), np.stack(vx), np.asarray(vy, dtype=np.int64),
                       len(wnids), f"Tiny-ImageNet folders in {root}",
                       files=[root / "wnids.txt", root / "val" / "val_annotations.txt", root / "val" / "images",
                              *(root / "train" / w / "images" for w in wnids)])


@DATASETS.register("office_caltech")
class OfficeCaltech(Dataset):
    """Office-Caltech-10: four domains (amazon, caltech, dslr, webcam), each ``<domain>/<class>/<image>``
    with the same 10 classes. Every domain keeps its own stratified test split (FedCSD Table II
    reports accuracy per domain and their mean); samples carry their domain for the ``domain``
    partition (one client per domain) and for per-domain test accuracy.

    ``train_cut`` reproduces FedBN's setup (``federated/fed_office.py``), which FedCSD follows:
    every domain trains on the same number of images, ``train_cut`` times the smallest domain's
    training split (FedBN: 0.5, i.e. 62 images per domain with DSLR's 125). FedBN takes the first
    images of its pickled split; here a seeded random subset of each domain's split (the folders
    are read class by class, so the first images would be few classes)."""

    DOMAINS = ("amazon", "caltech", "dslr", "webcam")

    @dataclass
    class Options:
        root: str = opt("data/raw/office_caltech_10", "folder with amazon/, caltech/, dslr/, webcam/")
        size: int = opt(256, "images are resized to size x size (FedBN: 256)", min=32)
        test_fraction: float = opt(0.2, "fraction of each domain (per class) held "
                                        "out as its test split", min=0, max=1, exclusive_min=True)
        split_seed: int = opt(0, "seed of the per-domain train/test split", min=0)
        train_cut: float = opt(0.0, "train every domain on train_cut x the smallest domain's training split (FedBN: "
                                    "0.5; 0: all)", min=0, max=1)

    title = "Office-Caltech-10"
    flip = True
    needs = tuple(f"{d}/" for d in DOMAINS)
    how_to_get = "Set data.dataset.root to the folder that holds the four domain folders"

    @classmethod
    def load(cls, options) -> RawData:
        root = cls.root(options)
        classes = class_names(root / OfficeCaltech.DOMAINS[0])
        parts = {"trx": [], "try": [], "trg": [], "tex": [], "tey": [], "teg": []}
        domains = [read_class_folders(root / d, classes, options.size) for d in OfficeCaltech.DOMAINS]
        splits = [stratified_split(y, options.test_fraction,
                                   options.split_seed + g) for g, (_, y) in enumerate(domains)]
        cut = int(options.train_cut * min(len(tr) for tr, _ in splits)) if options.train_cut else 0
        for g, ((x, y), (tr, te)) in enumerate(zip(domains, splits)):
            if cut:
                tr = np.sort(np.random.default_rng([options.split_seed, g, 0xFEDB]).permutation(tr)[:cut])
            for key, idx, arr in (("trx", tr, x), ("try", tr, y), ("tex", te, x), ("tey", te, y)):
                parts[key].append(arr[idx])
            parts["trg"].append(np.full(len(tr), g, dtype=np.int64))
            parts["teg"].append(np.full(len(te), g, dtype=np.int64))
        cat = {k: np.concatenate(v) for k, v in parts.items()}
        return RawData(cat["trx"], cat["try"], cat["tex"], cat["tey"], len(classes),
                       f"Office-Caltech-10 folders in {root}",
                       train_groups=cat["trg"], test_groups=cat["teg"], group_names=list(OfficeCaltech.DOMAINS),
                       files=[root / d / c for d in OfficeCaltech.DOMAINS for c in classes if (root / d / c).is_dir()])
