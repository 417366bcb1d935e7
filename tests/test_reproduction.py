"""The reports quote what the archived runs in results/ say (docs/REPRODUCTION.md the papers'
tables, benchmarks/RESULTS.md the methods benchmark, docs/federations.md the tables beyond the
papers): every search score so far (a table's choices
are quoted before its final runs end, a search that spans sessions as it stands), and every
seed-by-seed row of every finished column with each of its declared claims' interval and
Holm-adjusted p, recomputed from the runs, appear in the report as printed; where a final run
diverged, so do the claims with it counted at chance (the check the report gives beside); and
every search that compared candidates from more than one machine has its --recheck on one machine
archived in results/recheck/ and quoted.

docs/REPRODUCTION.md, up to its re-reading of the earlier report (whose 3-seed figures were never
archived), is checked whole: its generated parts (the report-wide labels, every declared claim with
both labels) are what mpifed.entry.reproduction writes from results/ now; every mean ± sd and every
paired interval it gives is one the archived runs give; every hand-written claim row gives its
claim's difference, Holm p, label and distribution-free test; and the counts and report-wide Holm
p's its prose quotes are the runs'."""
from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import pytest

from mpifed.tables import reproduction
from mpifed.tables.summarize import search_table, summarize
from mpifed.run import provenance, results
from mpifed.run.rundir import PROVENANCE
from mpifed.tables import machine_check
from mpifed.tables.stats import paired
from mpifed.tables.summary import Summary, run_value
from mpifed.tables.table_file import Table, load_table, resolve, settled

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
REPRODUCTION = "docs/REPRODUCTION.md"
ARCHIVED = {"fedntd-table1": ("configs/repro/fedntd/table1.table.yaml",
                              REPRODUCTION),  # results/ folder -> table, report
            "fedntd-epochs": ("configs/repro/fedntd/epochs.table.yaml", REPRODUCTION),
            "fedcad-table1": ("configs/repro/fedcad/table1.table.yaml", REPRODUCTION),
            "fedcsd-table1": ("configs/repro/fedcsd/table1.table.yaml", REPRODUCTION),
            "fedcsd-tuned": ("configs/repro/fedcsd/tuned.table.yaml", REPRODUCTION),
            "fedntd-long": ("configs/repro/fedntd/long.table.yaml", REPRODUCTION),
            "fedgkd-table3": ("configs/repro/fedgkd/table3.table.yaml", REPRODUCTION),
            "fedgkd-table4": ("configs/repro/fedgkd/table4.table.yaml", REPRODUCTION),
            "bench-methods": ("configs/bench/methods.table.yaml", "benchmarks/RESULTS.md")}
RECHECK = REPO / "results" / "recheck"      # --recheck's re-runs, on one machine, by table folder
# tables beyond the papers, quoted on their own pages: results/ folder -> table, the page that quotes them
BEYOND = {"async-async": ("configs/cross-device/async/async.table.yaml", "docs/federations.md"),
          "heterogeneity-heterogeneity": ("configs/cross-device/heterogeneity/heterogeneity.table.yaml",
                                          "docs/federations.md")}


@functools.cache
def _archived(table_file: str) -> Table:
    t = load_table(REPO / table_file, str(REPO / "results"))
    resolve(t, [])
    return t


def resolved(table_file: str) -> Table:
    """The table resolved against results/: a copy of the one read the first time it is asked for
    (reading a table's runs takes seconds), the caller's to select from."""
    return copy.deepcopy(_archived(table_file))


def _settled(table_file: str) -> list[tuple[str, str, list[str]]]:
    """(setting, the rows the report must quote, its claims' "difference [CI], seeds, p | Holm p"
    cells) for each setting of the table whose search has a score: the search's rows (marked where
    it is not finished), and where every final run has finished or diverged, the seed-by-seed rows
    and the claims as well."""
    found = []
    for setting in dict.fromkeys(r.setting for r in _archived(table_file).runs):
        t = resolved(table_file)
        t.select([setting], None, None)
        search = search_table(t)
        s = summarize(t)
        if all(settled(r.path) for r in t.runs):             # finished or diverged
            claims = [f"{c.result.text(verdict=False)} | {c.holm_p:.3f} |" for c in s.claims if c.result is not None]
            found.append((setting, f"{search}\n{s.seed_tables()}", claims))
        elif search:
            found.append((setting, search, []))
    return found


def test_every_archived_table_is_listed_here():
    assert sorted(p.name for p in (REPO / "results").iterdir() if p.is_dir() and p != RECHECK) == \
        sorted([*ARCHIVED, *BEYOND])
    assert {p.name for p in RECHECK.iterdir()} <= set(ARCHIVED)


def _recheck_machine() -> dict[str, frozenset[str]]:
    """The one machine every archived re-run of results/recheck/ ran on."""
    found = {tuple(sorted(provenance.hardware(provenance.read(p.parent) or {}).items()))
             for p in RECHECK.rglob(PROVENANCE)}
    assert len(found) == 1, f"results/recheck/ holds re-runs from {len(found)} machines: a recheck is made on one"
    return dict(found.pop())


@pytest.mark.parametrize("folder", sorted(ARCHIVED))
def test_every_search_across_machines_is_rechecked_on_one_and_quoted(folder):
    table_file, report_file = ARCHIVED[folder]
    t = resolved(table_file)
    here = _recheck_machine()
    checks = machine_check.plan(t, RECHECK, here)
    if not checks:
        pytest.skip(f"results/{folder}: every search compared candidates from one machine")
    text = machine_check.report(checks, t, here)
    assert "not run yet" not in text, f"results/recheck/{folder} lacks re-runs: python -m mpifed.table " \
                                      f"{table_file} --runs-root results --recheck DIR, then archive DIR's records"
    report = (REPO / report_file).read_text().splitlines()
    missing = [line for line in text.splitlines()[2:] if line and line not in report]
    assert not missing, f"{report_file} does not quote these lines of the recheck of results/{folder}: {missing}"


def test_the_rechecks_totals_are_the_sums_of_each_tables():
    """The headline of "Searches across machines, rechecked on one": searches, re-runs and re-runs
    repeating their first run, summed over every table's --recheck from results/recheck/."""
    here = _recheck_machine()
    searches, reruns, same, chosen_alike = {}, 0, 0, 0
    for folder, (table_file, _) in ARCHIVED.items():
        t = resolved(table_file)
        checks = machine_check.plan(t, RECHECK, here)
        if not checks:
            continue
        line = re.search(r"(\d+) searches compared candidates from more than one machine: (\d+) choose the same on "
                         r"this machine, \d+ another; (\d+) of the (\d+) re-run candidates trained identically",
                         machine_check.report(checks, t, here))
        assert line, f"results/{folder}: --recheck's report has no totals line"
        searches[folder] = int(line.group(1))
        chosen_alike, same, reruns = (chosen_alike + int(line.group(2)), same + int(line.group(3)),
                                      reruns + int(line.group(4)))
    mine = sum(n for folder, n in searches.items() if ARCHIVED[folder][1] == REPRODUCTION)
    said = re.search(r"Every choice stands: (\d+) searches \((\d+) in this report, (\d+) in the methods benchmark\),"
                     r"\s+(\d+)\s+re-runs, (\d+) of them repeating", (REPO / REPRODUCTION).read_text())
    assert said and chosen_alike == sum(searches.values())
    assert tuple(map(int, said.groups())) == (sum(searches.values()), mine, sum(searches.values()) - mine, reruns,
                                              same), f"{REPRODUCTION}'s recheck totals: {searches}, {reruns}, {same}"


ONE_MACHINE = [("fedntd-table1", "fmnist-lda0.1")]   # columns whose final runs the report says record one machine


@pytest.mark.parametrize("folder, setting", ONE_MACHINE)
def test_a_column_the_report_says_ran_on_one_machine_records_one(folder, setting):
    t = resolved(ARCHIVED[folder][0])
    t.select([setting], None, None)
    machines = {provenance.machine(provenance.read(r.path) or {}) for r in t.runs}
    assert len(machines) == 1, f"results/{folder}, {setting}: the final runs ran on {sorted(machines)}"
    assert all(provenance.hardware(provenance.read(r.path) or {})["cpu_id"] for r in t.runs), \
        f"results/{folder}, {setting}: a final run does not record its CPU's identity (cpu_id)"


ONE_MACHINE_A_SEED = ["heterogeneity-heterogeneity"]   # tables whose page says each seed's runs share a machine


@pytest.mark.parametrize("folder", ONE_MACHINE_A_SEED)
def test_a_table_the_page_says_pairs_runs_of_one_machine_records_one_machine_a_seed(folder):
    t = resolved(BEYOND[folder][0])
    by_seed: dict[int, set[str]] = {}
    for r in t.runs:
        by_seed.setdefault(r.seed, set()).add(provenance.machine(provenance.read(r.path) or {}))
    mixed = {seed: sorted(m) for seed, m in by_seed.items() if len(m) != 1}
    assert by_seed and not mixed, f"results/{folder}: a seed's final runs ran on several machines: {mixed}"


FIRST_MACHINE = "family 25 model 1 "   # the CPU model whose re-runs repeated these tables' unrecorded first runs


@pytest.mark.parametrize("folder", ["fedntd-epochs", "fedntd-table1"])
def test_a_final_run_that_records_its_cpu_records_the_one_that_repeats_the_first_runs(folder):
    t = resolved(ARCHIVED[folder][0])
    cpus = {c for r in t.runs for c in provenance.hardware(provenance.read(r.path) or {})["cpu_id"]}
    other = sorted(c for c in cpus if not c.startswith(FIRST_MACHINE))
    assert cpus and not other, f"results/{folder}: final runs record another CPU than {FIRST_MACHINE!r}: {other}"


@pytest.mark.parametrize("folder", sorted([*ARCHIVED, *BEYOND]))
def test_the_report_quotes_the_archived_runs_seed_by_seed(folder):
    table_file, report_file = {**ARCHIVED, **BEYOND}[folder]
    report = (REPO / report_file).read_text()
    settled = _settled(table_file)
    assert settled, f"results/{folder} holds neither a search's score nor a finished column"
    for setting, rows, claims in settled:
        missing = [line for line in rows.splitlines() if line.startswith("| ") and line not in report.splitlines()]
        assert not missing, f"{setting}: {report_file} does not quote these rows of results/{folder}: {missing}"
        # the report's claims tables write a minus sign where --summary writes a hyphen
        unquoted = [c for c in claims if c not in report.replace("\u2212", "-")]
        assert not unquoted, f"{setting}: {report_file} does not quote these claims of results/{folder}: {unquoted}"


@pytest.mark.parametrize("folder", sorted(ARCHIVED))
def test_where_a_run_diverged_the_report_quotes_the_claims_with_it_at_chance(folder):
    table_file, report_file = ARCHIVED[folder]
    t = resolved(table_file)
    if not any("diverged" in why for why in summarize(t).left_out):
        pytest.skip(f"results/{folder}: no final run diverged")
    report = (REPO / report_file).read_text().replace("\u2212", "-")
    rows = summarize(t, diverged_as=10.0).markdown().splitlines()
    claims = [line for line in rows if line.startswith("| ") and " > " in line.split("|")[1]]
    unquoted = [line for line in claims if line not in report.splitlines()]
    assert claims and not unquoted, f"{report_file} does not quote these claims of results/{folder} " \
                                    f"(--summary --diverged 10): {unquoted}"


def test_a_report_wide_family_adjusts_each_claim_over_every_tables_claims(capsys):
    from mpifed.entry.table import main as table_main
    tables = ["configs/repro/fedntd/long.table.yaml", "configs/repro/fedntd/table1.table.yaml"]
    assert table_main([tables[0], "--runs-root", str(REPO / "results"), "--summary", "--family", *tables]) == 0
    out = capsys.readouterr().out
    own = resolved(tables[0])
    other = resolved(tables[1])
    mine, theirs = summarize(own), summarize(other)
    mine.with_report_family([theirs])
    assert mine.report_family == len(mine.all_claims) + len(theirs.all_claims) == 6 + len(theirs.all_claims)
    for t in mine.claims:
        wide = mine.report_holm[id(t)]
        assert wide >= t.holm_p
        assert f"| {t.holm_p:.3f} | {t.label} | {wide:.3f} |" in out      # both labels, side by side
    assert f"over all {mine.report_family} claims of the report's tables (--family)" in out


def test_the_reports_generated_parts_are_what_the_archived_runs_give():
    """REPRODUCTION.md's generated parts, the report-wide labels of its opening ("In short") and every
    declared claim of every table with both labels (its appendix), are what mpifed.entry.reproduction
    writes from results/ now, and every table the report cites is in its family."""
    assert set(reproduction.REPORT_TABLES) == {table for table, _ in ARCHIVED.values() if _archived(table).claims}
    found = reproduction.summaries({path: resolved(path) for path in reproduction.REPORT_TABLES})
    text = (REPO / REPRODUCTION).read_text()
    assert reproduction.rewrite(text, reproduction.blocks(found)) == text, \
        f"{REPRODUCTION}'s generated parts are stale: python -m mpifed.entry.reproduction {REPRODUCTION} --write"
    family = re.search(r'T="([^"]*)"', text)
    assert family and family.group(1).split() == list(reproduction.REPORT_TABLES), \
        "the report's --family command does not name the tables of mpifed.tables.reproduction.REPORT_TABLES"
    opening = text[text.index("## In short"):]
    assert "<!-- generated: report-wide -->" in opening[:opening.index("\n- **")], \
        "the opening summary does not lead with the report-wide labels (before its first finding)"


def test_a_generated_part_is_rewritten_between_its_markers_and_an_unknown_or_missing_one_is_named():
    text = "a\n<!-- generated: x -->\nold\n<!-- end -->\nb\n"
    assert reproduction.rewrite(text, {"x": "new"}) == "a\n<!-- generated: x -->\nnew\n<!-- end -->\nb\n"
    with pytest.raises(ValueError, match=r"nothing generates: \['x'\]"):
        reproduction.rewrite(text, {"y": "new"})
    with pytest.raises(ValueError, match=r"lacks the generated parts \['y'\]"):
        reproduction.rewrite(text, {"x": "new", "y": "new"})


def test_the_local_work_table_is_what_the_archived_runs_measure():
    """Every row of the report's local-work table, recomputed from results/ by --summary's own code."""
    report = (REPO / REPRODUCTION).read_text().splitlines()
    declared = 0
    for folder, (table_file, _) in ARCHIVED.items():
        t = resolved(table_file)
        for setting, mean, theirs in summarize(t).local_work:
            if theirs is None:
                continue
            declared += 1
            row = (f"| `{table_file.removeprefix('configs/repro/')}` | {setting} | {mean:.1f} | {theirs:g} | "
                   f"{mean / theirs:.2g}x |")
            assert row in report, f"results/{folder}: {REPRODUCTION} lacks {row}"
    assert declared == 13


# ------------------------------------------------------------------ every figure of the report, checked
SIGNED = r"[-+]\d+\.\d+ \[[-+]\d+\.\d+, [-+]\d+\.\d+\]"      # a paired difference [95% CI]
SPREAD = r"-?\d+\.\d+ ± \d+\.\d+"                              # a mean ± sample std over seeds
EARLIER = "## The earlier report, re-read"    # from here on, the earlier report's seeds, given in its text
NOT_ARCHIVED = {"+3.83 [+3.21, +4.46]": "the earlier report's interval (50 images per client, 200 rounds), quoted",
                "+5.93 [+0.15, +11.72]": "FedGKD Table 3's first run, whose records were lost"}


def _left_out(t: Table) -> set[str]:
    """The figures of a table's runs that --summary leaves out as of another configuration (the first
    runs before a search's choice moved, kept beside the final runs): each group's mean ± sd, and its
    paired difference with each group of the same setting that --summary keeps, in either order."""
    kept: dict[tuple[str, str], dict[int, float]] = {}
    other: dict[tuple[str, str], dict[int, float]] = {}
    for r in t.runs:
        pattern = re.compile(re.escape(r.plain_name) + r"(-[0-9a-f]{10})?")
        paths = [r.path] + sorted(p for p in r.root.glob(f"{r.plain_name}*")
                                  if p != r.path and pattern.fullmatch(p.name))
        for i, path in enumerate(paths):
            value = run_value(t.metric, path) if settled(path) else None
            if value is not None:
                (other if i else kept).setdefault((r.setting, r.method), {})[r.seed] = value
    found = {results.Stat(list(v.values())).text(2) for v in other.values()}
    for (setting, _), mine in other.items():
        for (s, _), theirs in kept.items():
            if s == setting:
                found |= {c.text(verdict=False) for c in (paired(mine, theirs), paired(theirs, mine)) if c}
    return {f for text in found for f in re.findall(f"{SIGNED}|{SPREAD}", text)}


@functools.cache
def _figures() -> frozenset[str]:
    """Every mean ± sd and paired difference [95% CI] the archived runs give: --summary --by-seed of
    each table, in its metric and in the paper's, with its diverged runs counted at chance as well, and
    the runs it leaves out as of another configuration."""
    found: set[str] = set()
    for table_file, _ in ARCHIVED.values():
        t = resolved(table_file)
        views = [summarize(t)]
        if any("diverged" in why for why in views[0].left_out):
            views.append(summarize(t, diverged_as=10.0))
        if t.paper_metric is not None:
            theirs = resolved(table_file)
            theirs.metric, theirs.paper_metric = t.paper_metric, None
            views.append(summarize(theirs))
        for s in views:
            found |= set(re.findall(f"{SIGNED}|{SPREAD}", f"{s.markdown()}\n{s.seed_tables()}"))
        found |= _left_out(t)
    return frozenset(found)


def _report() -> str:
    """REPRODUCTION.md up to the earlier report's re-reading, with the minus signs --summary writes."""
    text = (REPO / REPRODUCTION).read_text().replace("\u2212", "-")
    return text[:text.index(EARLIER)]


def test_every_mean_and_interval_the_report_gives_is_what_the_archived_runs_give():
    unknown = [f for f in re.findall(f"{SIGNED}|{SPREAD}", _report()) if f not in _figures() and f not in NOT_ARCHIVED]
    assert not unknown, f"{REPRODUCTION} gives figures that no archived run gives (python -m mpifed.table TABLE " \
                        f"--runs-root results --summary --by-seed): {unknown}"


@functools.cache
def _family() -> tuple[Summary, ...]:
    return tuple(reproduction.summaries({path: resolved(path) for path in reproduction.REPORT_TABLES}).values())


def _kind(label: str) -> str:
    """What a label says, in the words a hand-written row may use for it."""
    label = label.lower()
    for words, kind in (("not a test", "not a test"), ("not tested yet", "not tested yet"),
                        ("interval alone", "by its interval alone"), ("the other way", "the other way"),
                        ("inconclusive", "inconclusive"), ("supported", "supported")):
        if words in label:
            return kind
    return label


def test_every_claim_row_written_by_hand_gives_the_claims_label_and_distribution_free_test():
    """A claims table written by hand in a section (beside the paper's margins) gives, for each claim
    it quotes, the label the table's Holm adjustment gives and, where it has the column, the exact
    sign-flip p and the bootstrap range, as the archived runs give them."""
    text = reproduction.BLOCK.sub("", _report())
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    wrong, quoted = [], 0
    for s in _family():
        for t in s.claims:
            if t.result is None:
                continue
            key = f"{t.result.text(verdict=False)} | {t.holm_p:.3f} | "
            for line in (line for line in lines if key in line):
                quoted += 1
                cells = [c.strip() for c in line.split(key, 1)[1].split("|")]
                if _kind(cells[0]) != _kind(t.label):
                    wrong.append(f"{line} (the label is {t.label!r})")
                free = f"{t.result.p_sign_flip:.3f}, [{t.result.boot[0]:+.2f}, {t.result.boot[1]:+.2f}]"
                if any(re.fullmatch(r"\d\.\d{3}, \[.*\]", c) and c != free for c in cells):
                    wrong.append(f"{line} (sign-flip p and bootstrap range: {free})")
    assert quoted and not wrong, f"{REPRODUCTION}'s hand-written claim rows differ from the archived runs: {wrong}"
    claims = [t for s in _family() for t in s.claims if t.result is not None]
    for table_file in reproduction.REPORT_TABLES:
        if any("diverged" in why for why in summarize(resolved(table_file)).left_out):
            claims += [t for t in summarize(resolved(table_file), diverged_as=10.0).claims if t.result is not None]
    keys = {(t.result.text(verdict=False), f"{t.holm_p:.3f}") for t in claims}
    row = r"\| ([-+]\d+\.\d+ \[[^]]+\], \d+/\d+ seeds, p [=<] \d\.\d{3}) \| (\d\.\d{3}) \|"
    rows = re.findall(row, "\n".join(lines))
    stale = [row for row in rows if row not in keys]
    assert rows and not stale, f"{REPRODUCTION} has claim rows (difference | Holm p) that no claim gives: {stale}"


def test_the_report_wide_family_size_is_the_one_the_prose_gives():
    size = len([t for s in _family() for t in s.claims])
    said = {int(n) for n in re.findall(r"(?:the report's|all) (\d+)(?: declared)? claims", _report())}
    said |= {int(n) for n in re.findall(r"over the report's (\d+)", _report())}
    assert said == {size}, f"{REPRODUCTION} gives the report-wide family as {sorted(said)}; it holds {size} claims"


def test_every_holm_p_and_claim_count_the_prose_gives_is_the_archived_runs():
    """A report-wide Holm p the prose quotes is one the report-wide adjustment gives; a count of a
    table's claims is its table's (in a section that runs one table) or one of the tables' sizes."""
    text = reproduction.BLOCK.sub("", _report())
    wide = {f"{s.report_holm[id(t)]:.3f}" for s in _family() for t in s.claims}
    quoted = [p for m in re.finditer(r"report-wide(?: Holm p)?,? (\d\.\d{3})(?:,? and (\d\.\d{3}))?|over the "
                                     r"report's \d+(?: claims)?,? (?:its Holm p is )?(\d\.\d{3})(?: and (\d\.\d{3}))?",
                                     text) for p in m.groups() if p]
    assert quoted and not [p for p in quoted if p not in wide], \
        f"{REPRODUCTION} quotes report-wide Holm p's that the report-wide adjustment does not give: " \
        f"{[p for p in quoted if p not in wide]}"
    sizes = {path: len(s.claims) for path, s in zip(reproduction.REPORT_TABLES, _family())}
    wrong = []
    for section in text.split("\n## "):
        named = [path for path in sizes if path in section]
        allowed = {sizes[named[0]]} if len(named) == 1 else set(sizes.values())
        said = re.findall(r"over the table's (\d+)|the table's (\d+) declared claims|over the (\d+) claims", section)
        wrong += [f"{section.splitlines()[0]}: {n}" for found in said for n in found if n and int(n) not in allowed]
    assert not wrong, f"{REPRODUCTION} gives a table's claim count that is not its table's: {wrong}"


def test_the_choices_at_a_grids_edge_the_report_counts_are_those_summary_names():
    """The protocol's count of each table's choices left at an edge of what was searched, of the
    setting x method pairs searched, as --summary's search notes name them."""
    text = _report()
    said = {("bench/methods" if name.startswith("the methods") else name.strip("`")): (int(n), int(m))
            for name, n, m in re.findall(r"(`[a-z]+/[a-z0-9]+`|the methods\s+benchmark) (\d+) of (\d+) once", text)}
    found = {}
    for path, s in zip(reproduction.REPORT_TABLES, _family()):
        pairs = re.findall(r"^ {2}\S+ x \S+: .*$", "\n".join(s.notes), re.M)
        found[reproduction.short(path)] = (sum("at the grid's edge" in line for line in pairs), len(pairs))
    assert said == found, f"{REPRODUCTION}'s choices at an edge (of those searched) differ from --summary's: {found}"


def test_every_table_the_report_cites_records_one_machine_model():
    warned = [s.title for s in _family() if any(n.startswith("WARNING: these runs come from") for n in s.notes)]
    assert not warned, f"{REPRODUCTION} says every table ran on one machine model; --summary warns for {warned}"
