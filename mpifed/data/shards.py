"""HDF5 shards: the clients packed many to a file (blocks), and one file for the test set, one for
the validation set, one for server-held data.

A shard holds the model inputs as named arrays of N rows (``images``: uint8 N x C x H x W;
text: ``input_ids`` uint16/int32 and ``attention_mask`` uint8, N x length; the attribute
``inputs`` lists the names in order), ``labels`` (int64), optionally ``groups`` (int64: a
writer or domain per sample), and attributes: the client id, class counts, source data
set, partition parameters, seed and a SHA-256 content checksum that readers verify.

A block holds consecutive clients the same way, their rows one after another: ``offsets``
(int64, n + 1) says where each client's rows start, ``checksums`` holds each client's SHA-256
(the checksum its own shard would have), and the attribute ``first_client`` the first
client's id. A reader reads only its client's rows and verifies that client's checksum.
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


INPUT_DTYPES = (np.uint8, np.uint16, np.int32, np.int64)
RESERVED = ("labels", "groups")

Inputs = dict[str, np.ndarray]


@dataclass
class Shard:
    inputs: Inputs
    labels: np.ndarray
    groups: np.ndarray | None
    attrs: dict[str, Any]

    @property
    def images(self) -> np.ndarray:
        return self.inputs["images"]


def named(inputs: np.ndarray | Inputs) -> Inputs:
    """Model inputs as named arrays: a bare array is a batch of ``images``."""
    return inputs if isinstance(inputs, dict) else {"images": inputs}


def content_checksum(inputs: np.ndarray | Inputs, labels: np.ndarray, groups: np.ndarray | None = None) -> str:
    """SHA-256 over the input arrays (in their order), the labels and the groups."""
    h = hashlib.sha256()
    for a in (*named(inputs).values(), labels) + ((groups,) if groups is not None else ()):
        h.update(np.ascontiguousarray(a).view(np.uint8).data)
    return h.hexdigest()


def write_shard(path: Path, inputs: np.ndarray | Inputs, labels: np.ndarray, attrs: dict[str, Any],
                groups: np.ndarray | None = None) -> None:
    """Write one shard atomically (temporary file, then rename); byte-identical for equal input.

    ``inputs`` is a dict of named arrays of ``len(labels)`` rows (a bare array: ``images``)."""
    inputs = named(inputs)
    _write(path, inputs, labels, groups, {}, attrs,
           {"num_samples": len(labels), "checksum": content_checksum(inputs, labels, groups)})


def _write(path: Path, inputs: Inputs, labels: np.ndarray, groups: np.ndarray | None,
           arrays: dict[str, np.ndarray], attrs: dict[str, Any], own: dict[str, Any]) -> None:
    """The rows (``inputs``, ``labels``, ``groups``) and ``arrays``; then ``attrs``, the input names and
    the writer's ``own`` attributes; in a temporary file renamed to ``path``."""
    for name, a in inputs.items():
        if name in RESERVED or a.dtype not in INPUT_DTYPES or len(a) != len(labels):
            raise ValueError(f"shard input {name!r}: {a.dtype} x {len(a)} rows; inputs need a name other than "
                             f"{RESERVED}, a dtype in {[np.dtype(d).name for d in INPUT_DTYPES]} and one row per label")
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with h5py.File(tmp, "w", libver="earliest", track_order=False) as f:
        for name, a in inputs.items():
            f.create_dataset(name, data=np.ascontiguousarray(a), track_times=False)
        f.create_dataset("labels", data=np.ascontiguousarray(labels, dtype=np.int64), track_times=False)
        if groups is not None:
            f.create_dataset("groups", data=np.ascontiguousarray(groups, dtype=np.int64), track_times=False)
        for name, a in arrays.items():
            f.create_dataset(name, data=a, track_times=False)
        names = {} if list(inputs) == ["images"] else {"inputs": list(inputs)}
        for key, value in {**attrs, **names, **own}.items():
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
            attrs = _attrs(f)
            inputs = {name: f[name][...] for name in attrs.get("inputs", ["images"])}
            labels = f["labels"][...]
            groups = f["groups"][...] if "groups" in f else None
    except FileNotFoundError:
        raise ShardError(f"shard {path} is missing; {_fix(path)}") from None
    except (OSError, KeyError) as exc:
        raise ShardError(f"shard {path} is corrupt or truncated ({exc}); {_fix(path)}") from None
    if verify and content_checksum(inputs, labels, groups) != attrs.get("checksum"):
        raise ShardError(f"shard {path} does not match its checksum (the file was altered or damaged); {_fix(path)}")
    return Shard(inputs, labels, groups, attrs)


def write_block(path: Path, inputs: Inputs, labels: np.ndarray, groups: np.ndarray | None, offsets: np.ndarray,
                first_client: int, attrs: dict[str, Any]) -> None:
    """Write one block atomically: clients ``first_client``, ... whose rows of ``inputs``, ``labels``
    and ``groups`` are ``offsets[i]:offsets[i + 1]``; byte-identical for equal input."""
    offsets = np.asarray(offsets, dtype=np.int64)
    if offsets[0] != 0 or offsets[-1] != len(labels) or (np.diff(offsets) <= 0).any():
        raise ValueError(f"block offsets must rise from 0 to {len(labels)}, one step per client")
    sums = [content_checksum({k: v[a:b] for k, v in inputs.items()}, labels[a:b],
                             None if groups is None else groups[a:b]).encode()
            for a, b in zip(offsets[:-1], offsets[1:])]
    _write(path, inputs, labels, groups, {"offsets": offsets, "checksums": np.array(sums, dtype="S64")}, attrs,
           {"first_client": first_client, "num_clients": len(sums)})


def block_offsets(path: Path) -> tuple[int, np.ndarray]:
    """A block's first client and its ``offsets``, read without its rows."""
    try:
        with h5py.File(path, "r") as f:
            return int(f.attrs["first_client"]), f["offsets"][...]
    except FileNotFoundError:
        raise ShardError(f"block {path} is missing; {_fix(path)}") from None
    except (OSError, KeyError) as exc:
        raise ShardError(f"block {path} is corrupt or truncated ({exc}); {_fix(path)}") from None


def read_client(path: Path, cid: int, verify: bool = True) -> Shard:
    """Client ``cid``'s rows of the block in ``path``; with ``verify`` they must match its checksum."""
    try:
        with h5py.File(path, "r") as f:
            attrs = _attrs(f)
            i = cid - attrs["first_client"]
            if not 0 <= i < attrs["num_clients"]:
                raise ShardError(f"block {path} holds clients {attrs['first_client']} to "
                                 f"{attrs['first_client'] + attrs['num_clients'] - 1}, not {cid}; {_fix(path)}")
            a, b = (int(v) for v in f["offsets"][i:i + 2])
            inputs = {name: f[name][a:b] for name in attrs.get("inputs", ["images"])}
            labels = f["labels"][a:b]
            groups = f["groups"][a:b] if "groups" in f else None
            checksum = f["checksums"][i].decode()
    except FileNotFoundError:
        raise ShardError(f"block {path} (client {cid}) is missing; {_fix(path)}") from None
    except (OSError, KeyError, ValueError) as exc:
        raise ShardError(f"block {path} (client {cid}) is corrupt or truncated ({exc}); {_fix(path)}") from None
    if verify and content_checksum(inputs, labels, groups) != checksum:
        raise ShardError(f"client {cid} in {path} does not match its checksum (the file was altered or damaged); "
                         f"{_fix(path)}")
    keep = {k: v for k, v in attrs.items() if k not in ("first_client", "num_clients")}
    return Shard(inputs, labels, groups, {**keep, "client_id": cid, "num_samples": b - a, "checksum": checksum})


def read_rows(path: Path, start: int, stop: int) -> tuple[Inputs, np.ndarray, np.ndarray | None]:
    """Rows [start, stop) of a shard (inputs, labels, groups), without reading the rest."""
    try:
        with h5py.File(path, "r") as f:
            names = json.loads(f.attrs["inputs"]) if "inputs" in f.attrs else ["images"]
            groups = f["groups"][start:stop] if "groups" in f else None
            return {name: f[name][start:stop] for name in names}, f["labels"][start:stop], groups
    except FileNotFoundError:
        raise ShardError(f"shard {path} is missing; {_fix(path)}") from None
    except (OSError, KeyError) as exc:
        raise ShardError(f"shard {path} is corrupt or truncated ({exc}); {_fix(path)}") from None
