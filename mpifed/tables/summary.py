"""A table of results from run directories: each cell's mean ± sample std over seeds, each method
against a reference seed by seed (:mod:`mpifed.tables.stats`), the claims declared for the table, each
labelled by its interval and Holm's adjustment over them all, and notes on how far the numbers can
be trusted (the machines the runs come from, test subsets, metrics that choose on the test set).

:mod:`mpifed.tables.summarize` builds one from a table file's finished runs; :mod:`mpifed.tables.report_tables` from
folders of runs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from mpifed.run import provenance, results
from mpifed.tables.stats import Paired, holm, paired, smallest_sign_flip_p
from mpifed.run.record import RunRecord

ALPHA = 0.05


@dataclass(frozen=True)
class Claim:
    """The claim that ``above`` ends higher than ``below`` in the table's metric, declared before any run."""

    above: str
    below: str

    @classmethod
    def parse(cls, text: object) -> Claim:
        """``"fedgkd > fedavg"`` or ``"moon < fedavg"``; ValueError says what is wrong."""
        found = re.fullmatch(r"\s*([^\s<>]+)\s*([<>])\s*([^\s<>]+)\s*", text) if isinstance(text, str) else None
        if found is None:
            raise ValueError(f"a claim is 'method > method' (or '<'), e.g. 'fedgkd > fedavg', got {text!r}")
        a, sign, b = found.groups()
        return cls(a, b) if sign == ">" else cls(b, a)

    def __str__(self) -> str:
        return f"{self.above} > {self.below}"


@dataclass(frozen=True)
class Tested:
    """One claim in one setting: its paired comparison (None: fewer than 2 common seeds) and its
    Holm-adjusted p over every claim of the table in every setting."""

    claim: Claim
    setting: str
    result: Paired | None
    holm_p: float
    needs: int | None = None      # the seeds the table declares its claims need (claim_seeds)
    unpaired: str = ""            # why its two methods' runs were not paired (e.g. other machines)
    not_a_test: str = ""          # why the table declares that the claim tests nothing in this setting

    @property
    def label(self) -> str:
        return self.labelled(self.holm_p)

    def labelled(self, holm_p: float) -> str:
        """Its label with ``holm_p`` as its adjusted p (the table's, or the report-wide family's)."""
        return claim_label(self.result, holm_p, self.needs, self.unpaired, self.not_a_test)


def claim_label(result: Paired | None, holm_p: float, needs: int | None = None, unpaired: str = "",
                not_a_test: str = "") -> str:
    """A claim's label from its paired comparison and its Holm-adjusted p. Where the table declares
    the seeds its claims ``needs``, a claim paired over fewer is not tested yet, and one supported at
    a seed count whose exact sign-flip p cannot go below 0.05 says that it rests on the t-test alone;
    a claim in a setting the table declares ``not_a_test`` is labelled so, whatever its interval."""
    if not_a_test:
        return f"not a test: {not_a_test}"
    if unpaired:
        return f"not paired: {unpaired}"
    if result is None:
        return "no result (fewer than 2 common seeds in the runs summarised)"
    if needs is not None and result.n < needs:
        return f"not tested yet: {result.n} of the {needs} seeds its claims need"
    if result.verdict == "higher":
        if holm_p >= ALPHA:
            return "supported by its interval alone, not after Holm"
        if needs is not None and smallest_sign_flip_p(result.n) >= ALPHA:
            return (f"supported, by the t-test's normality alone ({result.n} seeds cannot reach a sign-flip "
                    f"p < {ALPHA})")
        return "supported"
    if result.verdict == "lower":
        if holm_p < ALPHA:
            return "not supported (the other way)"
        return "the other way by its interval alone, not after Holm"
    return "inconclusive"


def check_claims(claims: list[Claim], settings: list[str], values: dict[tuple[str, str], dict[int, float]],
                 needs: int | None = None, conflict: "Conflict | None" = None,
                 not_a_test: dict[str, str] | None = None) -> list[Tested]:
    """Each claim in each setting from the values by seed per (setting, method); the family for
    Holm's adjustment is all of them, those without results counting with p = 1 (``needs``: the
    seeds the table declares its claims need; ``conflict``: why two methods' runs cannot be paired;
    ``not_a_test``: settings whose claims test nothing, with why: in the family, labelled so)."""
    why = {(c, s): (conflict(s, c.above, c.below) if conflict else None) or "" for c in claims for s in settings}
    compared = [(c, s, None if why[(c, s)] else paired(values.get((s, c.above), {}), values.get((s, c.below), {})))
                for c in claims for s in settings]
    adjusted = holm([r.p if r is not None else 1.0 for _, _, r in compared])
    void = not_a_test or {}
    return [Tested(c, s, r, q, needs, why[(c, s)], void.get(s, "")) for (c, s, r), q in zip(compared, adjusted)]


COUNTED = (("supported", lambda label: label.startswith("supported") and "not after Holm" not in label),
           ("the other way", lambda label: label.startswith("not supported (the other way)")),
           ("by their interval alone, not after Holm", lambda label: "not after Holm" in label),
           ("inconclusive", lambda label: label == "inconclusive"),
           ("not a test", lambda label: label.startswith("not a test")))


def label_counts(labels: list[str]) -> str:
    """How many of ``labels`` say what: ``10 supported (3 by the t-test's normality alone), 1 the
    other way, ...``, each kind once, in :data:`COUNTED`'s order, then the rest (not tested yet, not
    paired, no result)."""
    parts = []
    for kind, test in COUNTED:
        found = [label for label in labels if test(label)]
        if found:
            alone = sum("normality alone" in label for label in found)
            parts.append(f"{len(found)} {kind}" + (f" ({alone} by the t-test's normality alone)" if alone else ""))
    rest = sum(not any(test(label) for _, test in COUNTED) for label in labels)
    return ", ".join(parts + ([f"{rest} not tested (no result, not paired or too few seeds)"] if rest else []))


@dataclass
class Summary:
    """The cells of a table (setting, method, column) -> Stat, the paired comparisons
    (setting, method) -> Paired against the reference, and the runs left out, with why."""

    title: str
    metric: results.Metric
    settings: list[str]
    methods: list[str]
    columns: list[str]
    cells: dict[tuple[str, str, str], results.Stat]
    left_out: list[str]
    not_run: int
    percent: bool
    paired: dict[tuple[str, str], Paired | None] = field(default_factory=dict)
    reference: str | None = None
    declared_seeds: int | None = None
    notes: list[str] = field(default_factory=list)
    claims: list[Tested] = field(default_factory=list)
    by_seed: dict[tuple[str, str], dict[int, float]] = field(default_factory=dict)   # the metric per seed
    family: int = 0                # the claims Holm's adjustment covers (the table's, whatever ``claims`` shows)
    counted: set[tuple[str, str, int]] = field(default_factory=set)   # (setting, method, seed) of diverged runs counted
    unpaired: dict[tuple[str, str], str] = field(default_factory=dict)   # (setting, method) left unpaired: why
    display: dict[str, str] = field(default_factory=dict)   # a method's name as printed, where not its label
    all_claims: list[Tested] = field(default_factory=list)   # every claim of the family (``claims``: those shown)
    report_holm: dict[int, float] = field(default_factory=dict)   # id of a shown claim -> its report-wide Holm p
    report_family: int = 0         # the claims of the report-wide family (see :func:`with_report_family`)
    local_work: list[tuple[str, float, float | None]] = field(default_factory=list)   # see :func:`local_work`

    def with_report_family(self, others: list["Summary"]) -> None:
        """Holm's adjustment once more, over this table's claims and those of the ``others`` (the
        tables of one report) together: each shown claim's report-wide p, beside the table's own."""
        everyone = [t for s in (self, *others) for t in s.all_claims]
        adjusted = dict(zip(map(id, everyone), holm([t.result.p if t.result is not None else 1.0 for t in everyone])))
        self.report_holm = {id(t): adjusted[id(t)] for t in self.claims}
        self.report_family = len(everyone)

    def name(self, method: str | None) -> str:
        """``method`` as the tables print it."""
        return self.display.get(method, method) if method is not None else ""

    def comparison_text(self, setting: str, method: str) -> str:
        """The method's paired comparison with the reference in ``setting``, or why there is none."""
        if (setting, method) in self.unpaired:
            return f"not paired: {self.unpaired[(setting, method)]}"
        found = self.paired.get((setting, method))
        return found.text() if found is not None else "fewer than 2 common seeds"

    def markdown(self) -> str:
        unit = " (%)" if self.percent else ""
        seeds = f" of {self.declared_seeds} declared" if self.declared_seeds else ""
        lines = [f"{self.title}: {self.metric.label}{unit}, mean ± sample std over finished seeds (n{seeds})", ""]
        heads = [s if len(self.columns) == 1 else f"{s}: {c}" for s in self.settings for c in self.columns]
        lines += ["| method | " + " | ".join(heads) + " |", "| --- |" + " --- |" * len(heads)]
        for m in self.methods:
            row = [self.cell_text(s, m, c) for s in self.settings for c in self.columns]
            lines.append(f"| {self.name(m)} | " + " | ".join(row) + " |")
        if self.reference is not None:
            points = " points" if self.percent else ""
            lines += ["", f"Against {self.name(self.reference)}, seed by seed ({self.metric.label}, difference "
                          f"in{points or ' its unit'}): "
                          f"mean [95% CI], seeds ahead / seeds, p of the two-sided paired t-test; 'higher' or 'lower' "
                          f"only where the interval excludes 0", ""]
            lines += ["| method | " + " | ".join(self.settings) + " |", "| --- |" + " --- |" * len(self.settings)]
            for m in self.methods:
                if m == self.reference:
                    continue
                row = [self.comparison_text(s, m) for s in self.settings]
                lines.append(f"| {self.name(m)} | " + " | ".join(row) + " |")
        if self.claims:
            lines += ["", f"The table's declared claims, each paired seed by seed in {self.metric.label}; "
                          f"Holm's adjustment over all {self.family} of them"
                          + (f" ({len(self.claims)} shown: this view's settings and methods)"
                             if len(self.claims) < self.family else "")
                          + f", 'supported' where the interval excludes 0 "
                          f"in the claim's direction and the adjusted p < {ALPHA}; the last column tests the same "
                          f"difference without the t-test's normality, by the exact sign-flip p (unadjusted), and "
                          f"gives the bootstrap's 95% range of the mean (a description, not a test)"
                          + (f"; the report's columns adjust over all {self.report_family} claims of the report's "
                             f"tables (--family)" if self.report_holm else "")
                          + (f"; the table declares that its claims need {self.claims[0].needs} seeds (claim_seeds)"
                             if self.claims[0].needs else ""), ""]
            lines += self.claims_table()
            lines += ["", f"Labels of the {len(self.claims)} claims shown, after the table's Holm adjustment: "
                          f"{label_counts([t.label for t in self.claims])}."]
            if self.report_holm:
                lines.append(f"After the report-wide adjustment: "
                             f"{label_counts([t.labelled(self.report_holm[id(t)]) for t in self.claims])}.")
        if self.notes:
            lines += [""] + self.notes
        if self.not_run:
            lines += ["", f"Not run yet: {self.not_run} of the table's runs."]
        if self.left_out:
            lines += ["", f"Left out ({len(self.left_out)}):"] + [f"  {line}" for line in self.left_out]
        return "\n".join(lines)

    def claims_table(self) -> list[str]:
        """The shown claims as markdown lines, a row each: the difference, the table's Holm p and label,
        the report-wide ones where :meth:`with_report_family` gave them, the test without normality."""
        wide = " report-wide Holm p | report-wide label |" if self.report_holm else ""
        lines = ["| claim | setting | difference [95% CI], seeds ahead, p | Holm p | label |" + wide
                 + " without normality |", "| --- | --- | --- | --- | --- |" + " --- |" * (3 if wide else 1)]
        for t in self.claims:
            shown = t.result.text(verdict=False) if t.result is not None else "-"
            free = t.result.distribution_free() if t.result is not None else "-"
            claim = f"{self.name(t.claim.above)} > {self.name(t.claim.below)}"
            report = f" {self.report_holm[id(t)]:.3f} | {t.labelled(self.report_holm[id(t)])} |" \
                if self.report_holm else ""
            lines.append(f"| {claim} | {t.setting} | {shown} | {t.holm_p:.3f} | {t.label} |{report} {free} |")
        return lines

    def seed_tables(self) -> str:
        """Per setting with results, each method's metric seed by seed, and each method minus the
        reference on the seeds both have, with the paired interval (the rows a report quotes)."""
        unit = " (%)" if self.percent else ""
        out: list[str] = []
        for s in self.settings:
            seeds = sorted({seed for m in self.methods for seed in self.by_seed.get((s, m), {})})
            if not seeds:
                continue
            lines = [f"{s}, seed by seed: {self.metric.label}{unit}", "",
                     "| method | " + " | ".join(f"s{seed}" for seed in seeds) + " | mean ± sd |",
                     "| --- |" + " --- |" * (len(seeds) + 1)]
            for m in self.methods:
                got = self.by_seed.get((s, m), {})
                cells = [f"{got[seed]:.2f}" + (" (diverged)" if (s, m, seed) in self.counted else "")
                         if seed in got else "-" for seed in seeds]
                lines.append(f"| {self.name(m)} | " + " | ".join(cells)
                             + f" | {results.Stat(list(got.values())).text(2)} |")
            ref = self.by_seed.get((s, self.reference), {}) if self.reference is not None else {}
            for m in self.methods:
                if m == self.reference or self.reference is None:
                    continue
                got = {} if (s, m) in self.unpaired else self.by_seed.get((s, m), {})
                cells = [f"{got[seed] - ref[seed]:+.2f}" if seed in got and seed in ref else "-" for seed in seeds]
                lines.append(f"| {self.name(m)} − {self.name(self.reference)} | " + " | ".join(cells)
                             + f" | {self.comparison_text(s, m)} |")
            out.append("\n".join(lines))
        return "\n\n".join(out)

    def cell_text(self, setting: str, method: str, column: str) -> str:
        stat = self.cells.get((setting, method, column), results.Stat([]))
        if column.startswith("T("):
            return stat.text(1, "not reached", self.declared_seeds)
        return stat.text(2, declared=self.declared_seeds)


@dataclass
class Runs:
    """The run directories a table shows, (setting, method) -> runs, and what it says beside them."""

    groups: dict[tuple[str, str], list[Path]]
    left_out: list[str] = field(default_factory=list)        # the runs left out, each with why
    not_run: int = 0                                           # the table's runs not run yet
    starts: dict[Path, str] = field(default_factory=dict)    # each run's initial model, where known
    counted_at: dict[Path, float] = field(default_factory=dict)   # diverged runs counted at a value of the metric
    counted_why: str = "the table's declared value"
    mixed_machines: bool = False    # pair runs of one seed made on different machines (else: refused)


@dataclass
class ClaimFamily:
    """A table's declared claims, tested in each of ``settings`` on the runs of ``groups``: a view of
    part of a table passes the whole table's, so that Holm's adjustment covers every claim."""

    claims: list[Claim]
    settings: list[str]
    groups: dict[tuple[str, str], list[Path]]
    needs: int | None = None      # the table's claim_seeds
    not_a_test: dict[str, str] = field(default_factory=dict)   # the table's not_a_test: setting -> why


def tabulate(title: str, metric: results.Metric, shown: Runs, *, paper_metric: results.Metric | None = None,
             reference: str | None = None, declared_seeds: int | None = None, notes: list[str] | None = None,
             claims: ClaimFamily | None = None, paper_local_steps: dict[str, float] | None = None) -> Summary:
    """A table in ``metric`` (and ``paper_metric`` beside it) of the runs ``shown``, with each method's
    paired comparison against ``reference`` (a method label; default: the row whose algorithm is
    FedAvg, if any), and the ``claims`` whose setting and methods the table shows. A run of
    ``shown.counted_at`` (a diverged run, as the table declares or a sensitivity check asks) counts
    as the value given there in ``metric``, in the unit shown, and as missing in every other column;
    a note says so, and why. Where ``shown.starts`` describes each run's initial model, a method
    whose runs start from another model than the reference's in a setting is not paired with it
    (its seeds do not share their initialisation). ``paper_local_steps``: the paper's local steps per
    client a round, by setting (``*``: every setting), for the note on each setting's local work."""
    groups, counted_at = shown.groups, shown.counted_at
    percent = _in_points(metric)
    paper = paper_metric is not None and paper_metric != metric
    metrics = [(metric, "")] + ([(paper_metric, "paper: ")] if paper else [])
    runs = {path: _RunValues(path) for paths in groups.values() for path in paths}
    group_names = list(dict.fromkeys(name for m, _ in metrics if m.groups for rv in runs.values()
                                     for name in results.group_values(m, rv.rows)))
    columns = [f"{prefix}{c}" for m, prefix in metrics for c in _metric_columns(m, group_names)]
    cells = _cells(groups, runs, metrics, group_names, columns, counted_at, percent)
    primary = _primary_values(metric, groups, runs, counted_at)
    settings = list(dict.fromkeys(s for s, _ in groups))
    methods = list(dict.fromkeys(m for _, m in groups))
    reference = reference if reference is not None else _fedavg_row(groups, runs)
    conflict = (lambda s, a, b: None) if shown.mixed_machines else _conflicts(groups, runs)
    compared, unpaired = (_compared(groups, primary, reference, shown.starts, conflict) if reference is not None
                          else ({}, {}))
    work = local_work(groups, paper_local_steps)
    notes = (list(notes or []) + _provenance_notes(metric, paper_metric, runs)
             + _local_work_notes(work)
             + _counted_notes(metric, counted_at, shown.counted_why, runs))
    family = claims or ClaimFamily([], settings, groups)
    if family.groups is groups:
        values, family_conflict = primary, conflict
    else:       # the whole table's runs, each read once, for the claims of a view of part of it
        known = {path: runs.get(path) or _RunValues(path) for paths in family.groups.values() for path in paths}
        values = _primary_values(metric, family.groups, known, counted_at)
        family_conflict = conflict if shown.mixed_machines else _conflicts(family.groups, known)
    tested = check_claims(family.claims, family.settings or settings, values, family.needs, family_conflict,
                          family.not_a_test)
    on_view = [t for t in tested if t.setting in settings and {t.claim.above, t.claim.below} <= set(methods)]
    return Summary(title, metric, settings, methods, columns, cells, list(shown.left_out), shown.not_run, percent,
                   compared, reference if reference in methods else None, declared_seeds, notes, on_view, primary,
                   len(tested),
                   {(*key, runs[p].seed) for key, paths in groups.items() for p in paths if p in counted_at}, unpaired,
                   all_claims=tested, local_work=work)


def _cells(groups: dict[tuple[str, str], list[Path]], runs: dict[Path, "_RunValues"],
           metrics: list[tuple[results.Metric, str]], group_names: list[str], columns: list[str],
           counted_at: dict[Path, float], percent: bool) -> dict[tuple[str, str, str], results.Stat]:
    """Each (setting, method, column)'s values over its runs; a run counted at a value has it in the
    first column and is missing in the others."""
    cells: dict[tuple[str, str, str], results.Stat] = {}
    for (setting, method), paths in groups.items():
        stats = {c: cells.setdefault((setting, method, c), results.Stat([])) for c in columns}
        for path in paths:
            rv = runs[path]
            for m, prefix in metrics:
                for i, (column, v) in enumerate(zip(_metric_columns(m, group_names), rv.values(m, group_names))):
                    stat = stats[f"{prefix}{column}"]
                    if path in counted_at:
                        if i == 0 and not prefix:
                            stat.values.append(counted_at[path])
                        else:
                            stat.missing += 1
                    elif v is None:
                        stat.missing += 1
                    else:
                        stat.values.append(float(v) if column.startswith("T(") or not percent else 100 * v)
    return cells


Conflict = Callable[[str, str, str], "str | None"]


def _conflicts(groups: dict[tuple[str, str], list[Path]], runs: dict[Path, "_RunValues"]) -> Conflict:
    """For a setting and two methods: why their runs cannot be paired, seed by seed (a seed whose two
    runs were made on machines that differ, :func:`mpifed.run.provenance.hardware_conflict`), or None."""
    def by_seed(setting: str, method: str) -> dict[int, _RunValues]:
        return {runs[p].seed: runs[p] for p in groups.get((setting, method), []) if runs[p].seed is not None}

    def conflict(setting: str, a: str, b: str) -> str | None:
        mine, theirs = by_seed(setting, a), by_seed(setting, b)
        for seed in sorted(set(mine) & set(theirs)):
            differ = provenance.hardware_conflict(mine[seed].hardware, theirs[seed].hardware)
            if differ:
                return (f"seed {seed}'s runs of {a} and {b} come from different machines ({differ}), whose CPU "
                        f"numbers differ by more than rounding; re-run on one machine, or pass --mixed-machines to "
                        f"pair them anyway")
        return None
    return conflict


def _compared(groups: dict[tuple[str, str], list[Path]], primary: dict[tuple[str, str], dict[int, float]],
              reference: str, starts: dict[Path, str], conflict: Conflict
              ) -> tuple[dict[tuple[str, str], Paired | None], dict[tuple[str, str], str]]:
    """Each method's paired comparison with ``reference`` per setting, and the (setting, method)s left
    unpaired because their runs start from another initial model or come from other machines, with why."""
    compared, unpaired = {}, {}
    for s in dict.fromkeys(s for s, _ in groups):
        for m in dict.fromkeys(m for _, m in groups):
            if m == reference:
                continue
            mine, theirs = ({starts[p] for p in groups.get((s, k), []) if p in starts} for k in (m, reference))
            if starts and mine and theirs and mine != theirs:
                unpaired[(s, m)] = (f"its runs start from {' / '.join(sorted(mine))}, {reference}'s from "
                                    f"{' / '.join(sorted(theirs))}: the seeds do not share their initial model")
                continue
            why = conflict(s, m, reference)
            if why:
                unpaired[(s, m)] = why
                continue
            compared[(s, m)] = paired(primary.get((s, m), {}), primary.get((s, reference), {}))
    return compared, unpaired


def _primary_values(metric: results.Metric, groups: dict[tuple[str, str], list[Path]],
                    known: dict[Path, "_RunValues"], counted_at: dict[Path, float]
                    ) -> dict[tuple[str, str], dict[int, float]]:
    """The metric per seed of each (setting, method) of ``groups`` (in points where it is a fraction;
    a run of ``counted_at`` at its value there), reading only the runs ``known`` does not hold yet."""
    percent = _in_points(metric)
    out: dict[tuple[str, str], dict[int, float]] = {}
    for key, paths in groups.items():
        for path in paths:
            rv = known.get(path) or _RunValues(path)
            first = results.value(metric, rv.rows, rv.summary)
            if first is not None and percent:
                first *= 100
            if path in counted_at:
                first = counted_at[path]
            if first is not None and rv.seed is not None:
                out.setdefault(key, {})[rv.seed] = first
    return out


def _counted_notes(metric: results.Metric, counted_at: dict[Path, float], why: str,
                   shown: dict[Path, "_RunValues"]) -> list[str]:
    if not counted_at:
        return []
    values = " / ".join(f"{v:g}" for v in sorted(set(counted_at.values())))
    inside = sorted(p.name for p in counted_at if p in shown)
    outside = len(counted_at) - len(inside)
    return [f"Diverged runs counted as {values} in {metric.label} ({why}; missing in the other columns): "
            + (", ".join(inside) if inside else "none in this view")
            + (f"; {outside} more outside this view, in the claims' family" if outside else "") + "."]


def run_value(metric: results.Metric, path: Path) -> float | None:
    """One run's value in ``metric`` as a table shows it (in points where it is a fraction)."""
    record = RunRecord(path)
    value = results.value(metric, record.metrics(), record.summary)
    return value * 100 if value is not None and _in_points(metric) else value


def _in_points(metric: results.Metric) -> bool:
    return metric.kind != "key" or "acc" in metric.column or metric.column == "forgetting"


def _metric_columns(metric: results.Metric, group_names: list[str]) -> list[str]:
    columns = metric.columns
    return columns[:1] + (group_names if metric.groups else []) + columns[1:]


class _RunValues:
    """What a run directory says, read once: its rows, summary, seed, algorithm and test set."""

    def __init__(self, path: Path) -> None:
        self.path = path
        record = RunRecord(path)
        self.rows = record.metrics()
        self.summary = record.summary
        try:
            cfg = record.config or {}
        except (OSError, yaml.YAMLError):
            cfg = {}
        run, data, algorithm = (cfg.get(k) if isinstance(cfg.get(k), dict) else {}
                                for k in ("run", "data", "algorithm"))
        self.seed = run.get("seed") if isinstance(run.get("seed"), int) else None
        self.algorithm = algorithm.get("name")
        self.test_subset = data.get("test_subset") or 0
        found = provenance.read(path)
        self.machine = provenance.machine(found) if found else None
        self.hardware = provenance.hardware(found) if found else {}
        self.model = {**self.hardware, "cpu": frozenset(str(r["cpu"]) for seg in (found or {}).get("segments", [])
                                                        for r in seg.get("ranks", []) if r.get("cpu"))}

    def values(self, metric: results.Metric, group_names: list[str]) -> list[float | None]:
        out: list[float | None] = [results.value(metric, self.rows, self.summary)]
        if metric.groups:
            found = results.group_values(metric, self.rows)
            out += [found.get(name) for name in group_names]
        out += [results.rounds_to(self.rows, t, metric.column) for t in metric.rounds_to]
        out += [results.at_round(self.rows, r, metric.column) for r in metric.at_rounds]
        out += [results.forgetting(self.rows)] if metric.forgetting else []
        out += [results.time_to(self.rows, t, metric.column) for t in metric.time_to]
        out += [results.at_time(self.rows, t, metric.column) for t in metric.at_times]
        return out


def _fedavg_row(groups: dict[tuple[str, str], list[Path]], runs: dict[Path, _RunValues]) -> str | None:
    for (_, method), paths in groups.items():
        if method == "fedavg" or any(runs[p].algorithm == "fedavg" for p in paths):
            return method
    return None


def _local_steps(path: Path) -> tuple[int, int]:
    """A run's local steps summed over its clients' rounds, and the number of those (clients.jsonl)."""
    steps = count = 0
    for row in RunRecord(path).clients():
        clients = row.get("clients", []) if isinstance(row, dict) else []
        for c in clients if isinstance(clients, list) else []:
            if isinstance(c, dict) and isinstance(c.get("steps"), int):
                steps, count = steps + c["steps"], count + 1
    return steps, count


def local_work(groups: dict[tuple[str, str], list[Path]],
               paper: dict[str, float] | None) -> list[tuple[str, float, float | None]]:
    """Each setting's local steps per client a round (the mean over every client-round of its runs'
    clients.jsonl; settings without one left out), and the paper's where ``paper`` gives it."""
    found = []
    for setting in dict.fromkeys(s for s, _ in groups):
        totals = [_local_steps(p) for (s, _), paths in groups.items() if s == setting for p in paths]
        steps, count = sum(t[0] for t in totals), sum(t[1] for t in totals)
        if count:
            found.append((setting, steps / count, (paper or {}).get(setting, (paper or {}).get("*"))))
    return found


def _local_work_notes(work: list[tuple[str, float, float | None]]) -> list[str]:
    """The note on each setting's local steps, beside the paper's."""
    parts = [f"{setting} {mean:.1f}" + (f" (the paper's {theirs:g}: {mean / theirs:.2g}x)" if theirs else "")
             for setting, mean, theirs in work]
    if not parts:
        return []
    return [f"Local work, steps per client a round (the mean over every client-round of the runs' clients.jsonl): "
            f"{'; '.join(parts)}."]


def _provenance_notes(metric: results.Metric, paper_metric: results.Metric | None,
                      runs: dict[Path, "_RunValues"]) -> list[str]:
    notes = []
    subsets = sorted({rv.test_subset for rv in runs.values() if rv.test_subset})
    if subsets:
        notes.append(f"Test set: a subset ({' / '.join(map(str, subsets))} samples) in "
                     f"{sum(1 for rv in runs.values() if rv.test_subset)} of {len(runs)} runs: quick runs only, not "
                     f"numbers to report (data.test_subset=0 evaluates the whole test set).")
    machines = sorted({rv.machine for rv in runs.values() if rv.machine})
    unknown = sum(1 for rv in runs.values() if not rv.machine)
    kinds = list({tuple(sorted(rv.model.items())): rv.model for rv in runs.values() if rv.machine}.values())
    differ = [(a, b) for i, a in enumerate(kinds) for b in kinds[i + 1:]
              if provenance.hardware_conflict(a, b) is not None or (a["cpu"] and b["cpu"] and a["cpu"] != b["cpu"])]
    if len(machines) > 1 and not differ:
        notes.append(f"Machine model: one, as far as the runs record it ({'; '.join(machines)}): the lines differ "
                     f"only where a run does not record a field (host names, or a CPU identity from before mpifed "
                     f"recorded it), not in a CPU, BLAS, GPU or torch that two runs both record.")
    elif len(machines) > 1:
        notes.append(f"WARNING: these runs come from {len(machines)} machines, and CPU runs differ by more than "
                     f"rounding across machines: compare methods on runs of one machine ({'; '.join(machines)}). "
                     f"Two runs of one seed whose CPU, BLAS, GPU or torch differ are not paired (--mixed-machines "
                     f"pairs them).")
        unchecked = sum(1 for rv in runs.values() if rv.machine and not rv.hardware.get("cpu_id"))
        if unchecked:
            notes.append(f"{unchecked} of {len(runs)} runs record no CPU family, model and flags (made before mpifed "
                         f"recorded them): whether they share a machine with the others cannot be checked, so they "
                         f"are paired with them.")
    elif machines:
        notes.append(f"Machine: {machines[0]}.")
    if unknown and runs:
        notes.append(f"{unknown} of {len(runs)} runs have no provenance.json (made before mpifed recorded it): "
                     f"their machine is unknown.")
    for m in (metric, paper_metric):
        if m is not None and m.chosen_on_test:
            notes.append(f"'{m.label}' picks each run's best round by the test accuracy itself: optimistic, shown for "
                         f"comparison with the paper; claims rest on a metric that does not choose on test.")
    return notes
