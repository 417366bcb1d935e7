"""Hyperparameter search for a table: grids, candidates, the choice made on validation, its record.

A table may declare a search (see :mod:`mpifed.entry.table`)::

    tuning:
      grid: {train.lr: [0.01, 0.03, 0.1]}                 # for every method
      per_method: {fedprox: {algorithm.mu: [0.001, 0.01, 0.1]},   # a method's label or algorithm
                   fedcad: {algorithm: [{beta: 0.0, gamma: 0.3}, {beta: 0.3, gamma: 0.7}]}}   # values that go together
      seeds: [0]                                          # default: the table's first seed
      rounds: 20                                          # the search horizon; default: the setting's
      select: {kind: last_k, k: 5, column: val_acc}       # default: the table's metric, on val_acc
      extend: {train.lr: {factor: 3, bounds: [0.0001, 1.0]}}   # a choice at an end: search one step beyond
      setting: ideal                                      # search on this setting only; every setting takes its choice

Each (setting, method) tries every combination of its grid values (the candidates) on the
search seeds and horizon (with ``setting``, only that setting's pairs search, and each other
setting's runs of a method take the method's choice there: tuned without, say, heterogeneity, then run
under it); the candidate with the best mean ``select`` value wins (the first
listed on ties; a candidate whose loss diverged, or that failed, cannot win). The selection
reads the validation columns only: a metric on the test set is reported, never used to choose.
A key under ``extend`` (a grid key whose values are positive numbers) does not leave a choice at
an end of its values: when the winner sits at the smallest (largest), the grid gains that value
divided (multiplied) by ``factor`` and the search goes on with the new candidates, until the winner
is inside the grid or the next value would leave ``bounds`` (:meth:`Tuning.extended`). The choice
records each step taken. The choice is recorded in ``choices.yaml`` beside the table's runs, keyed by a digest of the
search's run configurations and its selection metric, so that a changed grid, setting or
override makes a new search rather than reusing a stale choice.
"""
from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mpifed.run import results
from mpifed.files import safe_yaml
from mpifed.settings.config import ConfigError, digest
from mpifed.run.rundir import atomic_write
from mpifed.run.state import RunState
from mpifed.run.record import RunRecord

CHOICES = "choices.yaml"
KEYS = ("grid", "per_method", "seeds", "rounds", "select", "extend", "setting")


@dataclass(frozen=True)
class Extend:
    """How a search grows a key past the end its choice sits at: by ``factor``, within ``bounds``."""

    factor: float
    low: float
    high: float


@dataclass(frozen=True)
class Tuning:
    """A table's declared search."""

    grid: dict[str, list[Any]]
    per_method: dict[str, dict[str, list[Any]]]
    seeds: tuple[int, ...]
    rounds: int | None
    select: results.Metric
    extend: dict[str, Extend] = field(default_factory=dict)
    setting: str | None = None      # the one setting searched on (None: each setting its own search)

    @staticmethod
    def parse(spec: Any, table_seeds: list[int], primary: results.Metric, source: str) -> "Tuning":
        """A table file's ``tuning`` section (raises ConfigError naming the problem)."""
        if not isinstance(spec, dict):
            raise ConfigError(f"{source}: tuning must be a mapping with a grid, e.g. tuning: "
                              f"{{grid: {{train.lr: [0.01, 0.1]}}}}")
        unknown = set(spec) - set(KEYS)
        if unknown:
            raise ConfigError(f"{source}: tuning: unknown keys {', '.join(sorted(map(str, unknown)))}; allowed: "
                              f"{', '.join(KEYS)}")
        grid = _grid(spec.get("grid", {}), f"{source}: tuning.grid")
        per_method = spec.get("per_method", {})
        if not isinstance(per_method, dict):
            raise ConfigError(f"{source}: tuning.per_method must map a method (its label or algorithm) to a grid")
        per_method = {str(m): _grid(g, f"{source}: tuning.per_method.{m}") for m, g in per_method.items()}
        if not grid and not any(per_method.values()):
            raise ConfigError(f"{source}: tuning declares no grid; give tuning.grid or tuning.per_method")
        seeds = spec.get("seeds", table_seeds[:1])
        if (not isinstance(seeds, list) or not seeds
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
            raise ConfigError(f"{source}: tuning.seeds must be a list of seeds (whole numbers >= 0), e.g. [0], got "
                              f"{seeds!r}")
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"{source}: tuning.seeds lists a seed twice: {seeds}")
        rounds = spec.get("rounds")
        if rounds is not None and (not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1):
            raise ConfigError(f"{source}: tuning.rounds must be a whole number of rounds >= 1, got {rounds!r}")
        try:
            select = results.Metric.parse(spec["select"]) if "select" in spec else validation_metric(primary)
        except results.MetricError as exc:
            raise ConfigError(f"{source}: tuning.select: {exc}") from None
        if select.kind == "key" or select.column.startswith("test") or select.kind == "at_best":
            raise ConfigError(f"{source}: tuning.select must read a validation column with kind final, best or "
                              f"last_k (e.g. {{kind: last_k, k: 5, column: val_acc}}), got {select.to_spec()!r}: "
                              f"a choice made on the test set would make the test numbers optimistic")
        extend = _extend(spec.get("extend", {}), [grid, *per_method.values()], f"{source}: tuning.extend")
        setting = spec.get("setting")
        if setting is not None and not isinstance(setting, str):
            raise ConfigError(f"{source}: tuning.setting must be the label of one of the table's settings (its file "
                              f"name without .yaml), got {setting!r}")
        return Tuning(grid, per_method, tuple(seeds), rounds, select, extend, setting)

    def extended(self, grid: dict[str, list[Any]], chosen: dict[str, Any]) -> tuple[dict[str, list[Any]], list[str]]:
        """``grid`` with one value more past each end that ``chosen`` sits at, for the keys under
        ``extend`` (none where the next value would leave the key's bounds), and what was added."""
        grown, said = dict(grid), []
        for key, rule in self.extend.items():
            values = grid.get(key)
            if not values or key not in chosen or len(values) < 2:
                continue
            low, high = min(values), max(values)
            if chosen[key] == low:
                new, end = float(f"{low / rule.factor:.3g}"), "smallest"
            elif chosen[key] == high:
                new, end = float(f"{high * rule.factor:.3g}"), "largest"
            else:
                continue
            if rule.low <= new <= rule.high and new not in values:
                grown[key] = sorted([*values, new])
                said.append(f"{key}={_yaml(chosen[key])} was the {end} of {len(values)}: tried {_yaml(new)}")
        return grown, said

    def keys_for(self, method: str, algorithm: str) -> dict[str, list[Any]]:
        """The grid of one method: the table-wide grid and the method's own (by label, else by
        algorithm name)."""
        own = self.per_method.get(method, self.per_method.get(algorithm, {}))
        return {**self.grid, **own}

    @staticmethod
    def candidates(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
        """Every combination of ``grid``'s values (a method's :meth:`keys_for`, perhaps :meth:`extended`),
        in the order the grid lists them."""
        return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]

    def overrides(self, candidate: dict[str, Any]) -> list[str]:
        """``--set`` overrides that make a run of ``candidate`` over the search horizon, evaluating
        the validation set only (the search reads nothing else, and reports nothing)."""
        out = [f"{k}={_yaml(v)}" for k, v in candidate.items()]
        out += [f"train.rounds={self.rounds}"] if self.rounds is not None else []
        return out + ["run.eval_test=false"]

    def describe(self) -> str:
        horizon = f"{self.rounds} rounds" if self.rounds is not None else "the setting's rounds"
        where = f"; searched on {self.setting}, its choice taken by every setting" if self.setting else ""
        return f"{self.select.label}, mean over seeds {list(self.seeds)}, {horizon}{where}"


def validation_metric(primary: results.Metric) -> results.Metric:
    """The table's metric read on the validation set (``best`` where the metric is ``at_best``,
    whose choice is the best validation accuracy)."""
    kind = primary.kind if primary.kind in ("final", "last_k", "best") else "best"
    return results.Metric(kind=kind, column="val_acc", k=primary.k)


def _grid(spec: Any, where: str) -> dict[str, list[Any]]:
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must map config keys to lists of values, e.g. {{train.lr: [0.01, 0.03, 0.1]}}")
    out = {}
    for key, values in spec.items():
        joint = isinstance(values, list) and bool(values) and all(isinstance(v, dict) and v for v in values)
        if not isinstance(key, str) or ("." not in key and not joint):
            raise ConfigError(f"{where}: {key!r} is not a dotted config key such as train.lr (a section such as "
                              f"algorithm takes a list of mappings: values that go together, e.g. "
                              f"algorithm: [{{beta: 0.0, gamma: 0.3}}, {{beta: 0.3, gamma: 0.7}}])")
        if key.split(".")[0] == "run":
            raise ConfigError(f"{where}: {key} cannot be searched (the table sets the run keys itself)")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}.{key} must be a non-empty list of values, got {values!r}")
        if len({_yaml(v) for v in values}) != len(values):
            raise ConfigError(f"{where}.{key} lists a value twice: {values}")
        out[key] = values
    return out


def _extend(spec: Any, grids: list[dict[str, list[Any]]], where: str) -> dict[str, Extend]:
    example = "e.g. extend: {train.lr: {factor: 3, bounds: [0.0001, 1.0]}}"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must map a grid key to {{factor, bounds}}, {example}")
    out = {}
    for key, rule in spec.items():
        values = [v for g in grids for v in g.get(key, [])]
        if not values:
            raise ConfigError(f"{where}: {key!r} is not a key of the search's grids")
        if not all(_numeric(v) and v > 0 for v in values):
            raise ConfigError(f"{where}: {key}'s values must all be numbers > 0 (learning rates, positive "
                              f"coefficients) to be extended by a factor, got {values}")
        if not isinstance(rule, dict) or set(rule) != {"factor", "bounds"}:
            raise ConfigError(f"{where}.{key} must give factor and bounds, {example}")
        factor, bounds = rule["factor"], rule["bounds"]
        if not _numeric(factor) or not factor > 1:
            raise ConfigError(f"{where}.{key}.factor must be a number > 1, got {factor!r}")
        if (not isinstance(bounds, list) or len(bounds) != 2 or not all(_numeric(b) and b > 0 for b in bounds)
                or not bounds[0] < bounds[1]):
            raise ConfigError(f"{where}.{key}.bounds must be [low, high] with 0 < low < high, got {bounds!r}")
        if not all(bounds[0] <= v <= bounds[1] for v in values):
            raise ConfigError(f"{where}.{key}: the grid's values {values} lie outside its bounds {bounds}")
        out[str(key)] = Extend(float(factor), float(bounds[0]), float(bounds[1]))
    return out


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()


def label(candidate: dict[str, Any]) -> str:
    """A short run-name part for a candidate: ``lr=0.03+mu=0.01``."""
    parts = []
    leaves = [k.split(".")[-1] for k in candidate]
    for key, value in candidate.items():
        if isinstance(value, dict):
            parts += [label({f"{key}.{k}": v for k, v in value.items()})]
            continue
        name = key.split(".")[-1] if leaves.count(key.split(".")[-1]) == 1 else key
        text = f"{value:g}" if isinstance(value, float) else str(value)
        parts.append(re.sub(r"[^A-Za-z0-9._+@=-]", "_", f"{name}={text}"))
    return "+".join(parts) or "default"


@dataclass
class Candidate:
    """A candidate's runs and their values of the selection metric (None: not finished)."""

    values: dict[str, Any]
    runs: list[Path]
    scores: list[float | None] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)   # why a run cannot count (diverged, failed)

    @property
    def score(self) -> float | None:
        if self.failed or not self.scores or any(s is None for s in self.scores):
            return None
        return sum(self.scores) / len(self.scores)

    @property
    def settled(self) -> bool:
        """Whether the candidate has its score, or failed."""
        return bool(self.failed) or self.score is not None

    def entry(self) -> dict[str, Any]:
        """The candidate as a choice records it (its runs aside)."""
        return {"values": self.values, "score": self.score, **({"note": "; ".join(self.failed)} if self.failed else {})}


def score_candidate(values: dict[str, Any], runs: list[tuple[Path, RunState]], select: results.Metric) -> Candidate:
    """A candidate scored from its runs, each as (directory, state): a finished run counts its value of
    ``select``, a diverged one fails the candidate, any other is not done yet."""
    c = Candidate(values, [path for path, _ in runs])
    for path, state in runs:
        if state == RunState.FINISHED:
            score = results.value(select, RunRecord(path).metrics(), {})
            if score is None:
                raise ConfigError(f"{path} has no {select.column} to choose by: the search selects on "
                                  f"the validation set, so the setting needs one (data.val_size)")
            c.scores.append(score)
        elif state == RunState.DIVERGED:
            c.failed.append(f"diverged in {path.name}")
        else:
            c.scores.append(None)
    return c


def choose(candidates: list[Candidate], select: results.Metric) -> dict[str, Any] | None:
    """The winning candidate's values; None when none can win (all failed)."""
    scored = [(c.score, i) for i, c in enumerate(candidates) if c.score is not None]
    if not scored:
        return None
    lower_is_better = "loss" in select.column
    best = min(scored, key=lambda t: (t[0] if lower_is_better else -t[0], t[1]))
    return dict(candidates[best[1]].values)


@dataclass
class SearchChoice:
    """A search's recorded choice for one (setting, method): the settings it chose (the config's
    ``Choice`` is something else: a registry entry picked by name)."""

    setting: str
    method: str
    search: str                 # digest of the search's run configurations and selection metric
    chosen: dict[str, Any]
    record: dict[str, Any]      # the whole entry as written

    def text(self, percent: bool) -> str:
        parts = []
        for c in self.record.get("candidates", []):
            shown = _score_text(c.get("score"), percent) or c.get("note", "-")
            parts.append(f"{label(c['values'])}: {shown}")
        return f"{label(self.chosen)} (of {'; '.join(parts)})"

    def edges(self) -> list[str]:
        """The chosen numeric values that lie at an end of the values searched (``lr=0.01, the smallest
        of 3``): nothing beyond them was tried, so a wider grid may score higher."""
        found = []
        for key, value in _leaves(self.chosen).items():
            tried = [_leaves(c["values"]).get(key) for c in self.record.get("candidates", [])]
            if not _numeric(value) or not all(_numeric(v) for v in tried):
                continue
            distinct = set(tried)
            if len(distinct) < 2:
                continue
            lowest, highest = min(distinct), max(distinct)
            if value in (lowest, highest):
                end = "smallest" if value == lowest else "largest"
                found.append(f"{label({key: value})}, the {end} of {len(distinct)}")
        return found

    def grid_cells(self, grid: list[str], percent: bool) -> dict[str, str]:
        """The candidates' scores by their values of the table-wide ``grid`` keys (see :func:`grid_cells`)."""
        return grid_cells(self.record.get("candidates", []), self.chosen, grid, percent)


def _leaves(values: dict[str, Any]) -> dict[str, Any]:
    """A candidate's values with a mapping's keys as keys of their own (FedCAD's ``{beta, gamma}``
    pairs as ``algorithm.beta`` and ``algorithm.gamma``), so that each is checked for an edge."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_leaves({f"{key}.{k}": v for k, v in value.items()}))
        else:
            out[key] = value
    return out


def grid_cells(entries: list[dict[str, Any]], chosen: dict[str, Any] | None, grid: list[str], percent: bool
               ) -> dict[str, str]:
    """Recorded candidates' scores by their values of the table-wide ``grid`` keys (a label such as
    ``lr=0.03``): the score, or each of the method's own candidates under that value with its score
    (``mu=0.01: 31.20; mu=0.1: 29.00``); the ``chosen`` one in bold; ``diverged`` for a candidate whose
    loss diverged, ``-`` for one not scored yet."""
    cells: dict[str, list[str]] = {}
    for c in entries:
        values = c["values"]
        own = {k: v for k, v in values.items() if k not in grid}
        note = str(c.get("note", "-"))
        shown = _score_text(c.get("score"), percent) or ("diverged" if note.startswith("diverged") else note)
        text = f"{label(own)}: {shown}" if own else shown
        cells.setdefault(label({k: v for k, v in values.items() if k in grid}), []).append(
            f"**{text}**" if values == chosen else text)
    return {k: "; ".join(v) for k, v in cells.items()}


def grid_columns(entries: list[dict[str, Any]], grid: list[str]) -> list[str]:
    """The labels :func:`grid_cells` gives ``entries`` (recorded candidates, of any number of methods), in
    the order of their values of the ``grid`` keys, key by key: numbers ascending, so that a value an
    extension added sits beside its neighbours, other values as first seen."""
    seen: dict[str, dict[str, Any]] = {}
    for c in entries:
        values = {k: v for k, v in c["values"].items() if k in grid}
        seen.setdefault(label(values), values)
    first: dict[str, list[str]] = {}
    for values in seen.values():
        for k, v in values.items():
            if not _numeric(v) and repr(v) not in first.setdefault(k, []):
                first[k].append(repr(v))

    def rank(values: dict[str, Any]) -> tuple[tuple[int, float], ...]:
        return tuple((2, 0.0) if k not in values else (0, float(values[k])) if _numeric(values[k])
                     else (1, float(first[k].index(repr(values[k])))) for k in grid)
    return sorted(seen, key=lambda name: rank(seen[name]))


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _score_text(score: Any, percent: bool) -> str | None:
    """A candidate's recorded score as shown (None: it has none)."""
    if not isinstance(score, (int, float)):
        return None
    return f"{100 * score:.2f}" if percent else f"{score:.4g}"


def search_digest(identities: list[dict[str, Any]], select: results.Metric) -> str:
    return digest({"runs": sorted(digest(i) for i in identities), "select": select.to_spec()})


class ChoiceBook:
    """The ``choices.yaml`` of a table's run folder: every choice made, by (setting, method, search)."""

    def __init__(self, root: Path) -> None:
        self.path = root / CHOICES
        self.entries: list[dict[str, Any]] = self._read()

    def _read(self) -> list[dict[str, Any]]:
        try:
            data = safe_yaml.read(self.path)
        except FileNotFoundError:
            return []
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{self.path} cannot be read ({exc}); remove it to search again") from None
        if data is None:
            return []
        keys = {"setting", "method", "search", "chosen"}
        if not isinstance(data, list) or not all(isinstance(e, dict) and keys <= set(e) for e in data):
            raise ConfigError(f"{self.path} is not a list of choices (setting, method, search, chosen); remove it to "
                              f"search again")
        return data

    def find(self, setting: str, method: str, search: str) -> SearchChoice | None:
        for e in self.entries:
            if (e["setting"], e["method"], e["search"]) == (setting, method, search):
                return SearchChoice(setting, method, search, dict(e["chosen"]), e)
        return None

    def add(self, setting: str, method: str, search: str, chosen: dict[str, Any], tuning: Tuning,
            candidates: list[Candidate], table_root: Path, extended: list[str] | None = None) -> SearchChoice:
        record = {
            "setting": setting, "method": method, "search": search, "chosen": chosen,
            "select": tuning.select.to_spec(), "seeds": list(tuning.seeds), "rounds": tuning.rounds,
            "candidates": [{**c.entry(),
                            "runs": [str(r.relative_to(table_root)) if r.is_relative_to(table_root) else str(r)
                                     for r in c.runs]}
                           for c in candidates],
            "chosen_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **({"extended": list(extended)} if extended else {}),
        }
        self.entries = [e for e in self.entries
                        if (e["setting"], e["method"], e["search"]) != (setting, method, search)]
        self.entries.append(record)
        return SearchChoice(setting, method, search, dict(chosen), record)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, yaml.safe_dump(self.entries, sort_keys=False))
