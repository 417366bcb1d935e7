"""Which prepared folder a config reads: the settings that determine the prepared files (the spec),
the folder named after them, and whether a folder on disk matches.

The spec holds everything that changes the files and nothing else; with a data set or partition from
a plugin, its code's hash (absent for mpifed's own, so earlier folders keep their names).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from mpifed.data.prepared import Manifest, PreparedDataError
from mpifed.data.raw import modality
from mpifed.plugin.registry import DATASETS, PARTITIONS
from mpifed.settings.config import Config, diff_keys, digest, to_dict


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


def trace_paths(cfg: Config) -> dict[str, Path]:
    """The trace files the config names (system.device_trace, system.availability_trace), by kind."""
    given = (("device", cfg.system.device_trace), ("availability", cfg.system.availability_trace))
    return {kind: Path(path) for kind, path in given if path}


def _traces(cfg: Config) -> dict[str, dict[str, str]]:
    """Each configured trace's name in the prepared folder and the SHA-256 of its content."""
    out = {}
    for kind, path in trace_paths(cfg).items():
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
