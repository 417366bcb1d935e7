"""Fetch the data sets that have a stable public archive into the folder their loader reads
(``data.dataset.root``), checked against the published checksums: ``python -m mpifed.prepare
--download`` (also ``mpifed-prepare --download``).

Each file is downloaded to a temporary name beside its destination, its checksum verified,
and only then renamed (a plain file) or unpacked into a temporary folder whose entries are
then renamed into place, so an interrupted or corrupt download never leaves a half data
set where the loader looks. ``--mirror URL`` or the environment variable
``MPIFED_DATA_MIRROR`` fetches every file from ``URL/<file name>`` instead of its published
address (a local copy, a site mirror; the tests serve files from a loopback server).

LEAF FEMNIST and Office-Caltech-10 have no stable archive: docs/data-download.md gives the
steps to place them by hand.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MIRROR_ENV = "MPIFED_DATA_MIRROR"
MANUAL = "docs/data-download.md"


class DownloadError(RuntimeError):
    """A file could not be fetched, failed its checksum, or could not be put in place."""


@dataclass(frozen=True)
class RemoteFile:
    """A published file and its published checksum (``md5:<hex>`` or ``sha256:<hex>``)."""

    url: str
    checksum: str
    unpack: bool

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Source:
    """Where a data set comes from and the entries (relative to its root) that show it is in place."""

    files: tuple[RemoteFile, ...]
    present: tuple[str, ...]


def _idx_files(base: str, md5s: dict[str, str]) -> tuple[RemoteFile, ...]:
    return tuple(RemoteFile(f"{base}/{name}", f"md5:{md5}", unpack=False) for name, md5 in md5s.items())


_MNIST = {"train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
          "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
          "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
          "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"}
_FASHION = {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"}

# Checksums: MNIST, Fashion-MNIST and CIFAR as published by their authors (and used by
# torchvision); CINIC-10 and Tiny-ImageNet as recorded for the authors' archives by the
# loaders that fetch them (the pages publish none).
SOURCES: dict[str, Source] = {
    "mnist": Source(_idx_files("https://ossci-datasets.s3.amazonaws.com/mnist", _MNIST),
                    tuple(n.removesuffix(".gz") for n in _MNIST)),
    "fashion_mnist": Source(_idx_files("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com", _FASHION),
                            tuple(n.removesuffix(".gz") for n in _FASHION)),
    "cifar10": Source((RemoteFile("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                                  "md5:c58f30108f718f92721af3b95e74349a", unpack=True),), ("cifar-10-batches-py",)),
    "cifar100": Source((RemoteFile("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                                   "md5:eb9058c3a382ffc7106e4002c42a8d85", unpack=True),), ("cifar-100-python",)),
    "cinic10": Source((RemoteFile("https://datashare.ed.ac.uk/bitstream/handle/10283/3192/CINIC-10.tar.gz",
                                  "md5:6ee4d0c996905fe93221de577967a372", unpack=True),), ("train", "valid", "test")),
    "tiny_imagenet": Source((RemoteFile("http://cs231n.stanford.edu/tiny-imagenet-200.zip",
                                        "md5:90528d7ca1a48142e341f4ef8d21d0de", unpack=True),),
                            ("wnids.txt", "train", "val")),
}


def _exists(root: Path, entry: str) -> bool:
    """``entry`` under ``root``, also gzipped or under ``raw/`` (where the IDX loader also looks)."""
    return any((folder / name).exists() for folder in (root, root / "raw") for name in (entry, f"{entry}.gz"))


def is_present(name: str, root: Path) -> bool:
    return all(_exists(root, entry) for entry in SOURCES[name].present)


def fetch(name: str, root: str | Path, mirror: str | None = None, log: Callable[[str], None] = print) -> bool:
    """Put data set ``name`` into ``root`` unless it is already there; True when something was fetched."""
    if name not in SOURCES:
        known = ", ".join(sorted(SOURCES))
        raise DownloadError(f"{name} has no public archive to download (downloadable: {known}); "
                            f"{MANUAL} says how to place it by hand")
    root = Path(root)
    if is_present(name, root):
        log(f"[mpifed.download] {name}: already in {root}")
        return False
    mirror = mirror or os.environ.get(MIRROR_ENV) or None
    root.mkdir(parents=True, exist_ok=True)
    for remote in SOURCES[name].files:
        if not remote.unpack and _exists(root, remote.name.removesuffix(".gz")):
            continue
        url = f"{mirror.rstrip('/')}/{remote.name}" if mirror else remote.url
        part = root / f".{remote.name}.part-{os.getpid()}"
        try:
            _download(url, part, remote.checksum, log)
            if remote.unpack:
                _unpack(part, remote.name, root, SOURCES[name].present)
            else:
                os.replace(part, root / remote.name)
        finally:
            part.unlink(missing_ok=True)
    log(f"[mpifed.download] {name}: in place in {root}")
    return True


def _download(url: str, dest: Path, checksum: str, log: Callable[[str], None]) -> None:
    algorithm, _, expected = checksum.partition(":")
    digest = hashlib.new(algorithm)
    log(f"[mpifed.download] fetching {url}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as exc:
        raise DownloadError(f"could not fetch {url}: {exc}. Check the network, or fetch the file elsewhere and "
                            f"serve it with --mirror / {MIRROR_ENV}") from None
    if digest.hexdigest() != expected:
        raise DownloadError(f"{url}: {algorithm} {digest.hexdigest()} does not match the published {expected}; "
                            "the file is damaged or not the published one, and was deleted. Try again, or use "
                            "another mirror")
    log(f"[mpifed.download] {algorithm} verified ({expected})")


def _unpack(archive: Path, name: str, root: Path, present: tuple[str, ...]) -> None:
    """Unpack into a temporary folder, then rename its entries into ``root``; a single top
    folder that holds the data set's entries (tiny-imagenet-200/) is unwrapped."""
    tmp = root / f".{name}.unpack-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:
            with tarfile.open(archive) as t:
                if hasattr(tarfile, "data_filter"):
                    t.extractall(tmp, filter="data")
                else:
                    t.extractall(tmp)
        top = tmp
        entries = list(tmp.iterdir())
        if not all((tmp / e).exists() for e in present) and len(entries) == 1 and entries[0].is_dir():
            top = entries[0]
        missing = [e for e in present if not (top / e).exists()]
        if missing:
            raise DownloadError(f"{name} does not hold {', '.join(missing)}: not the expected archive")
        for entry in top.iterdir():
            target = root / entry.name
            if target.exists():
                raise DownloadError(f"{target} is in the way of the download (from an earlier, partial copy?); "
                                    "move or delete it and run again")
            os.replace(entry, target)
    except (tarfile.TarError, zipfile.BadZipFile) as exc:
        raise DownloadError(f"{name} cannot be unpacked: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

