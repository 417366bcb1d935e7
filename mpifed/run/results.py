"""What a run's records say: final, best and last-k accuracy, rounds to a target, forgetting.

One place computes these numbers from the rows of ``metrics.jsonl`` (one per round; the
evaluated rounds carry ``test_acc``, ``test_loss`` and ``per_class_acc``): the server when it
writes ``summary.json``, and the table summary and the report when they read a run directory.

A table declares its metric (:class:`Metric`), either as a string, a ``summary.json`` key or
a metrics column (its last value), or as a mapping::

    metric: {kind: final | best | last_k | at_best, k: 5, column: test_acc, select: val_acc,
             rounds_to: [0.65, 0.9], forgetting: true, at_rounds: [10, 50], groups: true,
             time_to: [0.65], at_times: [3600]}

``time_to`` and ``at_times`` read the simulated clock (``sim_clock``, a run with ``system.clock``):
the simulated seconds to reach a target, and ``column`` at a simulated time.

``at_best`` reads ``column`` at the evaluation where ``select`` (the validation accuracy) is
highest: the honest form of "best accuracy", which ``best`` takes from the test set itself.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpifed.local.evaluation import forgetting as forgetting_of
from mpifed.files.nofollow import LinkRefused, read_text
from mpifed.run.rundir import METRICS

KINDS = ("final", "best", "last_k", "at_best")
KEYS = ("kind", "column", "k", "select", "rounds_to", "forgetting", "at_rounds", "groups", "time_to", "at_times")


class MetricError(ValueError):
    """A table's ``metric`` entry is malformed."""


# statistics of the clients' held-out accuracies (mpifed.local.evaluation.client_figures): a metrics row's
# client_acc and summary.json's final_client_acc map each to a number
CLIENT_STATS = {"mean": "the mean over clients", "median": "the median client", "min": "the worst client",
                "std": "the spread over clients",
                "worst10": "the unweighted mean of the lowest ceil(n/10) clients' held-out accuracies"}
PER_CLIENT = ("client_acc", "final_client_acc")


def entry(row: dict[str, Any], column: str) -> Any:
    """``row[column]``; a dotted column reads into a mapping (``client_acc.worst10``); None where absent."""
    if column in row:
        return row[column]
    found: Any = row
    for part in column.split("."):
        if not isinstance(found, dict):
            return None
        found = found.get(part)
    return found


def _check_column(column: str) -> None:
    """A per-client accuracy names one of its statistics (``final_client_acc.worst10``)."""
    base, _, stat = column.partition(".")
    if base in PER_CLIENT and stat not in CLIENT_STATS:
        choices = "; ".join(f"{base}.{k}: {v}" for k, v in CLIENT_STATS.items())
        what = f"{column!r} names no statistic of it" if stat else f"{base!r} is a mapping of statistics"
        raise MetricError(f"metric: {what}, one number per run is needed: {choices}")


@dataclass(frozen=True)
class Metric:
    """The number a table reports per run, and the extra columns it asks for.

    ``kind``: ``final`` (the last evaluation), ``best`` (the highest over the evaluations:
    chosen on the very numbers it reports), ``last_k`` (the mean of the last ``k``
    evaluations), ``at_best`` (the evaluation where ``select`` is highest, first on ties), or
    ``key`` (a string metric: a ``summary.json`` key, else the last value of that metrics
    column). ``column`` is the metrics column the kinds read (``test_acc``; ``group_mean_acc``
    for per-domain means). ``rounds_to``: targets whose T(target) gets a column each;
    ``forgetting``: a column of FedNTD's forgetting (Eq. 5); ``at_rounds``: a column each with
    ``column`` at those rounds (the last evaluation at or before it); ``groups``: a column per
    group (domain) with its accuracy at the evaluation(s) the kind reads. ``time_to``: targets whose
    simulated seconds to reach them get a column each; ``at_times``: a column each with ``column`` at
    those simulated seconds (runs on the virtual clock, docs/federations.md)."""

    kind: str = "final"
    column: str = "test_acc"
    k: int = 5
    rounds_to: tuple[float, ...] = ()
    forgetting: bool = False
    select: str = "val_acc"
    at_rounds: tuple[int, ...] = ()
    groups: bool = False
    time_to: tuple[float, ...] = ()
    at_times: tuple[float, ...] = ()

    @staticmethod
    def parse(spec: Any) -> "Metric":
        """A table file's ``metric``: a string or a mapping (see the module docstring)."""
        if isinstance(spec, str):
            _check_column(spec)
            return Metric(kind="key", column=spec)
        if not isinstance(spec, dict):
            raise MetricError(f"metric must be a string (a summary.json key) or a mapping like "
                              f"{{kind: final, rounds_to: [0.65]}}, got {spec!r}")
        unknown = set(spec) - set(KEYS)
        if unknown:
            raise MetricError(f"metric: unknown keys {', '.join(sorted(map(str, unknown)))}; allowed: "
                              f"{', '.join(KEYS)}")
        kind = spec.get("kind", "final")
        if kind not in KINDS:
            raise MetricError(f"metric.kind {kind!r} is not one of {', '.join(KINDS)}")
        k = spec.get("k", 5)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise MetricError(f"metric.k must be a whole number >= 1, got {k!r}")
        targets, time_targets = (_fractions(spec, key) for key in ("rounds_to", "time_to"))
        times = spec.get("at_times", [])
        times = [times] if isinstance(times, (int, float)) and not isinstance(times, bool) else times
        if not isinstance(times, list) or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0
                                                  for t in times):
            raise MetricError(f"metric.at_times must be a list of simulated seconds above 0, e.g. [3600], got "
                              f"{times!r}")
        for flag in ("forgetting", "groups"):
            if not isinstance(spec.get(flag, False), bool):
                raise MetricError(f"metric.{flag} must be true or false, got {spec[flag]!r}")
        at_rounds = spec.get("at_rounds", [])
        if isinstance(at_rounds, int) and not isinstance(at_rounds, bool):
            at_rounds = [at_rounds]
        if not isinstance(at_rounds, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1
                                                      for r in at_rounds):
            raise MetricError("metric.at_rounds must be a list of round numbers >= 1, e.g. [10, 20, 50], got "
                              f"{at_rounds!r}")
        select = spec.get("select", "val_acc")
        if not isinstance(select, str) or not select:
            raise MetricError(f"metric.select must be a metrics column such as val_acc, got {select!r}")
        _check_column(str(spec.get("column", "test_acc")))
        return Metric(kind, str(spec.get("column", "test_acc")), k, tuple(float(t) for t in targets),
                      spec.get("forgetting", False), select, tuple(at_rounds), spec.get("groups", False),
                      tuple(float(t) for t in time_targets), tuple(float(t) for t in times))

    def to_spec(self) -> dict[str, Any] | str:
        """The table-file form of this metric (what :meth:`parse` reads back)."""
        if self.kind == "key":
            return self.column
        spec: dict[str, Any] = {"kind": self.kind, "column": self.column}
        if self.kind == "last_k":
            spec["k"] = self.k
        if self.kind == "at_best":
            spec["select"] = self.select
        for name, value in (("rounds_to", list(self.rounds_to)), ("at_rounds", list(self.at_rounds)),
                            ("forgetting", self.forgetting), ("groups", self.groups), ("time_to", list(self.time_to)),
                            ("at_times", list(self.at_times))):
            if value:
                spec[name] = value
        return spec

    @property
    def chosen_on_test(self) -> bool:
        """Whether the metric picks its evaluation by the very test numbers it reports (``best`` on a
        test column): optimistic, to be reported beside an honest metric, never used to choose."""
        return self.kind == "best" and self.column.startswith("test")

    @property
    def label(self) -> str:
        """The metric's name in a table header, e.g. ``best test_acc`` or ``mean of last 5 test_acc``."""
        if self.kind == "key":
            return self.column
        if self.kind == "last_k":
            return f"mean of last {self.k} {self.column}"
        if self.kind == "at_best":
            return f"{self.column} at best {self.select}"
        return f"{self.kind} {self.column}"

    @property
    def columns(self) -> list[str]:
        """The names of the columns this metric gives a table (the metric first)."""
        return ([self.label] + [f"T({100 * t:g}%)" for t in self.rounds_to] + [f"round {r}" for r in self.at_rounds]
                + (["forgetting"] if self.forgetting else []) + [f"T({100 * t:g}%) sim s" for t in self.time_to]
                + [f"at {t:g} sim s" for t in self.at_times])


def read_rows(run_dir: Path, name: str = METRICS) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl (or another JSON-lines file of it, such as clients.jsonl; a
    line cut short by a crash is skipped)."""
    try:
        lines = read_text(Path(run_dir) / name).splitlines()
    except (FileNotFoundError, LinkRefused, UnicodeDecodeError):
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file (summary.json, status.json); empty when absent or unreadable."""
    try:
        data = json.loads(read_text(Path(path)))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def evaluations(rows: list[dict[str, Any]], column: str = "test_acc") -> list[tuple[int, float]]:
    """(round, value) of every row that holds ``column``, in round order."""
    return [(int(r.get("round", 0)), v) for r in rows if (v := entry(r, column)) is not None]


def final(rows: list[dict[str, Any]], column: str = "test_acc") -> float | None:
    found = evaluations(rows, column)
    return found[-1][1] if found else None


def best(rows: list[dict[str, Any]], column: str = "test_acc") -> tuple[float, int] | tuple[None, None]:
    """The highest value of ``column`` and the first round that reached it."""
    found = evaluations(rows, column)
    if not found:
        return None, None
    top = max(v for _, v in found)
    return top, next(r for r, v in found if v == top)


def last_k(rows: list[dict[str, Any]], k: int, column: str = "test_acc") -> float | None:
    """The mean of the last ``k`` evaluations (fewer when the run evaluated fewer times)."""
    found = evaluations(rows, column)[-k:]
    return statistics.fmean(v for _, v in found) if found else None


def rounds_to(rows: list[dict[str, Any]], target: float, column: str = "test_acc") -> int | None:
    """T(target): the first evaluated round whose ``column`` is at least ``target``; None: not reached."""
    return next((r for r, v in evaluations(rows, column) if v >= target), None)


def time_to(rows: list[dict[str, Any]], target: float, column: str = "test_acc") -> float | None:
    """The simulated seconds (``sim_clock``) of the first evaluation whose ``column`` is at least
    ``target``; None: not reached, or a run without the virtual clock."""
    return next((r["sim_clock"] for r in rows if "sim_clock" in r and (v := entry(r, column)) is not None
                 and v >= target), None)


def at_time(rows: list[dict[str, Any]], seconds: float, column: str = "test_acc") -> float | None:
    """``column`` at simulated time ``seconds``: its last evaluation whose ``sim_clock`` is at or before
    it (None: none yet, or a run without the virtual clock)."""
    found = [v for r in rows if r.get("sim_clock", float("inf")) <= seconds and (v := entry(r, column)) is not None]
    return found[-1] if found else None


def forgetting(rows: list[dict[str, Any]]) -> float | None:
    """FedNTD's forgetting (Eq. 5) over the evaluations' per-class accuracies."""
    return forgetting_of([r["per_class_acc"] for r in rows if r.get("per_class_acc") is not None])


def target_key(target: float) -> str:
    """How summary.json names a target: ``0.65``."""
    return f"{target:g}"


def at_best(rows: list[dict[str, Any]], select: str = "val_acc",
            column: str = "test_acc") -> tuple[float, int] | tuple[None, None]:
    """``column`` at the first evaluation where ``select`` is highest, and that round."""
    chosen = _selected_row(rows, select, column)
    return (entry(chosen, column), int(chosen.get("round", 0))) if chosen is not None else (None, None)


def _fractions(spec: dict[str, Any], key: str) -> list[float]:
    """A metric's list of accuracy targets (``rounds_to``, ``time_to``), checked."""
    targets = spec.get(key, [])
    if isinstance(targets, (int, float)):
        targets = [targets]
    if not isinstance(targets, list) or not all(isinstance(t, (int, float)) and 0 < t <= 1 for t in targets):
        raise MetricError(f"metric.{key} must be a list of accuracy fractions in (0, 1] (65% is 0.65), got "
                          f"{targets!r}")
    return targets


def at_round(rows: list[dict[str, Any]], rnd: int, column: str = "test_acc") -> float | None:
    """``column`` at round ``rnd``: its last evaluation at or before that round (None: none yet)."""
    found = [v for r, v in evaluations(rows, column) if r <= rnd]
    return found[-1] if found else None


def _selected_row(rows: list[dict[str, Any]], select: str, column: str) -> dict[str, Any] | None:
    both = [r for r in rows if entry(r, select) is not None and entry(r, column) is not None]
    if not both:
        return None
    top = max(entry(r, select) for r in both)
    return next(r for r in both if entry(r, select) == top)


def value(metric: Metric, rows: list[dict[str, Any]], summary: dict[str, Any]) -> float | None:
    """The run's number in ``metric``."""
    if metric.kind == "key":
        found = entry(summary, metric.column)
        return found if found is not None else final(rows, metric.column)
    if metric.kind == "best":
        return best(rows, metric.column)[0]
    if metric.kind == "last_k":
        return last_k(rows, metric.k, metric.column)
    if metric.kind == "at_best":
        return at_best(rows, metric.select, metric.column)[0]
    return final(rows, metric.column)


def group_values(metric: Metric, rows: list[dict[str, Any]]) -> dict[str, float]:
    """Each group's (domain's) accuracy at the evaluation(s) ``metric`` reads: the last one
    (final, key), the one with the best ``column`` (best) or ``select`` (at_best), or the mean
    over the last k (last_k)."""
    evaluated = [r for r in rows if r.get("per_group_acc") and r.get(metric.column) is not None]
    if not evaluated:
        return {}
    if metric.kind == "last_k":
        chosen = evaluated[-metric.k:]
    elif metric.kind == "best":
        top = max(r[metric.column] for r in evaluated)
        chosen = [next(r for r in evaluated if r[metric.column] == top)]
    elif metric.kind == "at_best":
        row = _selected_row(evaluated, metric.select, metric.column)
        chosen = [row] if row is not None else []
    else:
        chosen = evaluated[-1:]
    names = list(dict.fromkeys(name for r in chosen for name in r["per_group_acc"]))
    return {name: statistics.fmean(r["per_group_acc"][name] for r in chosen if name in r["per_group_acc"])
            for name in names}


@dataclass
class Stat:
    """A table cell: the values of the runs that have one; ``missing`` runs have none (e.g. a
    target not reached)."""

    values: list[float]
    missing: int = 0

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def std(self) -> float | None:
        """The sample standard deviation (n - 1); None for fewer than two values."""
        return statistics.stdev(self.values) if len(self.values) > 1 else None

    def text(self, digits: int = 2, missing_word: str = "no result", declared: int | None = None) -> str:
        """``71.29 ± 0.35 (n=3)``; with values missing, how many; ``(n=3 of 5)`` when fewer runs than
        the ``declared`` seeds have finished; ``-`` for an empty cell."""
        of = f" of {declared}" if declared and self.n + self.missing < declared else ""
        if not self.values:
            return f"{missing_word} (n={self.missing}{of})" if self.missing else "-"
        spread = f" ± {self.std:.{digits}f}" if self.std is not None else ""
        note = f"; {missing_word} in {self.missing}" if self.missing else ""
        return f"{self.mean:.{digits}f}{spread} (n={self.n}{of}{note})"
