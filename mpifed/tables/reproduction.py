"""The parts of docs/REPRODUCTION.md that are generated from the archived runs in results/ (written
and checked by ``python -m mpifed.entry.reproduction``, and by tests/test_reproduction.py).

A generated part sits between ``<!-- generated: NAME -->`` and ``<!-- end -->``: ``report-wide``,
the labels of every declared claim after one Holm adjustment over the report's tables, beside each
table's own, and the claims that survive it; ``claims TABLE``, every claim of one table with both
labels, as ``python -m mpifed.table TABLE --runs-root results --summary --family ...`` prints them.
"""
from __future__ import annotations

import re
from pathlib import Path

from mpifed.tables.summarize import summarize
from mpifed.tables.summary import COUNTED, Summary, label_counts
from mpifed.tables.table_file import Table, load_table, resolve

# the tables whose claims the report cites, in its order: the report-wide family of Holm's adjustment
REPORT_TABLES = ("configs/repro/fedntd/table1.table.yaml", "configs/repro/fedntd/long.table.yaml",
                 "configs/repro/fedntd/epochs.table.yaml", "configs/repro/fedcad/table1.table.yaml",
                 "configs/repro/fedcsd/table1.table.yaml", "configs/repro/fedcsd/tuned.table.yaml",
                 "configs/repro/fedgkd/table3.table.yaml", "configs/bench/methods.table.yaml")
BLOCK = re.compile(r"<!-- generated: (?P<name>[^>]+?) -->\n(?P<body>.*?)<!-- end -->", re.S)
SURVIVE = [test for kind, test in COUNTED if kind in ("supported", "the other way")]   # labels the opening lists


def short(table_file: str) -> str:
    """A table as the report names it: ``fedntd/table1``, ``bench/methods``."""
    return table_file.removeprefix("configs/").removeprefix("repro/").removesuffix(".table.yaml")


def load(runs_root: str | Path) -> dict[str, Table]:
    """The report's tables (:data:`REPORT_TABLES`, read from the working directory), resolved against
    ``runs_root``."""
    tables = {}
    for path in REPORT_TABLES:
        t = load_table(path, str(runs_root))
        resolve(t, [])
        tables[path] = t
    return tables


def summaries(tables: dict[str, Table]) -> dict[str, Summary]:
    """Each table's summary of all its runs, each claim adjusted over the table's claims and, once
    more, over every claim of ``tables`` together (the report-wide family)."""
    found = {path: summarize(t) for path, t in tables.items()}
    for path, s in found.items():
        s.with_report_family([other for key, other in found.items() if key != path])
    return found


def report_wide(found: dict[str, Summary]) -> str:
    """The report-wide family: its size per table, every label after its adjustment beside the
    table's own, and the claims supported (or the other way) after it."""
    claims = [(s, t) for s in found.values() for t in s.claims]
    wide = [t.labelled(s.report_holm[id(t)]) for s, t in claims]
    own = [t.label for _, t in claims]
    sizes = ", ".join(f"`{short(path)}` {len(s.claims)}" for path, s in found.items())
    lines = [f"Holm's adjustment once over the whole report: all {len(claims)} claims declared by the "
             f"{len(found)} archived tables that declare any ({sizes}). Their labels after it: "
             f"**{label_counts(wide)}**. After each table's own adjustment (over its claims alone), the same "
             f"claims: {label_counts(own)}.", "",
             "| table | claims | labels over the report | labels within the table |", "| --- | --- | --- | --- |"]
    for path, s in found.items():
        lines.append(f"| `{short(path)}` | {len(s.claims)} | "
                     f"{label_counts([t.labelled(s.report_holm[id(t)]) for t in s.claims])} | "
                     f"{label_counts([t.label for t in s.claims])} |")
    kept = [(s, t) for s, t in claims if any(test(t.labelled(s.report_holm[id(t)])) for test in SURVIVE)]
    lines += ["", f"The {len(kept)} claims supported, or the other way, after the report-wide adjustment:", "",
              "| claim | setting | difference [95% CI], seeds ahead, p | table's Holm p | report-wide Holm p | "
              "report-wide label |", "| --- | --- | --- | --- | --- | --- |"]
    for s, t in kept:
        q = s.report_holm[id(t)]
        lines.append(f"| {s.name(t.claim.above)} > {s.name(t.claim.below)} | {t.setting} | "
                     f"{t.result.text(verdict=False) if t.result else '-'} | {t.holm_p:.3f} | {q:.3f} | "
                     f"{t.labelled(q)} |")
    return "\n".join(lines)


def blocks(found: dict[str, Summary]) -> dict[str, str]:
    """Each generated part's name -> its text."""
    out = {"report-wide": report_wide(found)}
    for path, s in found.items():
        out[f"claims {short(path)}"] = "\n".join(
            [f"`{short(path)}`, declared claims: {len(s.claims)} (`python -m mpifed.table {path} --runs-root "
             f"results --summary --family ...`)", "", *s.claims_table()])
    return out


def rewrite(text: str, generated: dict[str, str]) -> str:
    """``text`` with each generated part's body replaced by ``generated``'s; ValueError names a part
    the text has that nothing generates, or one it lacks."""
    named = [m.group("name") for m in BLOCK.finditer(text)]
    unknown = sorted(set(named) - set(generated))
    if unknown:
        raise ValueError(f"generated parts that nothing generates: {unknown}; the known ones are {sorted(generated)}")
    lacking = sorted(set(generated) - set(named))
    if lacking:
        raise ValueError(f"the report lacks the generated parts {lacking}: put the two lines "
                         f"'<!-- generated: NAME -->' and '<!-- end -->' where each goes, then --write")
    return BLOCK.sub(lambda m: f"<!-- generated: {m.group('name')} -->\n{generated[m.group('name')]}\n<!-- end -->",
                     text)
