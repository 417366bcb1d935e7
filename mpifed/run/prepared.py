"""Prepared data: a data set plus a partition written once as HDF5 shards and a manifest.

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
client's data), and start-up reads two arrays instead of K file headers. A block is written at a
time, so preparing holds one block's rows beyond the data set (a data set too large to hold keeps
its images in a file, :class:`~mpifed.data.image_rows.ImageRows`, and preparing then holds the
labels and one block); a worker reads only its clients' rows, and verifies each client's own
checksum when it reads it. A folder of format 1 (one file per
client) is converted in place from its own shards by ``python -m mpifed.prepare`` (its spec, and
so its name and its runs' identity, unchanged).

A folder is reused when its manifest's spec equals the config's; any difference is an
error that says how to re-prepare. Folders are built in a temporary sibling and renamed
into place, so a half-written folder is never seen.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np

from mpifed.settings.config import Config, diff_keys, digest, to_dict
from mpifed.plugin.registry import DATASETS, PARTITIONS
from mpifed.data.partitions import PartitionError, hold_out_per_class, hold_out_stratified, split_summary
from mpifed.data.fingerprint import fingerprint, first_change
from mpifed.data.raw import RawData, RawText, modality, select, take
from mpifed.data.shards import ShardError, block_offsets, named, read_shard, write_block, write_shard

FORMAT = 2
CLIENTS_PER_BLOCK = 4096
BLOCK_BYTES = 256 * 2**20      # a block closes at this many bytes of inputs (a larger client gets one of its own)
_TEMPORARY = re.compile(r"^.+\.tmp-(?P<host>.+)-(?P<pid>\d+)$")  # a folder being built by _build


INDEX = Path("clients") / "index.h5"


class PreparedDataError(RuntimeError):
    """Prepared data is missing, stale or does not match the config."""


def read_index(root: Path, name: str) -> np.ndarray:
    """``num_samples`` (K: each client's number of samples) or ``class_counts`` (K x C) of the folder ``root``."""
    with h5py.File(root / INDEX, "r") as f:
        return f[name][...].astype(np.int64)


def _write_index(root: Path, sizes: np.ndarray, counts: np.ndarray) -> None:
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


def _row_bytes(x: Any) -> int:
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


def prepare_spec(cfg: Config) -> dict[str, Any]:
    """Everything that determines the prepared files (and nothing else): with a data set or partition
    from a plugin, its code's hash (absent for mpifed's own, so earlier folders keep their names)."""
    d = cfg.data
    partition = to_dict(d.partition)
    split_file = getattr(PARTITIONS.get(d.partition.name), "fingerprint", None)
    if split_file is not None:
        partition["fingerprint"] = split_file(d.partition.options)
    code = {k: v for k, v in (("dataset", cfg.code.dataset), ("partition", cfg.code.partition)) if v}
    text = {}
    if modality(DATASETS.get(d.dataset.name)) == "text":
        from mpifed.data.tokenize import fingerprint as tokenizer_fingerprint
        text = {"text": {"tokenizer": tokenizer_fingerprint(d.tokenizer), "max_length": d.max_length}}
    traces = _traces(cfg)
    return {
        "dataset": to_dict(d.dataset),
        "num_clients": d.num_clients,
        "partition": partition,
        "seed": cfg.run.seed if d.partition_seed is None else d.partition_seed,
        "train_subset": d.train_subset,
        "test_subset": d.test_subset,
        **({"val_size": d.val_size} if d.val_size else {}),   # absent at 0: earlier folders keep their names
        "server_holdout_per_class": d.server_holdout_per_class,
        **text,
        **({"code": code} if code else {}),
        **({"traces": traces} if traces else {}),    # absent without traces: earlier folders keep their names
    }


TRACES = "traces"


def _trace_paths(cfg: Config) -> dict[str, Path]:
    """The trace files the config names (system.device_trace, system.availability_trace), by kind."""
    given = (("device", cfg.system.device_trace), ("availability", cfg.system.availability_trace))
    return {kind: Path(path) for kind, path in given if path}


def _traces(cfg: Config) -> dict[str, dict[str, str]]:
    """Each configured trace's name in the prepared folder and the SHA-256 of its content."""
    out = {}
    for kind, path in _trace_paths(cfg).items():
        digest_of = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest_of.update(chunk)
        except OSError as exc:
            raise PreparedDataError(f"system.{kind}_trace: {path} cannot be read ({exc.strerror}); give the path of "
                                    f"a trace file (relative to the folder the run starts in)") from None
        out[kind] = {"file": kind + path.suffix.lower(), "sha256": digest_of.hexdigest()}
    return out


def prepared_dir(cfg: Config) -> Path:
    """The config's prepared folder: data.prepared_dir, or a name derived from the spec."""
    if cfg.data.prepared_dir:
        return Path(cfg.data.prepared_dir)
    spec = prepare_spec(cfg)
    name = f"{cfg.data.dataset.name}-{cfg.data.partition.name}-k{cfg.data.num_clients}-{digest(spec)}"
    return Path(cfg.data.prepared_root) / name


def ensure_prepared(cfg: Config, log: Callable[[str], None] = print, convert: bool = False) -> Manifest:
    """The config's prepared data: reused if its spec matches, prepared if absent, else an error;
    with ``convert``, a folder of format 1 (one file per client) is packed first (:func:`convert_format_1`).

    Safe when several processes ask at once (a job array): each builds in a folder of its own
    and the first rename wins; the others use the winner's folder.
    """
    root = prepared_dir(cfg)
    if not (root / "manifest.json").exists():
        _build(cfg, root, replace=False, log=log)
    elif convert and _format(root) == 1:
        convert_format_1(root, log)
    manifest = Manifest.load(root)
    check_matches(manifest, cfg)
    check_raw_inputs(manifest)
    return manifest


def _format(root: Path) -> Any:
    try:
        return json.loads((root / "manifest.json").read_text()).get("format")
    except (OSError, ValueError, AttributeError):
        return None     # Manifest.load says what is wrong with it


def convert_format_1(root: Path, log: Callable[[str], None] = print) -> None:
    """Pack the folder ``root`` of format 1 (``clients/client_<k>.h5``, one file per client) into
    blocks, from its own shards (each verified against its checksum), through a temporary folder
    that replaces it in one rename: the files a fresh prepare writes, with the same spec."""
    manifest = json.loads((root / "manifest.json").read_text())
    listed = manifest["clients"]
    sizes = np.array([c["num_samples"] for c in listed], dtype=np.int64)
    counts = np.array([c["class_counts"] for c in listed], dtype=np.int64).reshape(len(listed), manifest["num_classes"])
    old = [root / "clients" / f"client_{k:05d}.h5" for k in range(len(listed))]
    first = read_shard(old[0], verify=True)
    common = {k: v for k, v in first.attrs.items()
              if k not in ("client_id", "class_counts", "num_samples", "checksum", "inputs")}
    log(f"[prepare] {root} holds one file per client (format 1): packing its {len(listed)} clients into blocks ...")
    tmp = root.with_name(f"{root.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "clients").mkdir(parents=True)
        starts = block_starts(sizes, _row_bytes(first.inputs))
        for b, (start, end) in enumerate(zip(starts, [*starts[1:], len(sizes)])):
            shards = [read_shard(old[k], verify=True) for k in range(start, end)]
            groups = [s.groups for s in shards]
            write_block(tmp / "clients" / f"block_{b:05d}.h5",
                        {name: np.concatenate([s.inputs[name] for s in shards]) for name in first.inputs},
                        np.concatenate([s.labels for s in shards]),
                        None if groups[0] is None else np.concatenate(groups),
                        np.concatenate([[0], np.cumsum(sizes[start:end])]), start, common)
        _write_index(tmp, sizes, counts)
        for name in ("test.h5", "val.h5", "server.h5"):
            if (root / name).exists():
                shutil.copyfile(root / name, tmp / name)
        manifest.update(format=FORMAT, clients={"count": len(listed), "blocks": starts})
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _publish(tmp, root, replace=True, log=log)
    log(f"[prepare] packed {len(listed)} client files into {len(starts)} block(s) in {root}")


def check_raw_inputs(manifest: Manifest) -> None:
    """Stop when the raw files the folder was prepared from have changed since."""
    change = first_change(manifest.raw_inputs) if manifest.raw_inputs else None
    if change:
        raise PreparedDataError(
            f"the raw data changed since {manifest.root} was prepared: {change}. Its shards would not match the "
            f"raw data; re-prepare with: python -m mpifed.prepare --config <config> --force")


def raw_data_missing(cfg: Config) -> Path | None:
    """The folder a config's raw data set is expected in, when it is not there and no prepared
    folder makes it unnecessary; None otherwise. Reads no data. For text, a missing tokenizer
    folder is named first: the prepared folder's name depends on it."""
    try:
        folder = prepared_dir(cfg)
    except FileNotFoundError:  # the tokenizer (tokenize.TokenizerMissing)
        return Path(cfg.data.tokenizer)
    if (folder / "manifest.json").exists():
        return None
    check = getattr(DATASETS.get(cfg.data.dataset.name), "raw_missing", None)
    return check(cfg.data.dataset.options) if check is not None else None


def check_matches(manifest: Manifest, cfg: Config) -> None:
    want = prepare_spec(cfg)
    if manifest.spec != want:
        keys = ", ".join(diff_keys(manifest.spec, want))
        raise PreparedDataError(
            f"the prepared data in {manifest.root} was made with other settings (differing: {keys}). "
            f"Re-prepare it with: python -m mpifed.prepare --config <config> --force, "
            f"or point data.prepared_dir elsewhere (or unset it to get a folder per setting)")


def prepare(cfg: Config, log: Callable[[str], None] = print) -> Manifest:
    """Read the data set, split it, write the shards and manifest (replacing any earlier ones)."""
    root = prepared_dir(cfg)
    _build(cfg, root, replace=True, log=log)
    return Manifest.load(root)


@dataclass
class _Split:
    """The training rows as prepared: the server's held-out rows, each client's, and their class counts."""

    labels: np.ndarray
    pool: np.ndarray             # the rows the clients share (all but the server's)
    server: np.ndarray
    parts: list[np.ndarray]
    counts: np.ndarray


def _build(cfg: Config, root: Path, replace: bool, log: Callable[[str], None]) -> None:
    """Prepare ``root``: read the data set, hold out the validation set, take the subsets, hold out the
    server's rows, split the rest over the clients, then write the shards and the manifest into a
    temporary folder that becomes ``root`` in one rename."""
    spec = prepare_spec(cfg)
    _make_parent(root)
    remove_stale_temporary(root.parent, log)
    dataset = DATASETS.get(cfg.data.dataset.name)
    raw, vocab_size = _read(cfg, dataset, log)
    test_source = len(raw.test_y)
    raw, val = _hold_out_validation(raw, cfg.data.val_size, spec["seed"])
    raw = _subset(raw, cfg.data.train_subset, cfg.data.test_subset)
    split = _split(raw, cfg, spec["seed"])
    common = {"dataset": cfg.data.dataset.name, "partition": spec["partition"], "seed": spec["seed"]}
    tmp = root.with_name(f"{root.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    try:
        shards = _write_shards(tmp, raw, val, split, common)
        for kind, path in _trace_paths(cfg).items():
            (tmp / TRACES).mkdir(exist_ok=True)
            shutil.copyfile(path, tmp / TRACES / spec["traces"][kind]["file"])
        pooled = raw.train_x if len(split.pool) == len(split.labels) else select(raw.train_x, split.pool)
        mean, std = ([], []) if isinstance(raw.train_x, dict) else _channel_stats(pooled)
        test_groups = (np.bincount(raw.test_groups, minlength=len(raw.group_names)).tolist()
                       if raw.test_groups is not None else [])
        manifest = {
            "format": FORMAT, "spec": spec, "source": raw.source, "num_classes": raw.num_classes,
            "modality": modality(dataset), "input_shape": list(raw.input_shape),
            "vocab_size": vocab_size, "mean": mean, "std": std,
            "crop_padding": dataset.crop_padding, "flip": dataset.flip,
            "clients": shards["clients"],
            "test": {**shards["test"], "group_names": raw.group_names, "group_counts": test_groups,
                     **({"source_samples": test_source} if cfg.data.test_subset else {})},
            **({"val": shards["val"]} if shards["val"] else {}),
            "server": shards["server"],
            "stats": partition_stats(split.counts),
            "raw_inputs": fingerprint(raw.files),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    except BaseException as exc:   # nothing half-written is left behind, whatever the failure
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(exc, OSError):
            raise
        raise PreparedDataError(f"cannot write the prepared data to {tmp} ({exc}): data.prepared_root (or "
                                f"data.prepared_dir) must be a folder you can write to, with space") from None
    if _publish(tmp, root, replace, log):
        sets = "test set, validation set" if val is not None else "test set"
        log(f"[prepare] wrote {len(split.parts)} clients in {len(shards['clients']['blocks'])} block(s), {sets} and "
            f"manifest to {root}")


def _make_parent(root: Path) -> None:
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PreparedDataError(f"cannot create the folder {root.parent} for the prepared data ({exc.strerror}): "
                                f"data.prepared_root (or data.prepared_dir) must be a folder you can write to "
                                f"(not a file, not under /proc); set it to one") from None


def _read(cfg: Config, dataset: Any, log: Callable[[str], None]) -> tuple[RawData, int]:
    """The data set's training and test rows, a text set tokenised; and the vocabulary size (0: not text)."""
    log(f"[prepare] reading {cfg.data.dataset.name} ...")
    raw = dataset.load(cfg.data.dataset.options)
    if isinstance(raw, RawText):
        from mpifed.data.tokenize import tokenize
        return tokenize(raw, cfg.data.tokenizer, cfg.data.max_length, log)
    return raw, 0


def _hold_out_validation(raw: RawData, size: int, seed: int) -> tuple[RawData, tuple | None]:
    """The training rows less a stratified validation set of ``size``, and that set (inputs, labels,
    groups; None when ``size`` is 0)."""
    if not size:
        return raw, None
    val_idx, rest = hold_out_stratified(raw.train_y, size, np.random.default_rng([seed, 0x7A1]))
    val = (take(raw.train_x, val_idx), raw.train_y[val_idx],
           raw.train_groups[val_idx] if raw.train_groups is not None else None)
    return _rows(raw, rest, slice(None)), val


def _split(raw: RawData, cfg: Config, seed: int) -> _Split:
    """The server's held-out rows (``data.server_holdout_per_class``), then the partition of the rest."""
    rng = np.random.default_rng([seed, 0x5EED])
    labels = raw.train_y
    server, pool = np.zeros(0, dtype=np.int64), np.arange(len(labels))
    if cfg.data.server_holdout_per_class:
        server, pool = hold_out_per_class(labels, cfg.data.server_holdout_per_class, rng)
    partition = PARTITIONS.get(cfg.data.partition.name)
    groups = raw.train_groups[pool] if raw.train_groups is not None else None
    parts = partition.split(labels[pool], cfg.data.num_clients, rng, cfg.data.partition.options, groups, indices=pool)
    if len(server):    # positions in the pool, made rows of the data set (otherwise they are: the pool is every row)
        parts = [pool[p] for p in parts]
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise PartitionError(f"clients {empty[:10]} received no samples; use fewer clients or a less skewed partition")
    return _Split(labels, pool, server, parts, split_summary(parts, labels, raw.num_classes))


def _write_shards(tmp: Path, raw: RawData, val: tuple | None, split: _Split, common: dict[str, Any]) -> dict[str, Any]:
    """Every shard, written into ``tmp``: the clients', the test set's, the validation set's and the
    server's; their manifest sections (``clients``, ``test``, ``val``, ``server``; None where absent)."""
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "clients").mkdir(parents=True)
    labels, classes = split.labels, raw.num_classes
    sizes = np.array([len(p) for p in split.parts], dtype=np.int64)
    starts = block_starts(sizes, _row_bytes(raw.train_x))
    for b, (first, end) in enumerate(zip(starts, [*starts[1:], len(sizes)])):
        idx = np.concatenate(split.parts[first:end])
        write_block(tmp / "clients" / f"block_{b:05d}.h5", named(take(raw.train_x, idx)), labels[idx],
                    raw.train_groups[idx] if raw.train_groups is not None else None,
                    np.concatenate([[0], np.cumsum(sizes[first:end])]), first, common)
    _write_index(tmp, sizes, split.counts)
    clients = {"count": len(sizes), "blocks": starts}
    test_counts = np.bincount(raw.test_y, minlength=classes).tolist()
    write_shard(tmp / "test.h5", raw.test_x, raw.test_y, {**common, "client_id": -1, "class_counts": test_counts},
                raw.test_groups)
    val_section = None
    if val is not None:
        vc = np.bincount(val[1], minlength=classes).tolist()
        write_shard(tmp / "val.h5", val[0], val[1], {**common, "client_id": -3, "class_counts": vc}, val[2])
        val_section = {"num_samples": int(len(val[1])), "class_counts": vc}
    server = None
    if len(split.server):
        sc = np.bincount(labels[split.server], minlength=classes).tolist()
        write_shard(tmp / "server.h5", take(raw.train_x, split.server), labels[split.server],
                    {**common, "client_id": -2, "class_counts": sc})
        server = {"num_samples": int(len(split.server)), "class_counts": sc}
    return {"clients": clients, "test": {"num_samples": int(len(raw.test_y)), "class_counts": test_counts},
            "val": val_section, "server": server}


def _publish(tmp: Path, root: Path, replace: bool, log: Callable[[str], None]) -> bool:
    """Rename ``tmp`` to ``root`` (replacing it with ``replace``); False where another process prepared
    the same folder meanwhile (theirs is kept)."""
    if replace and root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, root)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"[prepare] {root} was prepared by another process meanwhile; using it")
        return False
    return True


def remove_stale_temporary(folder: Path, log: Callable[[str], None]) -> list[Path]:
    """Delete the temporary folders (``<name>.tmp-<host>-<pid>``) that killed prepares left in
    ``folder``; returns them. Only those of this host whose process is gone are deleted: a live
    process's folder is being written, and whether another host's process lives cannot be known
    from here (those are named in the log, to be removed by hand once no prepare runs there)."""
    host = socket.gethostname()
    removed, elsewhere = [], []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        m = _TEMPORARY.match(path.name)
        if m is None or not path.is_dir():
            continue
        if m["host"] != host:
            elsewhere.append(path)
        elif not _alive(int(m["pid"])):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        log(f"[prepare] removed {len(removed)} temporary folder(s) that killed prepares left: "
            f"{', '.join(p.name for p in removed)}")
    if elsewhere:
        log(f"[prepare] left {len(elsewhere)} temporary folder(s) of prepares on other hosts "
            f"({', '.join(p.name for p in elsewhere)}); remove them once no prepare runs there")
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process
        pass
    return True


def _subset(raw: RawData, train: int, test: int) -> RawData:
    if not train and not test:
        return raw
    return _rows(raw, slice(None, train or None), slice(None, test or None))


def _rows(raw: RawData, tr: np.ndarray | slice, te: np.ndarray | slice) -> RawData:
    """The training rows ``tr`` and test rows ``te`` of ``raw``."""
    return RawData(select(raw.train_x, tr), raw.train_y[tr], select(raw.test_x, te), raw.test_y[te], raw.num_classes,
                   raw.source, raw.train_groups[tr] if raw.train_groups is not None else None,
                   raw.test_groups[te] if raw.test_groups is not None else None, raw.group_names, raw.files)


def _channel_stats(x: np.ndarray, chunk: int = 4096) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation of images scaled to [0, 1]."""
    c = x.shape[1]
    s = np.zeros(c)
    ss = np.zeros(c)
    for i in range(0, len(x), chunk):
        b = x[i:i + chunk].astype(np.float64) / 255.0
        s += b.sum(axis=(0, 2, 3))
        ss += (b * b).sum(axis=(0, 2, 3))
    n = len(x) * x.shape[2] * x.shape[3]
    mean = s / n
    std = np.sqrt(np.maximum(ss / n - mean * mean, 1e-12))
    return [round(float(v), 6) for v in mean], [round(float(v), 6) for v in std]


def partition_stats(counts: np.ndarray) -> dict[str, Any]:
    """Summary of a K x C class-count matrix: sizes, classes per client, label skew."""
    sizes = counts.sum(axis=1)
    glob = counts.sum(axis=0) / max(1, counts.sum())
    local = counts / np.maximum(sizes[:, None], 1)
    tv = 0.5 * np.abs(local - glob[None]).sum(axis=1)
    held = (counts > 0).sum(axis=1)
    return {
        "clients": int(len(sizes)),
        "samples": int(sizes.sum()),
        "size_min": int(sizes.min()), "size_mean": float(sizes.mean()), "size_max": int(sizes.max()),
        "classes_per_client_min": int(held.min()), "classes_per_client_mean": float(held.mean()),
        "classes_per_client_max": int(held.max()),
        "label_skew_tv_mean": round(float(tv.mean()), 4),
    }


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
