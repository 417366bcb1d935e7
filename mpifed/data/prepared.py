"""Prepared data on disk: a prepared folder's layout, its manifest, and the checks that it is whole.

Layout of a prepared folder::

    manifest.json          spec, statistics, normalisation, the blocks' first clients
    clients/index.h5       each client's number of samples and class counts (K and K x C arrays)
    clients/block_00000.h5 ...  the clients, packed: up to 4,096 clients or 256 MiB of inputs a file
    test.h5
    val.h5                 the validation set (only with data.val_size)
    server.h5              data held by the server (only with data.server_holdout_per_class)
    traces/                the simulated federation's trace files, copied (only with system.device_trace or
                           system.availability_trace; their content hashed into the spec)

Clients are packed many to a file, not one file each: a population of a million clients is a
few hundred files, not a million, without HDF5's overhead per file (8 KB, more than a small
client's data), and start-up reads two arrays instead of K file headers. A worker reads only its
clients' rows, and verifies each client's own checksum when it reads it. Folders are made from a
config by :mod:`mpifed.preparation.build`.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpifed.data.fingerprint import first_change
from mpifed.data.shards import ShardError, block_offsets, named, read_shard


FORMAT = 2
CLIENTS_PER_BLOCK = 4096
BLOCK_BYTES = 256 * 2**20      # a block closes at this many bytes of inputs (a larger client gets one of its own)
INDEX = Path("clients") / "index.h5"
TRACES = "traces"    # the folder of the simulated federation's trace files


class PreparedDataError(RuntimeError):
    """Prepared data is missing, stale or does not match the config."""


def read_index(root: Path, name: str) -> np.ndarray:
    """``num_samples`` (K: each client's number of samples) or ``class_counts`` (K x C) of the folder ``root``."""
    with h5py.File(root / INDEX, "r") as f:
        return f[name][...].astype(np.int64)


def write_index(root: Path, sizes: np.ndarray, counts: np.ndarray) -> None:
    """Write the folder ``root``'s index: each client's number of samples (``sizes``) and class counts."""
    with h5py.File(root / INDEX, "w", libver="earliest", track_order=False) as f:
        f.create_dataset("num_samples", data=np.ascontiguousarray(sizes, dtype=np.int64), track_times=False)
        f.create_dataset("class_counts", data=np.ascontiguousarray(counts, dtype=np.int64), track_times=False)


def block_starts(sizes: np.ndarray, row_bytes: int) -> list[int]:
    """The first client of each block for clients of ``sizes`` samples: a block closes at
    :data:`CLIENTS_PER_BLOCK` clients or :data:`BLOCK_BYTES` of inputs (a client larger than that
    alone in its block)."""
    starts, count, held = [0], 0, 0
    for k, n in enumerate(sizes.tolist()):
        if count and (count == CLIENTS_PER_BLOCK or held + n * row_bytes > BLOCK_BYTES):
            starts.append(k)
            count, held = 0, 0
        count += 1
        held += n * row_bytes
    return starts


def row_bytes(x: Any) -> int:
    """The bytes of one row of model inputs."""
    return sum(a.itemsize * int(np.prod(a.shape[1:])) for a in named(x).values())


@dataclass
class Manifest:
    """What a run needs to know about its prepared data, without opening a shard."""

    root: Path
    spec: dict[str, Any]
    num_classes: int
    input_shape: tuple[int, ...]    # one sample: C, H, W (images) or the sequence length (text)
    mean: list[float]
    std: list[float]
    crop_padding: int
    flip: bool
    client_sizes: np.ndarray        # K
    blocks: np.ndarray              # the first client of each block, ascending from 0
    test_size: int
    test_class_counts: np.ndarray
    group_names: list[str]
    test_group_counts: np.ndarray
    server_size: int
    stats: dict[str, Any]
    raw_inputs: dict[str, Any] | None = None  # the fingerprint of the raw files (see fingerprint.py)
    modality: str = "image"
    vocab_size: int = 0             # text: the tokenizer's vocabulary size
    val_size: int = 0               # the validation set (data.val_size)
    val_class_counts: np.ndarray | None = None
    test_source_size: int | None = None  # the data set's test samples before data.test_subset (None: not recorded)

    @property
    def image_shape(self) -> tuple[int, ...]:
        return self.input_shape

    @property
    def num_clients(self) -> int:
        return len(self.client_sizes)

    @functools.cached_property
    def client_class_counts(self) -> np.ndarray:
        """K x C, read from the index when first asked for (a run needs only the sizes)."""
        try:
            counts = read_index(self.root, "class_counts")
        except (OSError, KeyError) as exc:
            raise PreparedDataError(f"{self.root / INDEX} is missing or corrupt ({exc}); re-prepare with python -m "
                                    "mpifed.prepare --config <config> --force") from None
        if counts.shape != (self.num_clients, self.num_classes):
            raise PreparedDataError(f"{self.root / INDEX} holds class counts of shape {counts.shape}, not "
                                    f"{self.num_clients} clients x {self.num_classes} classes; re-prepare with "
                                    "python -m mpifed.prepare --config <config> --force")
        return counts

    def block_path(self, block: int) -> Path:
        return self.root / "clients" / f"block_{block:05d}.h5"

    def client_block(self, cid: int) -> Path:
        """The block that holds client ``cid``."""
        return self.block_path(int(np.searchsorted(self.blocks, cid, side="right")) - 1)

    def block_clients(self, block: int) -> range:
        """The clients of block ``block``."""
        end = int(self.blocks[block + 1]) if block + 1 < len(self.blocks) else self.num_clients
        return range(int(self.blocks[block]), end)

    @property
    def test_path(self) -> Path:
        return self.root / "test.h5"

    @property
    def val_path(self) -> Path:
        return self.root / "val.h5"

    @property
    def server_path(self) -> Path:
        return self.root / "server.h5"

    def trace(self, kind: str) -> Path | None:
        """The copy of the ``kind`` (device, availability) trace prepared with the data, if any."""
        entry = self.spec.get("traces", {}).get(kind)
        return self.root / TRACES / entry["file"] if entry else None

    @staticmethod
    def load(root: Path) -> "Manifest":
        path = root / "manifest.json"
        try:
            m = json.loads(path.read_text())
        except FileNotFoundError:
            raise PreparedDataError(f"{root} holds no manifest.json; prepare it with python -m mpifed.prepare --config "
                                    "<config>") from None
        except json.JSONDecodeError as exc:
            raise PreparedDataError(f"{path} is corrupt ({exc}); re-prepare with python -m mpifed.prepare --config "
                                    "<config> --force") from None
        except OSError as exc:
            raise PreparedDataError(f"cannot read {path} ({exc.strerror}); re-prepare with python -m mpifed.prepare "
                                    f"--config <config> --force") from None
        if not isinstance(m, dict):
            raise PreparedDataError(f"{path} is malformed (not a JSON object); re-prepare with python -m "
                                    f"mpifed.prepare --config <config> --force")
        if m.get("format") == 1:
            raise PreparedDataError(f"{root} holds one file per client (format 1, an earlier mpifed); convert it "
                                    "with python -m mpifed.prepare --config <config>, which packs its shards in place "
                                    "(no raw data needed, its runs stay valid)")
        if m.get("format") != FORMAT:
            raise PreparedDataError(f"{root} was prepared by another mpifed version (format {m.get('format')}); "
                                    "re-prepare with --force")
        try:
            manifest = Manifest._from_json(root, m)
            manifest._check()
            manifest._check_classes()
            return manifest
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PreparedDataError(f"{path} is incomplete or malformed ({type(exc).__name__}: {exc}); "
                                    "re-prepare with python -m mpifed.prepare --config <config> --force") from None
        except OSError as exc:   # the index
            raise PreparedDataError(f"{root / INDEX} is missing or corrupt ({exc}); re-prepare with python -m "
                                    "mpifed.prepare --config <config> --force") from None

    @staticmethod
    def _from_json(root: Path, m: dict[str, Any]) -> "Manifest":
        sizes = read_index(root, "num_samples")
        if len(sizes) != m["clients"]["count"]:
            raise ValueError(f"{INDEX} holds {len(sizes)} clients, the manifest {m['clients']['count']}")
        return Manifest(
            root=root, spec=m["spec"], num_classes=m["num_classes"],
            input_shape=tuple(m["input_shape"] if "input_shape" in m else m["image_shape"]),
            mean=m["mean"], std=m["std"], crop_padding=m["crop_padding"], flip=m["flip"],
            client_sizes=sizes,
            blocks=np.array(m["clients"]["blocks"], dtype=np.int64),
            test_size=m["test"]["num_samples"], test_class_counts=np.array(m["test"]["class_counts"], dtype=np.int64),
            group_names=m["test"]["group_names"], test_group_counts=np.array(m["test"]["group_counts"], dtype=np.int64),
            server_size=m["server"]["num_samples"] if m["server"] else 0,
            stats=m["stats"], raw_inputs=m.get("raw_inputs"), modality=m.get("modality", "image"),
            vocab_size=m.get("vocab_size", 0), val_size=m["val"]["num_samples"] if m.get("val") else 0,
            val_class_counts=np.array(m["val"]["class_counts"], dtype=np.int64) if m.get("val") else None,
            test_source_size=m["test"].get("source_samples"))

    def _check(self) -> None:
        """Raise ValueError naming the first field of the wrong type or shape."""
        def numbers(name: str, values: Any, count: int) -> None:
            if (not isinstance(values, list) or len(values) != count
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)):
                raise ValueError(f"'{name}' must be a list of {count} numbers, got {values!r}")
        if not (isinstance(self.num_classes, int) and self.num_classes > 0):
            raise ValueError(f"'num_classes' must be a positive integer, got {self.num_classes!r}")
        dims = 3 if self.modality == "image" else 1
        if len(self.input_shape) != dims or not all(isinstance(v, int) and v > 0 for v in self.input_shape):
            raise ValueError(f"'input_shape' must be {dims} positive integer(s), got {list(self.input_shape)!r}")
        if self.modality == "image":
            numbers("mean", self.mean, self.input_shape[0])
            numbers("std", self.std, self.input_shape[0])
        if not isinstance(self.crop_padding, int) or not isinstance(self.flip, bool):
            raise ValueError("'crop_padding' must be an integer and 'flip' true or false")
        if not (isinstance(self.test_size, int) and self.test_size > 0 and isinstance(self.server_size, int)):
            raise ValueError(f"'test.num_samples' must be a positive integer, got {self.test_size!r}")
        if not (isinstance(self.val_size, int) and self.val_size >= 0):
            raise ValueError(f"'val.num_samples' must be a non-negative integer, got {self.val_size!r}")
        if len(self.client_sizes) == 0 or (self.client_sizes <= 0).any():
            raise ValueError("'clients' must list at least one client, each with a positive 'num_samples'")
        if len(self.blocks) == 0 or self.blocks[0] != 0 or (np.diff(self.blocks) <= 0).any() \
                or self.blocks[-1] >= self.num_clients:
            raise ValueError("'clients.blocks' must rise from 0, each block's first client below the client count")
        if not isinstance(self.spec, dict) or not isinstance(self.stats, dict):
            raise ValueError("'spec' and 'stats' must be JSON objects")

    def _check_classes(self) -> None:
        """``num_classes`` is the number of classes the folder's own counts have: the test set's, the
        validation set's and the clients' (the index's width, read without its data). The model's
        output and every per-class figure are sized by it, so an edited one fails deep in training."""
        with h5py.File(self.root / INDEX, "r") as f:
            index_shape = f["class_counts"].shape
        counted = [("the test set's class counts", len(self.test_class_counts)),
                   ("the clients' class counts in " + str(INDEX), index_shape[-1] if len(index_shape) == 2 else -1)]
        if self.val_class_counts is not None:
            counted.append(("the validation set's class counts", len(self.val_class_counts)))
        for what, classes in counted:
            if classes != self.num_classes:
                raise PreparedDataError(
                    f"{self.root / 'manifest.json'} says the data has {self.num_classes} classes, and {what} "
                    f"{'have ' + str(classes) if classes >= 0 else 'are not a clients x classes table'}: the folder "
                    f"was edited or mixes two preparations. Delete {self.root} so that the next run prepares it "
                    f"again (or: python -m mpifed.prepare --config <config> --force)")


def check_raw_inputs(manifest: Manifest) -> None:
    """Stop when the raw files the folder was prepared from have changed since."""
    change = first_change(manifest.raw_inputs) if manifest.raw_inputs else None
    if change:
        raise PreparedDataError(
            f"the raw data changed since {manifest.root} was prepared: {change}. Its shards would not match the "
            f"raw data; re-prepare with: python -m mpifed.prepare --config <config> --force")


def verify_blocks(manifest: Manifest, index: int, count: int) -> None:
    """Worker ``index`` of ``count``: every ``count``-th block from ``index`` opens and holds the
    clients the manifest says, with their numbers of samples, so that together the workers check
    every block before any training; a client's rows are checked against its checksum when read."""
    for b in range(index, len(manifest.blocks), count):
        path, clients = manifest.block_path(b), manifest.block_clients(b)
        first, offsets = block_offsets(path)
        sizes = np.diff(offsets)
        want = manifest.client_sizes[clients.start:clients.stop]
        if first != clients.start or len(sizes) != len(want) or (sizes != want).any():
            raise ShardError(f"block {path} does not hold the clients {clients.start} to {clients.stop - 1} the "
                             f"manifest lists (first {first}, {len(sizes)} clients, or other sizes); re-prepare with "
                             f"python -m mpifed.prepare --config <config> --force")


def verify_files(manifest: Manifest) -> None:
    """Every block is present and the test and validation sets match their checksums (checked before training)."""
    missing = [b for b in range(len(manifest.blocks)) if not manifest.block_path(b).is_file()]
    if missing:
        clients = manifest.block_clients(missing[0])
        raise ShardError(f"{len(missing)} block(s) of client shards are missing, e.g. "
                         f"{manifest.block_path(missing[0])} (clients {clients.start} to {clients.stop - 1}); "
                         f"re-prepare with python -m mpifed.prepare "
                         f"--config <config> --force")
    read_shard(manifest.test_path, verify=True)
    if manifest.val_size:
        read_shard(manifest.val_path, verify=True)
    if manifest.server_size:
        read_shard(manifest.server_path, verify=True)
