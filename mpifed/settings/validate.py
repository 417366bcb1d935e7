"""Validating a plain dict into a :class:`~mpifed.settings.schema.Config`: every key's type and range,
each choice's name and options, then the checks between keys and the chosen entries' own checks.

Everything is checked before any work starts; every problem is reported with the key that has it,
what is allowed, and the nearest valid key for a typo.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal, Union

from mpifed.plugin.options import ConfigError
from mpifed.plugin.registry import AGGREGATIONS, ALGORITHMS, DATASETS, MODELS, PARTITIONS, SERVER_OPTIMIZERS, nearest
from mpifed.settings import plugins as plugin_code
from mpifed.settings.keys import dotted, holds
from mpifed.settings.schema import Choice, Config, to_dict, type_hints


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
        hints = type_hints(cls)
        for key in data:
            if key not in fields:
                close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
                hint = f"; did you mean '{dotted(path, close[0])}'?" if close else "."
                allowed = ", ".join(fields) or "none"
                self.fail(dotted(path, str(key)), f"unknown key{hint} Allowed here: "
                                                 f"{allowed}.{self.owners(path, str(key))}")
        kwargs = {}
        for name, f in fields.items():
            if name in data:
                kwargs[name] = self.value(hints[name], data[name], dotted(path, name), f)
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
            self.fail(dotted(path, "name"), f"unknown {path.split('.')[-1]} {name!r}.{hint} Known: "
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
        return found is None or found.sha256 != plugin_code.canonical(sha)

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


def build_section(cls: type, data: Any, path: str) -> Any:
    """The config section ``cls`` at ``path`` from its plain value ``data``, raising one error listing
    every problem (no checks between sections, no plugins loaded)."""
    builder = _Builder()
    section = builder.dataclass(cls, data, path)
    if builder.errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(builder.errors))
    return section


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
        if not holds(known, key):
            errors.append(f"algorithm.name: {cfg.algorithm.name!r} declares that its numbers depend on {key!r}, which "
                          f"is not a config key (see --config-reference); fix the method's depends_on")
    if method.needs_server_data and cfg.data.server_holdout_per_class <= 0:
        errors.append(f"data.server_holdout_per_class: algorithm {cfg.algorithm.name!r} needs data held by the server "
                      f"({method.needs_server_data}); set it, e.g. --set data.server_holdout_per_class=32")
    stepper = SERVER_OPTIMIZERS.get(cfg.server_optimizer.name)
    if method.own_server_step and not stepper.returns_aggregate(cfg.server_optimizer.options):
        errors.append(f"server_optimizer: algorithm {cfg.algorithm.name!r} takes its own server step "
                      f"({method.own_server_step}), so it cannot take server_optimizer "
                      f"{cfg.server_optimizer.name!r} as well; set server_optimizer=sgd with lr 1 (the default), or "
                      f"choose another algorithm (fedavg with server_optimizer=sgdm is fedavgm with buffers: average)")
    system = cfg.system
    if (system.availability != "always" or system.availability_trace) and not system.deadline and \
            not AGGREGATIONS.get(cfg.aggregation.name).asynchronous:
        errors.append("system.deadline: availability other than always needs a deadline: a round when no client is "
                      "available lasts the deadline (without one the clock would never move); set system.deadline, "
                      "e.g. 600 (an asynchronous aggregation waits its idle_wait instead)")
    if AGGREGATIONS.get(cfg.aggregation.name).asynchronous and not method.asynchronous:
        errors.append(f"aggregation: {cfg.aggregation.name} trains each client from the model version it started from "
                      f"and takes the server step of its own rule, while algorithm {cfg.algorithm.name!r} needs "
                      f"synchronous rounds (its server role, its messages or its clients' state assume that every "
                      f"client of a round starts from one model, as SCAFFOLD's control variates, FedDyn's correction "
                      f"and prototype exchange do); set aggregation=sync, choose a method that runs asynchronously "
                      f"({', '.join(n for n in ALGORITHMS.names() if ALGORITHMS.get(n).asynchronous)}), or declare "
                      f"how the method runs asynchronously (its Algorithm's asynchronous)")
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
    hook an algorithm, model, data set, partition, server optimiser or aggregation may define (FedNova needs
    SGD, say)."""
    chosen = [(ALGORITHMS, cfg.algorithm), (MODELS, cfg.model), (DATASETS, cfg.data.dataset),
              (PARTITIONS, cfg.data.partition), (SERVER_OPTIMIZERS, cfg.server_optimizer),
              (AGGREGATIONS, cfg.aggregation)]
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
