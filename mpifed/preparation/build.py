"""Preparing a config's data: a data set plus a partition written once as a prepared folder
(:mod:`mpifed.data.prepared`), or a folder of format 1 (one file per client) converted in place.

A block is written at a time, so preparing holds one block's rows beyond the data set (a data set
too large to hold keeps its images in a file, :class:`~mpifed.data.image_rows.ImageRows`, and
preparing then holds the labels and one block). A folder of format 1 is converted from its own
shards by ``python -m mpifed.prepare`` (its spec, and so its name and its runs' identity, unchanged).

A folder is reused when its manifest's spec equals the config's; any difference is an
error that says how to re-prepare. Folders are built in a temporary sibling and renamed
into place, so a half-written folder is never seen.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mpifed.data.fingerprint import fingerprint
from mpifed.data.partitions import PartitionError, hold_out_per_class, hold_out_stratified, split_summary
from mpifed.data.prepared import (FORMAT, TRACES, Manifest, PreparedDataError, block_starts, check_raw_inputs,
                                  row_bytes, write_index)
from mpifed.data.raw import RawData, RawText, modality, select, take
from mpifed.data.shards import named, read_shard, write_block, write_shard
from mpifed.plugin.registry import DATASETS, PARTITIONS
from mpifed.preparation.spec import check_matches, prepare_spec, prepared_dir, trace_paths
from mpifed.settings.config import Config


_TEMPORARY = re.compile(r"^.+\.tmp-(?P<host>.+)-(?P<pid>\d+)$")  # a folder being built by _build


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
        starts = block_starts(sizes, row_bytes(first.inputs))
        for b, (start, end) in enumerate(zip(starts, [*starts[1:], len(sizes)])):
            shards = [read_shard(old[k], verify=True) for k in range(start, end)]
            groups = [s.groups for s in shards]
            write_block(tmp / "clients" / f"block_{b:05d}.h5",
                        {name: np.concatenate([s.inputs[name] for s in shards]) for name in first.inputs},
                        np.concatenate([s.labels for s in shards]),
                        None if groups[0] is None else np.concatenate(groups),
                        np.concatenate([[0], np.cumsum(sizes[start:end])]), start, common)
        write_index(tmp, sizes, counts)
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
        for kind, path in trace_paths(cfg).items():
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
    starts = block_starts(sizes, row_bytes(raw.train_x))
    for b, (first, end) in enumerate(zip(starts, [*starts[1:], len(sizes)])):
        idx = np.concatenate(split.parts[first:end])
        write_block(tmp / "clients" / f"block_{b:05d}.h5", named(take(raw.train_x, idx)), labels[idx],
                    raw.train_groups[idx] if raw.train_groups is not None else None,
                    np.concatenate([[0], np.cumsum(sizes[first:end])]), first, common)
    write_index(tmp, sizes, split.counts)
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
