"""HDF5 shards: one file per client (and one for the test set, one for server-held data).

A shard holds ``images`` (uint8, N x C x H x W), ``labels`` (int64), optionally
``groups`` (int64: a writer or domain per sample), and attributes: the client id, class
counts, source data set, partition parameters, seed and a SHA-256 content checksum
that readers verify.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np


class ShardError(RuntimeError):
    """A shard is missing, unreadable or does not match its checksum."""


@dataclass
class Shard:
    images: np.ndarray
    labels: np.ndarray
    groups: np.ndarray | None
    attrs: dict[str, Any]


def content_checksum(images: np.ndarray, labels: np.ndarray, groups: np.ndarray | None = None) -> str:
    h = hashlib.sha256()
    for a in (images, labels) + ((groups,) if groups is not None else ()):
        h.update(np.ascontiguousarray(a).view(np.uint8).data)
    return h.hexdigest()


def write_shard(path: Path, images: np.ndarray, labels: np.ndarray, attrs: dict[str, Any],
                groups: np.ndarray | None = None) -> None:
    """Write one shard atomically (temporary file, then rename); byte-identical for equal input."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with h5py.File(tmp, "w", libver="earliest", track_order=False) as f:
        f.create_dataset("images", data=np.ascontiguousarray(images, dtype=np.uint8), track_times=False)
        f.create_dataset("labels", data=np.ascontiguousarray(labels, dtype=np.int64), track_times=False)
        if groups is not None:
            f.create_dataset("groups", data=np.ascontiguousarray(groups, dtype=np.int64), track_times=False)
        for key, value in {**attrs, "num_samples": len(labels),
                           "checksum": content_checksum(images, labels, groups)}.items():
            f.attrs[key] = json.dumps(value) if isinstance(value, (dict, list)) else value
    os.replace(tmp, path)


def _fix(path: Path) -> str:
    return f"re-prepare the data: python -m mpifed.prepare --config <your config> --force (it rewrites {path.parent})"


def _attrs(f: h5py.File) -> dict[str, Any]:
    out = {}
    for key, value in f.attrs.items():
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, str) and value[:1] in "[{":
            value = json.loads(value)
        out[key] = value
    return out


def read_shard(path: Path, verify: bool = True) -> Shard:
    """Read a whole shard; with ``verify`` its checksum must match."""
    try:
        with h5py.File(path, "r") as f:
            images, labels = f["images"][...], f["labels"][...]
            groups = f["groups"][...] if "groups" in f else None
            attrs = _attrs(f)
    except FileNotFoundError:
        raise ShardError(f"shard {path} is missing; {_fix(path)}") from None
    except (OSError, KeyError) as exc:
        raise ShardError(f"shard {path} is corrupt or truncated ({exc}); {_fix(path)}") from None
    if verify and content_checksum(images, labels, groups) != attrs.get("checksum"):
        raise ShardError(f"shard {path} does not match its checksum (the file was altered or damaged); {_fix(path)}")
    return Shard(images, labels, groups, attrs)


def read_rows(path: Path, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Rows [start, stop) of a shard (images, labels, groups), without reading the rest."""
    try:
        with h5py.File(path, "r") as f:
            groups = f["groups"][start:stop] if "groups" in f else None
            return f["images"][start:stop], f["labels"][start:stop], groups
    except FileNotFoundError:
        raise ShardError(f"shard {path} is missing; {_fix(path)}") from None
    except (OSError, KeyError) as exc:
        raise ShardError(f"shard {path} is corrupt or truncated ({exc}); {_fix(path)}") from None
