"""What a run's records say: final, best and last-k accuracy, rounds to a target, forgetting.

One place computes these numbers from the rows of ``metrics.jsonl`` (one per round; the
evaluated rounds carry ``test_acc``, ``test_loss`` and ``per_class_acc``): the server when it
writes ``summary.json``, and the table summary and the report when they read a run directory.

A table declares the metric its paper reports (:class:`Metric`), either as a string, a
``summary.json`` key or a metrics column (its last value), or as a mapping::

    metric: {kind: final | best | last_k, k: 5, column: test_acc, rounds_to: [0.65, 0.9], forgetting: true}
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpifed.evaluation import forgetting as forgetting_of

KINDS = ("final", "best", "last_k")


class MetricError(ValueError):
    """A table's ``metric`` entry is malformed."""


@dataclass(frozen=True)
class Metric:
    """The number a table reports per run, and the extra columns it asks for.

    ``kind``: ``final`` (the last evaluation), ``best`` (the highest over the evaluations),
    ``last_k`` (the mean of the last ``k`` evaluations), or ``key`` (a string metric: a
    ``summary.json`` key, else the last value of that metrics column). ``column`` is the metrics
    column the kinds read (``test_acc``; ``group_mean_acc`` for per-domain means).
    ``rounds_to``: targets whose T(target) gets a column each; ``forgetting``: a column of
    FedNTD's forgetting (Eq. 5)."""

    kind: str = "final"
    column: str = "test_acc"
    k: int = 5
    rounds_to: tuple[float, ...] = ()
    forgetting: bool = False

    @staticmethod
    def parse(spec: Any) -> "Metric":
        """A table file's ``metric``: a string or a mapping (see the module docstring)."""
        if isinstance(spec, str):
            return Metric(kind="key", column=spec)
        if not isinstance(spec, dict):
            raise MetricError(f"metric must be a string (a summary.json key) or a mapping like "
                              f"{{kind: final, rounds_to: [0.65]}}, got {spec!r}")
        unknown = set(spec) - {"kind", "column", "k", "rounds_to", "forgetting"}
        if unknown:
            raise MetricError(f"metric: unknown keys {', '.join(sorted(unknown))}; allowed: kind, column, k, rounds_to, forgetting")
        kind = spec.get("kind", "final")
        if kind not in KINDS:
            raise MetricError(f"metric.kind {kind!r} is not one of {', '.join(KINDS)}")
        k = spec.get("k", 5)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise MetricError(f"metric.k must be a whole number >= 1, got {k!r}")
        targets = spec.get("rounds_to", [])
        if isinstance(targets, (int, float)):
            targets = [targets]
        if not isinstance(targets, list) or not all(isinstance(t, (int, float)) and 0 < t <= 1 for t in targets):
            raise MetricError(f"metric.rounds_to must be a list of accuracy fractions in (0, 1] (65% is 0.65), got {targets!r}")
        if not isinstance(spec.get("forgetting", False), bool):
            raise MetricError(f"metric.forgetting must be true or false, got {spec['forgetting']!r}")
        return Metric(kind, str(spec.get("column", "test_acc")), k, tuple(float(t) for t in targets),
                      spec.get("forgetting", False))

    @property
    def label(self) -> str:
        """The metric's name in a table header, e.g. ``best test_acc`` or ``mean of last 5 test_acc``."""
        if self.kind == "key":
            return self.column
        if self.kind == "last_k":
            return f"mean of last {self.k} {self.column}"
        return f"{self.kind} {self.column}"


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of a run's metrics.jsonl (a line cut short by a crash is skipped)."""
    try:
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
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
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def evaluations(rows: list[dict[str, Any]], column: str = "test_acc") -> list[tuple[int, float]]:
    """(round, value) of every row that holds ``column``, in round order."""
    return [(int(r.get("round", 0)), r[column]) for r in rows if r.get(column) is not None]


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


def forgetting(rows: list[dict[str, Any]]) -> float | None:
    """FedNTD's forgetting (Eq. 5) over the evaluations' per-class accuracies."""
    return forgetting_of([r["per_class_acc"] for r in rows if r.get("per_class_acc") is not None])


def target_key(target: float) -> str:
    """How summary.json names a target: ``0.65``."""
    return f"{target:g}"


def value(metric: Metric, rows: list[dict[str, Any]], summary: dict[str, Any]) -> float | None:
    """The run's number in ``metric``."""
    if metric.kind == "key":
        return summary[metric.column] if summary.get(metric.column) is not None else final(rows, metric.column)
    if metric.kind == "best":
        return best(rows, metric.column)[0]
    if metric.kind == "last_k":
        return last_k(rows, metric.k, metric.column)
    return final(rows, metric.column)


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

    def text(self, digits: int = 2, missing_word: str = "no result") -> str:
        """``71.29 ± 0.35 (n=3)``; with values missing, how many; ``-`` for an empty cell."""
        if not self.values:
            return f"{missing_word} (n={self.missing})" if self.missing else "-"
        spread = f" ± {self.std:.{digits}f}" if self.std is not None else ""
        note = f"; {missing_word} in {self.missing}" if self.missing else ""
        return f"{self.mean:.{digits}f}{spread} (n={self.n}{note})"
