"""What of a config changes a run's numbers (its math fingerprint) and its reported results, and
whether a checkpoint's settings are the config's."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any

from mpifed.plugin.options import ConfigError
from mpifed.plugin.registry import ALGORITHMS
from mpifed.settings import plugins as plugin_code
from mpifed.settings.keys import diff_keys, holds, lookup, put
from mpifed.settings.schema import Config, to_dict, type_hints
from mpifed.settings.system import SystemConfig
from mpifed.settings.validate import build


def math_fingerprint(d: dict[str, Any]) -> dict[str, Any]:
    """The part of a config dict that changes a run's numbers (keys marked ``math=True``, less
    train.local_epochs under train.local_steps; and train.rounds when the learning-rate schedule
    depends on it; and the keys the chosen method declares it depends on, ``Algorithm.depends_on``); a
    plugin's hash under ``code`` as :func:`mpifed.settings.plugins.canonical` gives it."""
    out = _filter_math(Config, d)
    for key, default in _later_defaults().items():
        *parents, last = key.split(".")
        holder = lookup(out, ".".join(parents)) if parents else out
        if isinstance(holder, dict) and holder.get(last, default) == default:   # at its default: the identity the
            holder.pop(last, None)                                               # run had before the key existed
    train = d.get("train", {})
    if isinstance(train, dict) and train.get("lr_schedule") == "cosine":
        out.setdefault("train", {})["rounds"] = train.get("rounds")
    if isinstance(train, dict) and isinstance(train.get("local_steps"), int) and train["local_steps"] > 0:
        out.get("train", {}).pop("local_epochs", None)     # unused: runs that differ in it alone are the same run
    for key in _method_depends_on(d):
        put(out, key, lookup(d, key))
    code = out.get("code")
    if isinstance(code, dict):   # a hash recorded by an older scheme: the same code's content hash
        out["code"] = {k: plugin_code.canonical(v) if isinstance(v, str) else v for k, v in code.items()}
    return out


@functools.cache
def _later_defaults() -> dict[str, Any]:
    """The keys added after runs were archived (the server optimiser, client selection, the simulated
    federation, a selection plugin's hash, the aggregation and its plugin's hash) at their defaults: absent
    from the math fingerprint, as they were before they existed."""
    return {"server_optimizer": Config().server_optimizer.to_dict(), "selection": Config().selection.to_dict(),
            "system": _filter_math(SystemConfig, to_dict(SystemConfig())), "code.selection": None,
            "aggregation": Config().aggregation.to_dict(), "code.aggregation": None}


def _method_depends_on(d: dict[str, Any]) -> tuple[str, ...]:
    algorithm = d.get("algorithm")
    name = algorithm.get("name") if isinstance(algorithm, dict) else algorithm
    return ALGORITHMS.get(name).depends_on if isinstance(name, str) and name in ALGORITHMS.names() else ()


def result_fingerprint(d: dict[str, Any]) -> dict[str, Any]:
    """What a finished run's reported numbers depend on: the math fingerprint, the number of
    rounds, the simulated time budget (when set) and the evaluation cadence (best accuracy,
    rounds-to-target and the mean of the last evaluations read the evaluations)."""
    out = math_fingerprint(d)
    out.setdefault("train", {})["rounds"] = d.get("train", {}).get("rounds")
    run = d.get("run", {})
    out.setdefault("run", {}).update(eval_every=run.get("eval_every"), eval_last=run.get("eval_last"))
    system = d.get("system", {})
    if isinstance(system, dict) and system.get("time_budget"):
        out.setdefault("system", {})["time_budget"] = system["time_budget"]
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
    predates = [k for k in diff_keys(stored, filled) if not holds(stored, k)]
    for key in predates:
        if key.split(".")[0] == "code":   # from before runs recorded their code: the code loaded now
            put(filled, key, lookup(want, key))
        elif saved is not None and holds(saved, key):
            put(filled, key, lookup(saved, key))
    return diff_keys(filled, want), predates


def _filter_math(cls: type, d: Any) -> Any:
    if not isinstance(d, dict) or not dataclasses.is_dataclass(cls):
        return d
    out = {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = type_hints(cls)
    for key, value in d.items():
        f = fields.get(key)
        if f is None:
            out[key] = value
            continue
        if not f.metadata.get("math", True):
            continue
        out[key] = _filter_math(hints[key], value) if dataclasses.is_dataclass(hints[key]) else value
    return out


def digest(d: Any) -> str:
    """Short stable hash of a plain config value."""
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
