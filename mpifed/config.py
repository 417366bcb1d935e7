"""Typed run configuration: defaults, YAML layers, ``--set`` overrides and validation.

A configuration is a tree of dataclasses (a dataclass may define ``check() -> list[str]``
for rules between its own keys). Some sections are *choices*: a ``name``
picks an entry of a registry (an algorithm, a partition, a data set, a model) and the
remaining keys are that entry's own options, validated against its ``Options``
dataclass. Everything is checked before any work starts; every problem is reported
with the key that has it, what is allowed, and the nearest valid key for a typo.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Union

import yaml


class ConfigError(ValueError):
    """A configuration problem, with a message that names the key and the fix."""


def opt(default: Any, help: str, *, min: float | None = None, max: float | None = None,
        exclusive_min: bool = False, math: bool = True) -> Any:
    """A config field with its help text and allowed range.

    ``math=False`` marks keys that do not change the numbers a run produces (logging,
    checkpoint frequency, resources); a resumed run may change them.
    """
    meta = {"help": help, "min": min, "max": max, "exclusive_min": exclusive_min, "math": math}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class NoOptions:
    """For registry entries without options."""


@dataclass
class Choice:
    """A registry entry picked by name, with that entry's validated options."""

    name: str
    options: Any = field(default_factory=NoOptions)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **to_dict(self.options)}


def section(cls: type, help: str) -> Any:
    """A nested config section (a dataclass), built when the config is."""
    return field(default_factory=cls, metadata={"help": help, "math": True})


def choice(registry: Callable[[], dict[str, type]], default: str, help: str,
           math: bool = True, **default_options: Any) -> Any:
    """A config field holding a :class:`Choice` from ``registry()`` (name -> Options)."""
    meta = {"help": help, "registry": registry, "math": math}

    def make() -> Choice:
        return Choice(default, registry()[default](**default_options))

    return field(default_factory=make, metadata=meta)


# --------------------------------------------------------------------- registries
def _algorithms() -> dict[str, type]:
    from mpifed.algorithms import options_registry
    return options_registry()


def _partitions() -> dict[str, type]:
    from mpifed.data.partitions import PARTITIONS
    return {name: p.Options for name, p in PARTITIONS.items()}


def _datasets() -> dict[str, type]:
    from mpifed.data.datasets import DATASETS
    return {name: d.Options for name, d in DATASETS.items()}


def _models() -> dict[str, type]:
    from mpifed.models import MODELS
    return {name: m.Options for name, m in MODELS.items()}


# ------------------------------------------------------------------------ schema
@dataclass
class RunConfig:
    name: str | None = opt(None, "run directory name under run.root; default: <config stem>-<date>-<time>", math=False)
    root: str = opt("runs", "folder that holds the run directories", math=False)
    seed: int = opt(0, "seed of model initialisation, client sampling and local training", min=0)
    eval_every: int = opt(1, "evaluate the global model on the test set every this many rounds (and after the last)", min=1, math=False)
    checkpoint_every: int = opt(10, "write a checkpoint every this many rounds (0: only when stopped and at the end)", min=0, math=False)
    keep_checkpoints: int = opt(2, "how many checkpoints to keep", min=1, math=False)
    save_model: bool = opt(True, "write the final global model to model.pt", math=False)


@dataclass
class ResourcesConfig:
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "workers' device: cuda:(local worker index % GPUs on the node) when GPUs are visible (auto), or forced", math=False)
    server_device: Literal["cpu", "cuda"] = opt("cpu", "the server's device (cuda means the node's first visible GPU)", math=False)
    threads: int = opt(0, "torch threads per rank; 0: the node's cores divided by its ranks (at least 1)", min=0, math=False)
    cache_mb: int = opt(2048, "per-worker memory budget for decoded client data (least recently used evicted)", min=1, math=False)
    deterministic: bool = opt(False, "bit-reproducible GPU runs: deterministic torch algorithms (slower); CPU runs are always reproducible", math=False)


@dataclass
class CommConfig:
    timeout_s: float = opt(3600.0, "a rank that does not reach a round's synchronisation point within this many seconds ends the job", exclusive_min=True, min=0, math=False)
    poll_ms: float = opt(20.0, "longest sleep between checks while a rank waits for the others (waiting ranks sleep, yielding the CPU; each sleep is at most 0.5% of the time waited so far)", exclusive_min=True, min=0, math=False)


@dataclass
class AugmentConfig:
    crop_padding: int | None = opt(None, "random crop with this zero padding (null: the data set's default, 0: off)", min=0)
    flip: bool | None = opt(None, "random horizontal flip (null: the data set's default)")
    cutout: int = opt(0, "Cutout square side in pixels (0: off; FedNTD uses 16)", min=0)


@dataclass
class DataConfig:
    dataset: Choice = choice(_datasets, "digits", "data set (digits, mnist, fashion_mnist, synthetic, cifar10, ...)")
    num_clients: int = opt(10, "number of clients K the training data is split into", min=1)
    partition: Choice = choice(_partitions, "dirichlet", "how training samples are split over clients", beta=0.5)
    partition_seed: int | None = opt(None, "seed of the partition and the server hold-out (null: run.seed)", min=0)
    train_subset: int = opt(0, "use only the first N training samples (0: all)", min=0)
    test_subset: int = opt(0, "use only the first N test samples (0: all)", min=0)
    server_holdout_per_class: int = opt(0, "training samples per class held out for the server (FedCAD's auxiliary set, FedGKD-VOTE's validation set) and given to no client", min=0)
    prepared_root: str = opt("data/prepared", "where prepared shards are written (one folder per data/partition setting)", math=False)
    prepared_dir: str | None = opt(None, "use exactly this prepared folder instead of one under prepared_root", math=False)
    augment: AugmentConfig = section(AugmentConfig, "training-time augmentation (never applied in evaluation)")


@dataclass
class TrainConfig:
    rounds: int = opt(30, "communication rounds", min=1, math=False)
    participation: float = opt(1.0, "fraction of clients sampled each round", min=0, max=1, exclusive_min=True)
    local_epochs: int = opt(2, "local epochs per client per round", min=1)
    batch_size: int = opt(32, "local mini-batch size", min=1)
    lr: float = opt(0.05, "local learning rate in round 0", min=0, exclusive_min=True)
    lr_decay: float = opt(1.0, "learning rate multiplied by this once per round (FedNTD: 0.99)", min=0, max=1, exclusive_min=True)
    momentum: float = opt(0.9, "SGD momentum (local; reset for every client every round)", min=0, max=1)
    weight_decay: float = opt(0.0, "SGD weight decay", min=0)
    grad_clip: float = opt(0.0, "clip the local gradient to this norm (0: off; FedGKD clips at 10)", min=0)
    eval_batch_size: int = opt(500, "batch size of test-set evaluation", min=1, math=False)


@dataclass
class Config:
    run: RunConfig = section(RunConfig, "run directory, seed, evaluation and checkpoint frequency")
    data: DataConfig = section(DataConfig, "data set, clients and partition")
    model: Choice = choice(_models, "digits_cnn", "network (digits_cnn, fedavg_cnn, resnet8, ...)")
    train: TrainConfig = section(TrainConfig, "rounds and local optimisation")
    algorithm: Choice = choice(_algorithms, "fedavg", "federated algorithm (fedavg, fedntd, fedgkd, ...)")
    resources: ResourcesConfig = section(ResourcesConfig, "devices, threads, memory")
    comm: CommConfig = section(CommConfig, "collective timeouts and idle waiting")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


# --------------------------------------------------------------- (de)serialising
def to_dict(obj: Any) -> Any:
    """Plain dict/list/scalar form of a config tree (Choices flattened to name + options)."""
    if isinstance(obj, Choice):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    return obj


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, getattr(tp, "__name__", str(tp)))


class _Builder:
    """Turns nested dicts into the dataclass tree, collecting every error."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def dataclass(self, cls: type, data: Any, path: str) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(path or "<top>", f"expected a mapping of keys, got {data!r}")
            return cls()
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = _hints(cls)
        for key in data:
            if key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
                hint = f"; did you mean '{_join(path, close[0])}'?" if close else ""
                allowed = ", ".join(fields) or "(no options)"
                self.fail(_join(path, str(key)), f"unknown key{hint} Allowed here: {allowed}")
        kwargs = {}
        for name, f in fields.items():
            if name in data:
                kwargs[name] = self.value(hints[name], data[name], _join(path, name), f)
        obj = cls(**kwargs)
        if hasattr(obj, "check") and not self.errors:
            self.errors.extend(f"{path}: {m}" for m in obj.check())
        return obj

    def choice(self, f: dataclasses.Field, data: Any, path: str) -> Choice:
        registry = f.metadata["registry"]()
        if isinstance(data, str):
            data = {"name": data}
        if not isinstance(data, dict) or "name" not in data:
            self.fail(path, f"expected a mapping with a 'name' (one of {', '.join(sorted(registry))}), got {data!r}")
            return f.default_factory()
        data = dict(data)
        name = data.pop("name")
        if name not in registry:
            close = difflib.get_close_matches(str(name), list(registry), n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            self.fail(_join(path, "name"), f"unknown {path.split('.')[-1]} {name!r}.{hint} Known: {', '.join(sorted(registry))}")
            return f.default_factory()
        return Choice(name, self.dataclass(registry[name], data, path))

    def value(self, tp: Any, v: Any, path: str, f: dataclasses.Field | None = None) -> Any:
        if f is not None and "registry" in f.metadata:
            return self.choice(f, v, path)
        origin = typing.get_origin(tp)
        if dataclasses.is_dataclass(tp):
            return self.dataclass(tp, v, path)
        if origin in (Union, types.UnionType):
            args = typing.get_args(tp)
            if v is None and type(None) in args:
                return None
            inner = [a for a in args if a is not type(None)]
            return self.value(inner[0], v, path, f)
        if origin is Literal:
            allowed = typing.get_args(tp)
            if v not in allowed:
                self.fail(path, f"{v!r} is not allowed; expected {_type_name(tp)}")
            return v
        if origin is list:
            if not isinstance(v, list):
                self.fail(path, f"expected {_type_name(tp)}, got {v!r}")
                return []
            return [self.value(typing.get_args(tp)[0], x, f"{path}[{i}]") for i, x in enumerate(v)]
        converted = _convert_scalar(tp, v)
        if converted is _INVALID:
            self.fail(path, f"expected {_type_name(tp)}, got {v!r}")
            return v
        if isinstance(converted, float) and not math.isfinite(converted):
            self.fail(path, f"expected a finite number, got {v!r}")
            return v
        if f is not None:
            self.check_range(converted, path, f)
        return converted

    def check_range(self, v: Any, path: str, f: dataclasses.Field) -> None:
        lo, hi = f.metadata.get("min"), f.metadata.get("max")
        exclusive = f.metadata.get("exclusive_min")
        too_low = lo is not None and (v < lo or (exclusive and v == lo))
        if too_low or (hi is not None and v > hi):
            parts = [f"{'>' if exclusive else '>='} {lo}"] if lo is not None else []
            parts += [f"<= {hi}"] if hi is not None else []
            self.fail(path, f"{v!r} is out of range; it must be {' and '.join(parts)}")


_INVALID = object()


def _convert_scalar(tp: Any, v: Any) -> Any:
    if tp is bool:
        return v if isinstance(v, bool) else _INVALID
    if tp is int:
        if isinstance(v, bool):
            return _INVALID
        if isinstance(v, int):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        return _INVALID
    if tp is float:
        if isinstance(v, bool):
            return _INVALID
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, str):  # PyYAML reads 1e-5 (no dot) as a string
            try:
                return float(v)
            except ValueError:
                return _INVALID
        return _INVALID
    if tp is str:
        return v if isinstance(v, str) else _INVALID
    return v


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ------------------------------------------------------------------- merging
def _is_choice_path(path: tuple[str, ...]) -> bool:
    cls: Any = Config
    for i, key in enumerate(path):
        if not dataclasses.is_dataclass(cls):
            return False
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if key not in fields:
            return False
        f = fields[key]
        if "registry" in f.metadata:
            return i == len(path) - 1
        cls = _hints(cls)[key]
    return False


def merge(base: dict[str, Any], over: dict[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Deep-merge ``over`` into ``base``. A choice section whose name changes is replaced whole."""
    out = dict(base)
    for key, value in over.items():
        sub = path + (key,)
        if _is_choice_path(sub) and isinstance(value, str):
            value = {"name": value}
        old = out.get(key)
        if _is_choice_path(sub) and isinstance(old, str):
            old = {"name": old}
        if isinstance(value, dict) and isinstance(old, dict):
            if _is_choice_path(sub) and "name" in value and value["name"] != old.get("name"):
                out[key] = dict(value)
            else:
                out[key] = merge(old, value, sub)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> dict[str, Any]:
    """``a.b.c=value`` (value read as YAML) to a nested dict."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value, e.g. train.rounds=5")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: the key {key!r} is not a dotted path like train.rounds")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({exc})") from None
    node: dict[str, Any] = {}
    cur = node
    parts = key.split(".")
    for part in parts[:-1]:
        cur[part] = {}
        cur = cur[part]
    cur[parts[-1]] = value
    return node


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a config file; a top-level ``base:`` (path relative to the file) is merged under it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    resolved = path.resolve()
    if resolved in _seen:
        raise ConfigError(f"config file {str(path)!r} includes itself through 'base:'")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections (run, data, model, train, algorithm, ...), not {type(data).__name__}")
    bases = data.pop("base", None)
    if bases is None:
        return data
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else list(bases):
        merged = merge(merged, read_yaml(path.parent / base, _seen + (resolved,)))
    return merge(merged, data)


def build(data: dict[str, Any]) -> Config:
    """Validate a plain dict into a :class:`Config`, raising one error listing every problem."""
    builder = _Builder()
    cfg = builder.dataclass(Config, data, "")
    if not builder.errors:
        builder.errors.extend(cross_checks(cfg))
    if builder.errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(builder.errors))
    return cfg


def cross_checks(cfg: Config) -> list[str]:
    """Checks between keys; each message says what to change."""
    errors = []
    sampled = round(cfg.train.participation * cfg.data.num_clients)
    if sampled < 1:
        errors.append(f"train.participation: {cfg.train.participation} of {cfg.data.num_clients} clients samples no client; raise it to at least {1 / cfg.data.num_clients:.3g}")
    from mpifed.algorithms import get_algorithm
    needs = get_algorithm(cfg.algorithm.name).needs_server_data
    if needs and cfg.data.server_holdout_per_class <= 0:
        errors.append(f"data.server_holdout_per_class: algorithm {cfg.algorithm.name!r} needs data held by the server ({needs}); set it, e.g. --set data.server_holdout_per_class=32")
    return errors


def load(paths: list[str] | None = None, overrides: list[str] | None = None,
         base: dict[str, Any] | None = None) -> tuple[Config, dict[str, Any]]:
    """Defaults (or ``base``, e.g. a run's saved config), then each YAML file, then each
    ``key=value`` override; returns the config and its plain dict."""
    data = merge(to_dict(Config()), base) if base else to_dict(Config())
    for p in paths or []:
        data = merge(data, read_yaml(p))
    # a choice's name first, so that `--set x.opt=1 x.name=y` keeps x.opt
    def picks_choice(o: str) -> bool:
        key = o.split("=", 1)[0].strip()
        return key.endswith(".name") or _is_choice_path(tuple(key.split(".")))

    ordered = sorted(overrides or [], key=lambda o: not picks_choice(o))
    for o in ordered:
        data = merge(data, parse_override(o))
    cfg = build(data)
    return cfg, cfg.to_dict()


def math_fingerprint(d: dict[str, Any]) -> dict[str, Any]:
    """The part of a config dict that changes a run's numbers (keys marked ``math=True``)."""
    return _filter_math(Config, d)


def _filter_math(cls: type, d: Any) -> Any:
    if not isinstance(d, dict) or not dataclasses.is_dataclass(cls):
        return d
    out = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _hints(cls)
    for key, value in d.items():
        f = fields.get(key)
        if f is None:
            out[key] = value
            continue
        if not f.metadata.get("math", True):
            continue
        out[key] = _filter_math(hints[key], value) if dataclasses.is_dataclass(hints[key]) else value
    return out


def diff_keys(a: Any, b: Any, path: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [k for key in keys for k in diff_keys(a.get(key), b.get(key), _join(path, key))]
    return [] if a == b else [path or "<top>"]


def digest(d: Any) -> str:
    """Short stable hash of a plain config value."""
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]


def reference() -> str:
    """Markdown tables of every key (default and help), then of each choice's own options."""
    rows: list[str] = []
    choices: list[tuple[str, dataclasses.Field]] = []

    def table(cls: type, path: str) -> list[str]:
        out = []
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            key = _join(path, f.name)
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp) and "registry" not in f.metadata:
                out += table(tp, key)
                continue
            if "registry" in f.metadata:
                choices.append((key, f))
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            shown = default.name if isinstance(default, Choice) else default
            out.append(f"| `{key}` | `{json.dumps(shown)}` | {f.metadata.get('help', '')} |")
        return out

    head = "| key | default | meaning |\n| --- | --- | --- |\n"
    rows = table(Config, "")
    parts = [head + "\n".join(rows)]
    for key, f in choices:
        for name, options in sorted(f.metadata["registry"]().items()):
            sub = table(options, key)
            body = head + "\n".join(sub) if sub else "(no options)"
            parts.append(f"### `{key}: {name}`\n\n{body}")
    return "\n\n".join(parts)
