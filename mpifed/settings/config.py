"""Typed run configuration: defaults, YAML layers, ``--set`` overrides and validation.

A configuration is a tree of dataclasses (a dataclass may define ``check() -> list[str]``
for rules between its own keys). Some sections are *choices*: a ``name``
picks an entry of a registry (an algorithm, a partition, a data set, a model) and the
remaining keys are that entry's own options, validated against its ``Options``
dataclass (made with :mod:`mpifed.plugin.options`); an entry may also check the rest of the
configuration (its ``check_config(cfg)`` hook). Everything is checked before any work
starts; every problem is reported with the key that has it, what is allowed, and the
nearest valid key for a typo.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Literal, Union

import yaml

from mpifed.settings import plugins as plugin_code
from mpifed.files import safe_yaml
from mpifed.plugin.options import ConfigError, NoOptions, opt
from mpifed.files.packaged import find_config
from mpifed.local.train_config import TrainConfig
from mpifed.settings.system import SystemConfig
from mpifed.plugin.registry import ALGORITHMS, DATASETS, MODELS, PARTITIONS, SELECTORS, SERVER_OPTIMIZERS, Registry, nearest


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
def _options_of(registry: Registry) -> Callable[[], dict[str, type]]:
    def options() -> dict[str, type]:
        return {name: entry.Options for name, entry in registry.items().items()}
    return options


_algorithms = _options_of(ALGORITHMS)
_partitions = _options_of(PARTITIONS)
_datasets = _options_of(DATASETS)
_models = _options_of(MODELS)
_server_optimizers = _options_of(SERVER_OPTIMIZERS)
_selectors = _options_of(SELECTORS)


# ------------------------------------------------------------------------ schema
@dataclass
class RunConfig:
    name: str | None = opt(None, "run directory name under run.root; default: <config stem>-<date>-<time> (-2, -3, ... "
                                 "when taken)", math=False)
    root: str = opt("runs", "folder that holds the run directories", math=False)
    seed: int = opt(0, "seed of model initialisation, client sampling and local training", min=0, max=2**63 - 1)
    eval_every: int = opt(1, "evaluate the global model on the test set (and the validation set, data.val_size) every "
                             "this many rounds (and after the last)", min=1, math=False)
    eval_last: int = opt(0, "also evaluate every one of the last N rounds (a mean over the last evaluations at little "
                            "cost); does not change training", min=0, math=False)
    eval_test: bool = opt(True, "evaluate the test set at each evaluation; false: the validation set only "
                                "(data.val_size), as a table's search runs do, which choose on validation and report "
                                "nothing", math=False)
    checkpoint_every: int = opt(10, "write a checkpoint every this many rounds (0: only when "
                                    "stopped and at the end)", min=0, math=False)
    keep_checkpoints: int = opt(2, "how many checkpoints to keep", min=1, math=False)
    save_model: bool = opt(True, "write the final global model to model.pt", math=False)
    tensorboard: bool = opt(False, "also write TensorBoard event files (runs/<name>/tensorboard/) from the metrics "
                                   "rows; needs pip install 'mpifed[tensorboard]'", math=False)
    mlflow: bool = opt(False, "also track the run in MLflow: the resolved config as parameters, each round's metrics, "
                              "the summary as an artifact (mpifed report --mlflow adds the figures); needs pip install "
                              "'mpifed[mlflow]'", math=False)
    mlflow_uri: str | None = opt(None, "MLflow tracking URI (http://server:5000, sqlite:///mlflow.db, file:/path); "
                                       "null: $MLFLOW_TRACKING_URI where set, else a file store in <run.root>/mlruns, "
                                       "beside the run directories", math=False)
    mlflow_experiment: str | None = opt(None, "MLflow experiment name; null: run.group", math=False)
    wandb: bool = opt(False, "also track the run in Weights & Biases: the resolved config, each round's metrics, the "
                             "summary; W&B's own settings apply (WANDB_MODE=offline writes the run to disk for a later "
                             "wandb sync); needs pip install 'mpifed[wandb]'", math=False)
    wandb_project: str = opt("mpifed", "W&B project", math=False)
    wandb_entity: str | None = opt(None, "W&B entity (team or user); null: W&B's default for the login", math=False)
    group: str | None = opt(None, "what the run belongs to, for the trackers (MLflow's experiment, W&B's group): a "
                                  "table's runs get <folder>-<table> (its search runs <folder>-<table>-tuning), a "
                                  "sweep's its folder; null: the config file's name without .yaml", math=False)
    rounds_to: list[float] = opt([], "targets (fractions of test accuracy, e.g. [0.65, 0.9]) whose T(target), the "
                                     "first evaluated round that reaches it, summary.json records under "
                                     "rounds_to", math=False)

    def check(self) -> list[str]:
        return [f"rounds_to: {t!r} is not a fraction in (0, 1]; write 65% "
                "as 0.65" for t in self.rounds_to if not 0 < t <= 1]


@dataclass
class ResourcesConfig:
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "workers' device: cuda:(local worker index % GPUs on the "
                                                         "node) when GPUs are visible (auto), or forced", math=False)
    server_device: Literal["cpu", "cuda"] = opt("cpu", "the server's device (cuda means the node's first "
                                                       "visible GPU)", math=False)
    threads: int = opt(1, "torch threads per rank, the same in every mode (debug, any rank count). On the CPU the "
                          "count changes a run's numbers (how sums are split), so it is part of a run's identity; 0: "
                          "the node's cores divided by its ranks (then the numbers depend on the machine and the rank "
                          "count)", min=0)
    cache_mb: int = opt(2048, "per-worker memory budget for decoded client data (least recently "
                              "used evicted)", min=1, math=False)
    deterministic: bool = opt(False, "bit-reproducible GPU runs: deterministic torch algorithms (slower); CPU runs are "
                                     "always reproducible", math=False)
    client_state_mb: int = opt(1024, "per-worker memory for per-client state (MOON's previous models, SCAFFOLD's "
                                     "controls); what does not fit is kept on disk in the run "
                                     "directory", min=0, math=False)
    mps: Literal["auto", "on", "off"] = opt("auto", "CUDA MPS control daemon for the job, started and stopped by the "
                                                    "launcher (mpifed launch, launch/local.sh) and "
                                                    "slurm/gpu-node.sbatch: auto (when two or more ranks share a GPU "
                                                    "and nvidia-cuda-mps-control exists), on (whenever ranks use a "
                                                    "GPU), off; a daemon already running is used", math=False)
    cuda_graphs: Literal["auto", "on", "off"] = opt("off", "capture each GPU worker's full-batch local step as a CUDA "
                                                           "graph and replay it: auto (on GPU workers, eager on the "
                                                           "CPU), on (a CPU worker is an error), off; a method that "
                                                           "cannot be captured says so and runs eagerly", math=False)
    precision: Literal["fp32", "tf32", "bf16"] = opt("fp32", "local training arithmetic: fp32 (PyTorch's defaults), "
                                                             "tf32 (CUDA matmuls in TF32 too), bf16 (forward and loss "
                                                             "under bfloat16 autocast; weights, gradients, optimiser "
                                                             "and evaluation stay float32); like the device, not part "
                                                             "of a run's identity", math=False)


@dataclass
class CommConfig:
    timeout_s: float = opt(3600.0, "a rank that does not reach a round's synchronisation point within this many "
                                   "seconds ends the job", exclusive_min=True, min=0, math=False)
    poll_ms: float = opt(20.0, "longest sleep between checks while a rank waits for the others (waiting ranks sleep, "
                               "yielding the CPU; each sleep is at most 0.5% "
                               "of the time waited so far)", exclusive_min=True, min=0, math=False)


@dataclass
class AugmentConfig:
    crop_padding: int | None = opt(None, "random crop with this zero padding (null: the data set's default, 0: "
                                         "off)", min=0)
    flip: bool | None = opt(None, "random horizontal flip (null: the data set's default)")
    rotation: float = opt(0.0, "random rotation by up to this many degrees either way (0: off; FedCSD's CIFAR-100 "
                               "code: 15)", min=0, max=180)
    cutout: int = opt(0, "Cutout square side in pixels (0: off; FedNTD uses 16)", min=0)


@dataclass
class DataConfig:
    dataset: Choice = choice(_datasets, "digits", "data set (digits, mnist, fashion_mnist, synthetic, cifar10, ...)")
    num_clients: int = opt(10, "number of clients K the training data is split into", min=1)
    partition: Choice = choice(_partitions, "dirichlet", "how training samples are split over clients", beta=0.5)
    partition_seed: int | None = opt(None, "seed of the partition and the server hold-out (null: run.seed)", min=0)
    train_subset: int = opt(0, "use only the first N training samples (0: all)", min=0)
    test_subset: int = opt(0, "use only the first N test samples (0: all); for quick runs only: summary.json and the "
                              "log say so", min=0)
    val_size: int = opt(0, "hold out N training samples as a validation set (stratified by class, seeded like the "
                           "partition; before train_subset, the server hold-out and the partition), given to no client "
                           "and to no method, and evaluated with the test set as val_acc/val_loss (0: none)", min=0)
    server_holdout_per_class: int = opt(0, "training samples per class held out for the server (FedCAD's auxiliary "
                                           "set, FedGKD-VOTE's validation set) and given to no client", min=0)
    client_holdout: float = opt(0.0, "client-level evaluation: hold out this fraction of each client's samples (at "
                                     "least one; the same ones in every run), train on the rest, and evaluate the "
                                     "global model on each client's held-out part at every evaluation (client_acc: "
                                     "mean, std, median, min, worst10 in metrics.jsonl; each client's in "
                                     "client_acc.jsonl); 0: off", min=0, max=0.9)
    prepared_root: str = opt("data/prepared", "where prepared shards are written (one folder per data/partition "
                                              "setting)", math=False)
    prepared_dir: str | None = opt(None, "use exactly this prepared folder instead of one under "
                                         "prepared_root", math=False)
    augment: AugmentConfig = section(AugmentConfig, "training-time augmentation (never applied in evaluation)")
    tokenizer: str | None = opt(None, "text data sets: local folder with the tokenizer's tokenizer.json or vocab.txt "
                                      "(e.g. DistilBERT's); nothing is downloaded")
    max_length: int = opt(128, "text data sets: token ids per text, padded or truncated to this length ([CLS] and "
                               "[SEP] included)", min=2)


@dataclass
class CodeConfig:
    algorithm: str | None = opt(None, "SHA-256 of the plugin that defines the chosen algorithm (null: mpifed's own); "
                                      "recorded by mpifed from the code it loads, never set by hand")
    model: str | None = opt(None, "SHA-256 of the plugin that defines the chosen model (null: mpifed's own)")
    dataset: str | None = opt(None, "SHA-256 of the plugin that defines the chosen data set (null: mpifed's own)")
    partition: str | None = opt(None, "SHA-256 of the plugin that defines the chosen partition (null: mpifed's own)")


@dataclass
class Config:
    plugins: list[str] = opt([], "Python files (a path relative to the config file that names it) or modules to load "
                                 "first: methods, models, data sets or partitions of your own (docs/tutorial.md); the "
                                 "files of every config add up", math=False)
    run: RunConfig = section(RunConfig, "run directory, seed, evaluation and checkpoint frequency")
    data: DataConfig = section(DataConfig, "data set, clients and partition")
    model: Choice = choice(_models, "digits_cnn", "network (digits_cnn, fedavg_cnn, resnet8, ...)")
    train: TrainConfig = section(TrainConfig, "rounds and local optimisation")
    algorithm: Choice = choice(_algorithms, "fedavg", "federated algorithm (fedavg, fedntd, fedgkd, ...)")
    server_optimizer: Choice = choice(_server_optimizers, "sgd", "the server's step from the global model to the "
                                      "round's aggregate (sgd, sgdm, adagrad, adam, yogi; sgd at lr 1: the aggregate)")
    selection: Choice = choice(_selectors, "uniform", "which available clients a round samples (uniform, weighted, "
                                                      "oort; docs/federations.md)")
    system: SystemConfig = section(SystemConfig, "the simulated federation: virtual clock, devices, availability, "
                                                 "deadlines, local work (off by default; docs/federations.md)")
    resources: ResourcesConfig = section(ResourcesConfig, "devices, threads, memory")
    comm: CommConfig = section(CommConfig, "collective timeouts and idle waiting")
    code: CodeConfig = section(CodeConfig, "the code of the chosen entries that come from plugins, by hash (recorded "
                                           "by mpifed): a changed plugin is a changed setting")

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


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # cached: resolving the string annotations is most of the time of loading a config (a table
    # loads hundreds); callers only read the dict
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
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


class _Builder:
    """Turns nested dicts into the dataclass tree, collecting every error."""

    def __init__(self, recorded_code: dict[str, Any] | None = None) -> None:
        self.errors: list[str] = []
        self.registries: dict[str, dict[str, type]] = {}   # choice path -> its registry's options
        self.recorded_code = recorded_code   # a run's code section: entries of code not loaded keep their options

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
                hint = f"; did you mean '{_join(path, close[0])}'?" if close else "."
                allowed = ", ".join(fields) or "none"
                self.fail(_join(path, str(key)), f"unknown key{hint} Allowed here: "
                                                 f"{allowed}.{self.owners(path, str(key))}")
        kwargs = {}
        for name, f in fields.items():
            if name in data:
                kwargs[name] = self.value(hints[name], data[name], _join(path, name), f)
        obj = cls(**kwargs)
        if hasattr(obj, "check") and not self.errors:
            self.errors.extend(f"{path}: {m}" for m in obj.check())
        return obj

    def owners(self, path: str, key: str) -> str:
        """For an option of a choice (algorithm.mu), which entries do have it."""
        registry = self.registries.get(path)
        if registry is None:
            return ""
        have = sorted(name for name, options in registry.items()
                      if dataclasses.is_dataclass(options) and key in {f.name for f in dataclasses.fields(options)})
        if not have:
            return ""
        return f" '{key}' is an option of {', '.join(have)}: choose one with {path}.name=..."

    def choice(self, f: dataclasses.Field, data: Any, path: str) -> Choice:
        registry = f.metadata["registry"]()
        if isinstance(data, str):
            data = {"name": data}
        if not isinstance(data, dict) or "name" not in data:
            self.fail(path, f"expected a mapping with a 'name' (one of {', '.join(sorted(registry))}), got {data!r}")
            return f.default_factory()
        data = dict(data)
        name = data.pop("name")
        self.registries[path] = registry
        if self.recorded_code is not None and self.not_loaded(path, name):
            return Choice(name, copy.deepcopy(data))
        if name not in registry:
            close = nearest(name, registry)
            hint = f" Did you mean '{close}'?" if close else ""
            self.fail(_join(path, "name"), f"unknown {path.split('.')[-1]} {name!r}.{hint} Known: "
                                           f"{', '.join(sorted(registry))}")
            return f.default_factory()
        return Choice(name, self.dataclass(registry[name], data, path))

    def not_loaded(self, path: str, name: Any) -> bool:
        """Whether the choice at ``path`` names an entry of a plugin (by the recorded hash) whose code is
        not loaded in this process."""
        kind = path.rsplit(".", 1)[-1]
        sha = (self.recorded_code or {}).get(kind)
        if not isinstance(sha, str) or kind not in plugin_code.KINDS:
            return False
        found = plugin_code.provider(kind, name) if isinstance(name, str) else None
        return found is None or found.sha256 != sha

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
            if isinstance(v, bool) and {"on", "off"} <= set(allowed):
                v = "on" if v else "off"        # YAML 1.1 reads on and off as booleans
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
            several = ""
            if isinstance(v, str) and "," in v:
                several = (f"; to run each of several values, sweep them: python -m mpifed.table --config ... "
                           f"--sweep {path}={v.replace(' ', '')} (docs/results.md, Sweeps)")
            self.fail(path, f"expected {_type_name(tp)}, got {v!r}{several}")
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


def _is_string_key(path: tuple[str, ...], data: dict[str, Any]) -> bool:
    """Whether the config key at ``path`` holds text (so ``run.name=off`` stays the string 'off')."""
    cls: Any = Config
    node: Any = data
    for i, key in enumerate(path):
        if not dataclasses.is_dataclass(cls):
            return False
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if key not in fields:
            return False
        f = fields[key]
        node = node.get(key) if isinstance(node, dict) else None
        if "registry" in f.metadata:
            if i == len(path) - 1:
                return False
            name = node.get("name") if isinstance(node, dict) else node
            options = f.metadata["registry"]().get(name)
            if options is None:
                return False
            if path[i + 1] == "name":
                return i + 1 == len(path) - 1
            cls = options
            continue
        cls = _hints(cls)[key]
    args = typing.get_args(cls) if typing.get_origin(cls) in (Union, types.UnionType) else (cls,)
    return str in args


def parse_override(text: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """``a.b.c=value`` to a nested dict: the value read as YAML, or kept as typed when the key
    holds text (in the config ``data`` being built)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value, e.g. train.rounds=5")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: the key {key!r} is not a dotted path like train.rounds")
    parts = key.split(".")
    if data is not None and raw.strip() and _is_string_key(tuple(parts), data):
        value: Any = raw
    else:
        try:
            value = safe_yaml.load(raw, f"override {text!r}") if raw.strip() else None
        except safe_yaml.YamlRefused as exc:
            raise ConfigError(str(exc)) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {text!r}: the value is not valid YAML ({exc})") from None
    node: dict[str, Any] = {}
    cur = node
    for part in parts[:-1]:
        cur[part] = {}
        cur = cur[part]
    cur[parts[-1]] = value
    return node


@functools.lru_cache(maxsize=512)
def _parse_yaml(text: str, source: str) -> Any:
    # keyed by the text, so a changed file is parsed again; a table reads its few files hundreds of times
    return safe_yaml.load(text, source)


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a config file; a top-level ``base:`` (path relative to the file) is merged under it.
    ``plugins`` file paths are made absolute (relative to the file that names them), and the
    plugins of the bases and the file add up."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist (`mpifed config list` shows the configs shipped "
                          "with mpifed)")
    resolved = path.resolve()
    if resolved in _seen:
        raise ConfigError(f"config file {str(path)!r} includes itself through 'base:'")
    source = f"config file {str(path)!r}"
    try:
        data = copy.deepcopy(_parse_yaml(safe_yaml.read_text(path, source), source))
    except safe_yaml.YamlRefused as exc:
        raise ConfigError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections (run, data, model, train, "
                          f"algorithm, ...), not {type(data).__name__}")
    own = plugin_specs(data.pop("plugins", None), f"config file {str(path)!r}", path.parent)
    bases = data.pop("base", None)
    if bases is None:
        return {**data, "plugins": own} if own else data
    merged: dict[str, Any] = {}
    inherited: list[str] = []
    for base in [bases] if isinstance(bases, str) else list(bases):
        layer = read_yaml(path.parent / base, _seen + (resolved,))
        inherited += layer.pop("plugins", [])
        merged = merge(merged, layer)
    merged = merge(merged, data)
    specs = list(dict.fromkeys(inherited + own))
    return {**merged, "plugins": specs} if specs else merged


def key_sources(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, str]:
    """Where each key of the config file ``path`` (one :func:`read_yaml` has read) is set, its bases'
    under its own: ``"train.lr"`` -> ``"configs/x.yaml, line 7"``."""
    path = Path(path)
    source = f"config file {str(path)!r}"
    text = safe_yaml.read_text(path, source)
    data = _parse_yaml(text, source)
    found: dict[str, str] = {}
    bases = data.get("base") if isinstance(data, dict) else None
    for base in [bases] if isinstance(bases, str) else list(bases or []):
        if (path.parent / base).resolve() not in _seen:
            found.update(key_sources(path.parent / base, _seen + (path.resolve(),)))
    for keys, line in _key_lines(text).items():
        if keys[0] not in ("base", "plugins"):
            found[".".join(map(str, keys))] = f"{path}, line {line}"
    return found


@functools.lru_cache(maxsize=512)
def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    return safe_yaml.key_lines(text)


def plugin_specs(value: Any, source: str, relative_to: Path | None) -> list[str]:
    """A ``plugins`` value (a file or module, or a list of them) as a list of specs, file paths made
    absolute relative to ``relative_to`` (the folder of the file that names them; None: the current folder)."""
    if value is None:
        return []
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not all(isinstance(v, str) and v.strip() for v in listed):
        raise ConfigError(f"{source}: plugins must be a list of Python files or modules, e.g. plugins: "
                          f"[my_method.py, mylab.methods], got {value!r}")
    return [plugin_code.resolve_spec(v.strip(), relative_to) for v in listed]


def build(data: dict[str, Any], where: dict[str, str] | None = None) -> Config:
    """Validate a plain dict into a :class:`Config`, raising one error listing every problem (the
    installed plugins loaded first, so that their entries are known); a problem with a key ``where``
    places (a file and its line) says where it was set."""
    plugin_code.load_installed()
    builder = _Builder()
    cfg = builder.dataclass(Config, data, "")
    if not builder.errors:
        builder.errors.extend(cross_checks(cfg))
    if builder.errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(_located(e, where or {}) for e in builder.errors))
    return cfg


def recorded(data: dict[str, Any]) -> Config:
    """A run's stored, resolved config (config.yaml) as a :class:`Config`, read for its names and
    values, never by running code: a chosen entry that a plugin defined (its hash under ``code``)
    and that no code loaded in this process defines with that hash keeps its recorded options
    unchecked (a plain dict). Raises ConfigError for what this version cannot read."""
    code = data.get("code") if isinstance(data, dict) else None
    builder = _Builder(code if isinstance(code, dict) else {})
    cfg = builder.dataclass(Config, data, "")
    if builder.errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(builder.errors))
    return cfg


def _located(error: str, where: dict[str, str]) -> str:
    """``"key: message"`` as ``"key (file, line N): message"`` where ``where`` knows the key."""
    key, _, message = error.partition(": ")
    return f"{key} ({where[key]}): {message}" if key in where else error


def cross_checks(cfg: Config) -> list[str]:
    """Checks between keys; each message says what to change."""
    errors = []
    sampled = round(cfg.train.participation * cfg.data.num_clients)
    if sampled < 1:
        errors.append(f"train.participation: {cfg.train.participation} of {cfg.data.num_clients} clients samples no "
                      f"client; raise it to at least {1 / cfg.data.num_clients:.3g}")
    method = ALGORITHMS.get(cfg.algorithm.name)
    known = to_dict(Config()) if method.depends_on else {}
    for key in method.depends_on:
        if not _holds(known, key):
            errors.append(f"algorithm.name: {cfg.algorithm.name!r} declares that its numbers depend on {key!r}, which "
                          f"is not a config key (see --config-reference); fix the method's depends_on")
    if method.needs_server_data and cfg.data.server_holdout_per_class <= 0:
        errors.append(f"data.server_holdout_per_class: algorithm {cfg.algorithm.name!r} needs data held by the server "
                      f"({method.needs_server_data}); set it, e.g. --set data.server_holdout_per_class=32")
    stepper = SERVER_OPTIMIZERS.get(cfg.server_optimizer.name)
    if method.own_server_step and not stepper.returns_aggregate(cfg.server_optimizer.options):
        errors.append(f"server_optimizer: algorithm {cfg.algorithm.name!r} takes its own server step "
                      f"({method.own_server_step}), so it cannot take server_optimizer {cfg.server_optimizer.name!r} as "
                      f"well; set server_optimizer=sgd with lr 1 (the default), or choose another algorithm (fedavg "
                      f"with server_optimizer=sgdm is fedavgm with buffers: average)")
    if not cfg.run.eval_test and cfg.data.val_size <= 0:
        errors.append("run.eval_test: false evaluates only the validation set, and data.val_size is 0; set "
                      "data.val_size (e.g. 2000) or run.eval_test=true")
    if not cfg.run.eval_test and cfg.run.rounds_to:
        errors.append("run.rounds_to: the rounds to a test accuracy need the test set, and run.eval_test is false; "
                      "drop one of them")
    errors.extend(entry_checks(cfg))
    errors.extend(_modality_checks(cfg))
    return errors


def entry_checks(cfg: Config) -> list[str]:
    """The chosen entries' own checks of the rest of the configuration: the ``check_config(cfg)``
    hook an algorithm, model, data set, partition or server optimiser may define (FedNova needs SGD, say)."""
    chosen = [(ALGORITHMS, cfg.algorithm), (MODELS, cfg.model), (DATASETS, cfg.data.dataset),
              (PARTITIONS, cfg.data.partition), (SERVER_OPTIMIZERS, cfg.server_optimizer)]
    errors = []
    for registry, picked in chosen:
        check = getattr(registry.get(picked.name), "check_config", None)
        if check is not None:
            errors.extend(check(cfg))
    return errors


def _modality_checks(cfg: Config) -> list[str]:
    """The model takes what the data set holds (images or text); text needs a tokenizer."""
    from mpifed.data.raw import modality
    data = modality(DATASETS.get(cfg.data.dataset.name))
    model = modality(MODELS.get(cfg.model.name))
    errors = []
    if data != model:
        fix = "a text model such as distilbert" if data == "text" else "an image model such as digits_cnn or resnet8"
        what = {"image": "images", "text": "text"}
        errors.append(f"model.name: {cfg.model.name!r} takes {what[model]} but data set {cfg.data.dataset.name!r} "
                      f"holds {what[data]}; choose {fix}")
    if data == "text" and not cfg.data.tokenizer:
        errors.append(f"data.tokenizer: data set {cfg.data.dataset.name!r} is text and needs a local tokenizer folder "
                      f"(tokenizer.json or vocab.txt); see docs/text.md for how to obtain one")
    if data == "text" and (cfg.data.augment.crop_padding or cfg.data.augment.flip or cfg.data.augment.rotation
                           or cfg.data.augment.cutout):
        errors.append("data.augment: image augmentation is set but the data set is text; remove the data.augment keys")
    return errors


PER_ALGORITHM = "per_algorithm"


def _per_algorithm(layer: dict[str, Any], source: str) -> dict[str, Any]:
    """Pop and check a file's ``per_algorithm`` section: algorithm name -> config values."""
    section = layer.pop(PER_ALGORITHM, None) or {}
    if not isinstance(section, dict) or not all(isinstance(v, dict) for v in section.values()):
        raise ConfigError(f"{source}: '{PER_ALGORITHM}' must map algorithm names to config values, "
                          f"e.g. per_algorithm: {{fedprox: {{algorithm: {{mu: 0.001}}}}}}")
    known = _algorithms()
    for name in section:
        if name not in known:
            close = nearest(name, known)
            hint = f" Did you mean '{close}'?" if close else ""
            raise ConfigError(f"{source}: {PER_ALGORITHM}.{name}: unknown algorithm.{hint} Known: "
                              f"{', '.join(sorted(known))}")
    return section


def load(paths: list[str] | None = None, overrides: list[str] | None = None,
         base: dict[str, Any] | None = None,
         plugins: list[str] | tuple[str, ...] = ()) -> tuple[Config, dict[str, Any]]:
    """Defaults (or ``base``, e.g. a run's saved config), then each YAML file (with its
    ``per_algorithm`` values for the chosen algorithm), then each ``key=value`` override;
    returns the config and its plain dict.

    Plugins are loaded first: ``plugins`` (a command line's ``--plugin``, relative to the current
    folder), then those the files and overrides name (:func:`read_yaml`); ``base``'s are only
    listed (a resumed run's code is restored from its record, :mod:`mpifed.run.resume`). The
    resolved ``code`` section holds the hash of each plugin that defines a chosen entry.

    ``per_algorithm`` lets a setting file hold the values a paper uses for a method on that
    setting (FedProx's mu per data set, say). They count as written in that file, once the
    algorithm is known: over the files before it, under the files after it (a method file
    that sets mu itself, for a sweep, wins), and under the command line's ``--set``.
    """
    layers = [read_yaml(find_config(p)) for p in paths or []]
    specs, given = _named_plugins(layers, overrides or [], plugins)
    for spec in specs:
        plugin_code.load(spec)
    for p, layer in zip(paths or [], layers):
        _not_code(str(p), layer)
    data = merge(to_dict(Config()), base) if base else to_dict(Config())
    listed = data.get("plugins") if isinstance(data.get("plugins"), list) else []
    per_algorithm = [_per_algorithm(layer, str(p)) for p, layer in zip(paths or [], layers)]
    for layer in layers:
        data = merge(data, layer)

    # a choice's name first, so that `--set x.opt=1 x.name=y` keeps x.opt
    def picks_choice(o: str) -> bool:
        key = o.split("=", 1)[0].strip()
        return key.endswith(".name") or _is_choice_path(tuple(key.split(".")))

    ordered: list[dict[str, Any]] = []
    chosen = data
    for text in sorted((o for o in overrides or [] if o not in given), key=lambda o: not picks_choice(o)):
        ordered.append(_not_code(f"override {text!r}", parse_override(text, chosen)))
        chosen = merge(chosen, ordered[-1])
    algorithm = chosen.get("algorithm", {})
    name = algorithm.get("name") if isinstance(algorithm, dict) else algorithm
    data = chosen   # the algorithm chosen by --set first: its section would replace the per_algorithm values
    for i, section in enumerate(per_algorithm):
        if name in section:
            data = merge(data, section[name])
            for later in layers[i + 1:]:    # a later file still wins over an earlier file's per_algorithm
                data = merge(data, later)
    for o in ordered:
        data = merge(data, o)
    data["plugins"] = list(dict.fromkeys(listed + specs))
    where: dict[str, str] = {}
    for p in paths or []:
        where.update(key_sources(find_config(p)))
    for text in overrides or []:               # the command line's own value: the error names the key only
        where.pop(text.split("=", 1)[0].strip(), None)
    cfg = build(data, where)
    cfg.code = code_of(cfg)
    return cfg, cfg.to_dict()


def load_plugins(paths: list[str] | None = None, overrides: list[str] | None = None,
                 plugins: list[str] | tuple[str, ...] = ()) -> None:
    """Load the plugins a command names, as :func:`load` does first: ``plugins`` (``--plugin``), then
    those of its config files and of a ``plugins=`` override (before a resumed run's recorded code
    is checked against them)."""
    for spec in _named_plugins([read_yaml(find_config(p)) for p in paths or []], overrides or [], plugins)[0]:
        plugin_code.load(spec)


def _named_plugins(layers: list[dict[str, Any]], overrides: list[str],
                   plugins: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The plugin specs of ``plugins``, the ``plugins=`` overrides and the files' layers (popped from
    them), in that order without repeats; and those overrides."""
    specs = plugin_specs(list(plugins), "--plugin", None)
    given = [o for o in overrides if o.split("=", 1)[0].strip() == "plugins"]
    for text in given:
        specs += plugin_specs(parse_override(text)["plugins"], f"override {text!r}", None)
    for layer in layers:
        specs += layer.pop("plugins", [])
    return list(dict.fromkeys(specs)), given


def _not_code(source: str, layer: dict[str, Any]) -> dict[str, Any]:
    """``layer`` (a file's or an override's), unless it sets ``code``, which mpifed records itself."""
    if "code" in layer:
        raise ConfigError(f"{source}: 'code' is recorded by mpifed (the SHA-256 of each plugin a run uses), not a "
                          f"setting; remove it")
    return layer


def code_of(cfg: Config) -> CodeConfig:
    """The hash of the plugin that defines each entry ``cfg`` chooses (None: mpifed's own), from the
    code loaded in this process."""
    found = {kind: plugin_code.provider(kind, name) for kind, name in chosen_entries(cfg)}
    return CodeConfig(**{kind: p.sha256 if p else None for kind, p in found.items()})


def chosen_entries(cfg: Config) -> list[tuple[str, str]]:
    """The (kind, name) of each registry entry ``cfg`` chooses, as :mod:`mpifed.settings.plugins` names them."""
    return [("algorithm", cfg.algorithm.name), ("model", cfg.model.name), ("dataset", cfg.data.dataset.name),
            ("partition", cfg.data.partition.name)]


def load_resources(paths: list[str] | None = None, overrides: list[str] | None = None,
                   base: dict[str, Any] | None = None) -> ResourcesConfig:
    """The ``resources`` section alone, from the layers :func:`load` reads (``base``, the files, the
    ``resources.*`` overrides), without the registries, so without importing torch: what a
    launcher needs before the ranks start. Raises ConfigError for a problem in that section."""
    section: Any = {}
    layers = [base or {}] + [read_yaml(find_config(p)) for p in paths or []]
    layers += [parse_override(o) for o in overrides or [] if o.split("=", 1)[0].strip().startswith("resources.")]
    for layer in layers:
        value = layer.get("resources")
        if value is not None:
            section = merge(section, value,
                            ("resources",)) if isinstance(value, dict) and isinstance(section, dict) else value
    builder = _Builder()
    resources = builder.dataclass(ResourcesConfig, section, "resources")
    if builder.errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(builder.errors))
    return resources


def math_fingerprint(d: dict[str, Any]) -> dict[str, Any]:
    """The part of a config dict that changes a run's numbers (keys marked ``math=True``, less
    train.local_epochs under train.local_steps; and train.rounds when the learning-rate schedule
    depends on it; and the keys the chosen method declares it depends on, ``Algorithm.depends_on``)."""
    out = _filter_math(Config, d)
    for key, default in _later_defaults().items():
        if out.get(key) == default:     # a run that leaves a later section at its defaults keeps its identity
            out.pop(key)
    train = d.get("train", {})
    if isinstance(train, dict) and train.get("lr_schedule") == "cosine":
        out.setdefault("train", {})["rounds"] = train.get("rounds")
    if isinstance(train, dict) and isinstance(train.get("local_steps"), int) and train["local_steps"] > 0:
        out.get("train", {}).pop("local_epochs", None)     # unused: runs that differ in it alone are the same run
    for key in _method_depends_on(d):
        _put(out, key, lookup(d, key))
    return out


@functools.cache
def _later_defaults() -> dict[str, Any]:
    """The sections added after runs were archived (the server optimiser, client selection, the simulated
    federation) at their defaults: absent from the math fingerprint, as they were before the sections existed."""
    return {"server_optimizer": Config().server_optimizer.to_dict(), "selection": Config().selection.to_dict(),
            "system": to_dict(SystemConfig())}


def _method_depends_on(d: dict[str, Any]) -> tuple[str, ...]:
    algorithm = d.get("algorithm")
    name = algorithm.get("name") if isinstance(algorithm, dict) else algorithm
    return ALGORITHMS.get(name).depends_on if isinstance(name, str) and name in ALGORITHMS.names() else ()


def result_fingerprint(d: dict[str, Any]) -> dict[str, Any]:
    """What a finished run's reported numbers depend on: the math fingerprint, the number of
    rounds and the evaluation cadence (best accuracy, rounds-to-target and the mean of the last
    evaluations read the evaluations)."""
    out = math_fingerprint(d)
    out.setdefault("train", {})["rounds"] = d.get("train", {}).get("rounds")
    run = d.get("run", {})
    out.setdefault("run", {}).update(eval_every=run.get("eval_every"), eval_last=run.get("eval_last"))
    return out


def checkpoint_changes(stored: dict[str, Any], current: dict[str, Any],
                       saved: dict[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """Compare a checkpoint's math fingerprint with a resolved config dict.

    Returns the dotted keys whose values differ, and the keys the checkpoint predates (added to
    mpifed, or made part of the math, after it was written): those count as what the run's saved
    config.yaml (``saved``) holds, else as this version's defaults, so an upgrade does not make
    older runs unresumable. A checkpoint holding a key this version no longer knows is compared
    as stored, and that key is reported as differing.
    """
    want = math_fingerprint(current)
    try:
        filled = math_fingerprint(build(stored).to_dict())
    except ConfigError:
        return diff_keys(stored, want), []
    predates = [k for k in diff_keys(stored, filled) if not _holds(stored, k)]
    for key in predates:
        if key.split(".")[0] == "code":   # from before runs recorded their code: the code loaded now
            _put(filled, key, lookup(want, key))
        elif saved is not None and _holds(saved, key):
            _put(filled, key, lookup(saved, key))
    return diff_keys(filled, want), predates


def _put(d: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        d = d.setdefault(part, {})
    d[last] = value


def _holds(d: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return False
        d = d[part]
    return True


def lookup(d: Any, dotted: str) -> Any:
    """The value at a dotted key of a nested dict (None where absent)."""
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


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


def reference(leave_out: Collection[tuple[str, str]] = ()) -> str:
    """Markdown tables of every key (default and help), then of each choice's own options, except for the
    (choice, name) pairs in ``leave_out`` (such as ``("algorithm", "fedavg")``)."""
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
            if (key, name) in leave_out:
                continue
            sub = table(options, key)
            body = head + "\n".join(sub) if sub else "(no options)"
            parts.append(f"### `{key}: {name}`\n\n{body}")
    return "\n\n".join(parts)
