"""Tables as evidence (issue 22): paired statistics against a hand computation, declared metrics,
searches chosen on validation and recorded as part of the runs' identity; and the table's own
reliability (issue 25): runs that collide, duplicate entries, Ctrl-C, runs held elsewhere, filters."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import REPO, env
from test_tables import fake_run, resolved_config, write_table

from mpifed.settings import config
from mpifed.run import results
from mpifed.tables import stats
from mpifed.run.rundir import RunDir
from mpifed.entry.table import main as table_main
from mpifed.tables.summarize import search_notes, search_table, summarize
from mpifed.tables.table_file import load_table, resolve, settled
from mpifed.tables.tuning import SearchChoice, grid_columns


# ------------------------------------------------------------------ paired statistics, by hand
METHOD = {0: 80.0, 1: 82.0, 2: 81.0, 3: 85.0, 4: 79.0}
REFERENCE = {0: 78.0, 1: 80.0, 2: 82.0, 3: 81.0, 4: 78.0}


def test_paired_interval_and_p_value_match_a_hand_computation():
    # d = 2, 2, -1, 4, 1: mean 1.6; sample sd sqrt(13.2 / 4) = 1.8166; se = sd / sqrt(5) = 0.81240
    # t(0.975, 4 df) = 2.7764 (printed t tables): half width 2.2556
    p = stats.paired(METHOD, REFERENCE)
    sd = math.sqrt(13.2 / 4)
    se = sd / math.sqrt(5)
    assert p.n == 5 and p.mean == pytest.approx(1.6) and (p.wins, p.losses) == (4, 1)
    assert p.low == pytest.approx(1.6 - 2.7764 * se, abs=1e-3) and p.high == pytest.approx(1.6 + 2.7764 * se, abs=1e-3)
    # the two-sided p-value: the t(4) density integrated beyond |t| = 1.6 / se, numerically
    t = 1.6 / se
    x = np.linspace(t, 400.0, 2_000_001)
    density = math.gamma(2.5) / (math.sqrt(4 * math.pi) * math.gamma(2.0)) * (1 + x ** 2 / 4) ** -2.5
    assert p.p == pytest.approx(2 * np.trapezoid(density, x), abs=2e-4)
    assert p.verdict == "inconclusive"
    assert p.text() == f"+1.60 [{p.low:+.2f}, {p.high:+.2f}], 4/5 seeds, p = {p.p:.3f}: inconclusive"


def test_paired_verdicts_and_too_few_seeds():
    assert stats.paired({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.0, 1: 1.2, 2: 2.1}).verdict == "higher"
    assert stats.paired({0: 0.0, 1: 1.2, 2: 2.1}, {0: 1.0, 1: 2.0, 2: 3.0}).verdict == "lower"
    assert stats.paired({0: 1.0, 3: 2.0}, {0: 0.5, 1: 2.0}) is None              # one common seed: no interval
    same = stats.paired({0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.5})                     # the same difference every seed
    assert (same.low, same.high, same.verdict) == (0.5, 0.5, "higher")


def test_holm_adjustment_matches_a_hand_computation():
    # sorted: 0.01 x 4 = 0.04; 0.03 x 3 = 0.09; 0.04 x 2 = 0.08, raised to 0.09 (never below the one before); 0.5 x 1
    assert stats.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert stats.holm([0.3, 0.4]) == pytest.approx([0.6, 0.6]) and stats.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])


def _table(tmp_path: Path, extra: str = "", seeds: str = "[0, 1, 2, 3, 4]", metric: str = "{kind: final}",
           methods: str = "[a.yaml, b.yaml]") -> Path:
    table = write_table(tmp_path / "t", tmp_path / "data", methods=methods, seeds=seeds, metric=metric,
                        dataset="{name: synthetic, train_samples: 140, test_samples: 40}")
    setting = table.parent / "s.yaml"
    setting.write_text(setting.read_text().replace("  num_clients: 2\n", "  num_clients: 2\n  val_size: 20\n"))
    if extra:
        table.write_text(table.read_text() + extra)
    return table


def test_summary_compares_each_method_with_fedavg_seed_by_seed(tmp_path):
    table = _table(tmp_path)
    t = load_table(table, str(tmp_path / "runs"))
    for seed in range(5):
        fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, REFERENCE[seed] / 100])
        fake_run(t.root / f"s-b-s{seed}", resolved_config(table, seed, method="b.yaml"), [0.5, METHOD[seed] / 100])
    resolve(t, [])
    s = summarize(t)
    assert s.reference == "a"                          # a.yaml runs FedAvg: the default reference
    want = stats.paired(METHOD, REFERENCE)
    got = s.paired[("s", "b")]
    assert got.n == 5 and got.mean == pytest.approx(want.mean) and got.p == pytest.approx(want.p)
    text = s.markdown()
    assert "Against a, seed by seed (final test_acc, difference in points)" in text
    assert f"| b | {want.text()} |" in text
    assert "(n=5)" in text and "(n=5 of" not in text


def test_by_seed_shows_every_seeds_value_and_difference_from_the_reference(tmp_path, capsys):
    table = _table(tmp_path)
    t = load_table(table, str(tmp_path / "runs"))
    for seed in range(5):
        fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, REFERENCE[seed] / 100])
        if seed != 3:
            fake_run(t.root / f"s-b-s{seed}", resolved_config(table, seed, method="b.yaml"), [0.5, METHOD[seed] / 100])
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--summary", "--by-seed"]) == 0
    out = capsys.readouterr().out
    # b - a on seeds 0, 1, 2, 4: 2, 2, -1, 1
    want = stats.paired({k: v for k, v in METHOD.items() if k != 3}, REFERENCE)
    assert "s, seed by seed: final test_acc (%)" in out
    assert "| method | s0 | s1 | s2 | s3 | s4 | mean ± sd |" in out
    assert "| a | 78.00 | 80.00 | 82.00 | 81.00 | 78.00 | 79.80 ± 1.79 (n=5) |" in out
    assert "| b | 80.00 | 82.00 | 81.00 | - | 79.00 | 80.50 ± 1.29 (n=4) |" in out
    assert f"| b − a | +2.00 | +2.00 | -1.00 | - | +1.00 | {want.text()} |" in out
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--summary"]) == 0
    assert "seed by seed: final" not in capsys.readouterr().out
    (table.parent / "s2.yaml").write_text("base: s.yaml\n")              # a setting with no runs yet: no empty table
    table.write_text(table.read_text().replace("settings: [s.yaml]", "settings: [s.yaml, s2.yaml]"))
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--summary", "--by-seed"]) == 0
    out = capsys.readouterr().out
    assert "s, seed by seed" in out and "s2, seed by seed" not in out


def test_declared_claims_are_labelled_by_interval_and_holm_over_the_family(tmp_path):
    table = _table(tmp_path, 'claims: ["b > a", "a > b", "b > c"]\n', methods="[a.yaml, b.yaml, c.yaml]")
    (table.parent / "c.yaml").write_text((table.parent / "b.yaml").read_text())
    t = load_table(table, str(tmp_path / "runs"))
    ahead = {0: 2.0, 1: 3.0, 2: 2.5, 3: 3.0, 4: 2.0}
    for seed in range(5):
        fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, REFERENCE[seed] / 100])
        fake_run(t.root / f"s-b-s{seed}", resolved_config(table, seed, method="b.yaml"),
                 [0.5, (REFERENCE[seed] + ahead[seed]) / 100])
    resolve(t, [])
    s = summarize(t)
    above, below, missing = s.claims
    want = stats.paired({k: REFERENCE[k] + ahead[k] for k in ahead}, REFERENCE)
    assert above.result.mean == pytest.approx(want.mean) and above.result.p == pytest.approx(want.p)
    # a family of 3 (c was not run: it counts, with p = 1); 'a > b' has the same two-sided p as 'b > a'
    assert above.holm_p == pytest.approx(3 * want.p, rel=1e-6) and below.holm_p == pytest.approx(3 * want.p, rel=1e-6)
    assert (above.label, below.label) == ("supported", "not supported (the other way)")
    assert missing.result is None and missing.label == "no result (fewer than 2 common seeds in the runs summarised)"
    text = s.markdown()
    assert "Holm's adjustment over all 3" in text
    assert f"| b > a | s | {want.text(verdict=False)} | {above.holm_p:.3f} | supported |" in text


def test_a_label_either_way_needs_holms_adjustment_as_well_as_the_interval():
    from mpifed.tables.summary import Claim, Tested
    claim = Claim("b", "a")
    ahead, behind = stats.Paired(5, 2.0, 0.5, 3.5, 5, 0, 0.02), stats.Paired(5, -2.0, -3.5, -0.5, 0, 5, 0.02)
    assert Tested(claim, "s", ahead, 0.04).label == "supported"
    assert Tested(claim, "s", ahead, 0.06).label == "supported by its interval alone, not after Holm"
    assert Tested(claim, "s", behind, 0.04).label == "not supported (the other way)"
    assert Tested(claim, "s", behind, 0.06).label == "the other way by its interval alone, not after Holm"
    assert Tested(claim, "s", stats.Paired(5, 1.0, -0.5, 2.5, 4, 1, 0.2), 0.2).label == "inconclusive"


def test_claim_seeds_hold_a_claim_back_until_it_has_them_and_name_a_count_without_a_sign_flip_test():
    from mpifed.tables.summary import Claim, Tested
    claim = Claim("b", "a")
    ahead = {n: stats.Paired(n, 2.0, 0.5, 3.5, n, 0, 0.01) for n in (4, 5, 6)}
    assert Tested(claim, "s", ahead[4], 0.01, needs=6).label == "not tested yet: 4 of the 6 seeds its claims need"
    assert Tested(claim, "s", ahead[6], 0.01, needs=6).label == "supported"
    assert Tested(claim, "s", ahead[5], 0.01, needs=5).label == (
        "supported, by the t-test's normality alone (5 seeds cannot reach a sign-flip p < 0.05)")
    assert Tested(claim, "s", ahead[5], 0.01).label == "supported"           # not declared: as before


def test_claim_seeds_in_a_table(tmp_path):
    table = _table(tmp_path, 'claims: ["b > a"]\nclaim_seeds: 6\n', seeds="[0, 1, 2, 3, 4, 5]")
    t = load_table(table, str(tmp_path / "runs"))
    for seed in range(5):
        fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, REFERENCE[seed] / 100])
        fake_run(t.root / f"s-b-s{seed}", resolved_config(table, seed, method="b.yaml"),
                 [0.5, (REFERENCE[seed] + 2.0) / 100])
    resolve(t, [])
    s = summarize(t)
    assert t.claim_seeds == 6 and s.claims[0].label == "not tested yet: 5 of the 6 seeds its claims need"
    assert "the table declares that its claims need 6 seeds (claim_seeds)" in s.markdown()
    for extra, message in (('claims: ["b > a"]\nclaim_seeds: 9\n', "need 9 seeds .* lists 6"),
                           ('claims: ["b > a"]\nclaim_seeds: 1\n', "whole number >= 2"),
                           ("claim_seeds: 6\n", "declares no claims")):
        bad = _table(tmp_path / "bad", extra, seeds="[0, 1, 2, 3, 4, 5]")
        with pytest.raises(config.ConfigError, match=message):
            load_table(bad, str(tmp_path / "runs"))


def test_a_filtered_summary_adjusts_over_the_whole_tables_claims(tmp_path, capsys):
    table = _table(tmp_path, 'claims: ["b > a", "c > a", "c > b"]\n', methods="[a.yaml, b.yaml, c.yaml]")
    (table.parent / "c.yaml").write_text((table.parent / "b.yaml").read_text())
    t = load_table(table, str(tmp_path / "runs"))
    for seed in range(5):
        fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, REFERENCE[seed] / 100])
        fake_run(t.root / f"s-b-s{seed}", resolved_config(table, seed, method="b.yaml"), [0.5, METHOD[seed] / 100])
        fake_run(t.root / f"s-c-s{seed}", resolved_config(table, seed, method="c.yaml"),
                 [0.5, (REFERENCE[seed] + 2 + seed % 2) / 100])
    resolve(t, [])
    whole = {str(x.claim): x for x in summarize(t).claims}
    t.select(None, ["a", "b"], None)
    view = summarize(t)
    (shown,) = view.claims                       # only 'b > a' lies inside the view, adjusted over all three
    assert str(shown.claim) == "b > a" and shown.holm_p == pytest.approx(whole["b > a"].holm_p)
    assert whole["c > a"].result.p < whole["b > a"].result.p and view.family == 3
    assert "Holm's adjustment over all 3 of them (1 shown: this view's settings and methods)" in view.markdown()
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    t.select(None, None, [0, 1, 2])              # a seed filter narrows every claim's seeds, the family stays
    assert [x.result.n for x in summarize(t).claims] == [3, 3, 3]


def test_a_diverged_run_counts_at_the_declared_value_or_is_left_out(tmp_path, capsys):
    nan = {"state": "failed", "error": "NonFiniteLoss: client 1, round 2: the local loss is nan"}
    tables = {}

    def summary(folder: str, extra: str):
        table = tables[folder] = _table(tmp_path / folder, extra)
        t = load_table(table, str(tmp_path / folder / "runs"))
        for seed in range(5):
            fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, REFERENCE[seed] / 100])
            b = fake_run(t.root / f"s-b-s{seed}", resolved_config(table, seed, method="b.yaml"),
                         [0.5, METHOD[seed] / 100])
            if seed == 1:
                (b / "status.json").write_text(json.dumps(nan))
        resolve(t, [])
        return summarize(t)

    left = summary("left", 'claims: ["b > a"]\n')
    assert left.by_seed[("s", "b")].keys() == {0, 2, 3, 4} and left.claims[0].result.n == 4
    assert any("s-b-s1: diverged" in line for line in left.left_out)
    counted = summary("counted", 'claims: ["b > a"]\ndiverged: 10.0\npaper_metric: {kind: last_k, k: 2}\n')
    want = stats.paired({**METHOD, 1: 10.0}, REFERENCE)      # seed 1 at 10 points (its 82 not read), against a's 80
    got = counted.claims[0].result
    assert got.n == 5 and got.mean == pytest.approx(want.mean) and got.p == pytest.approx(want.p)
    assert counted.paired[("s", "b")].mean == pytest.approx(want.mean)
    cell = counted.cells[("s", "b", "final test_acc")]
    assert sorted(cell.values) == sorted([10.0] + [METHOD[k] for k in (0, 2, 3, 4)])
    assert counted.cell_text("s", "b", "paper: mean of last 2 test_acc").endswith("(n=4; no result in 1)")
    assert not any("s-b-s1" in line for line in counted.left_out)
    assert "Diverged runs counted as 10 in final test_acc (the table's declared value" in counted.markdown()
    assert "| b | 80.00 | 10.00 (diverged) | 81.00 | 85.00 | 79.00 |" in counted.seed_tables()
    t = load_table(tables["counted"], str(tmp_path / "counted" / "runs"))
    resolve(t, [])
    t.select(None, ["a"],
             [0, 1, 2, 3, 4])                 # the view holds a only; the claim's family still counts b's seed 1
    view = summarize(t)
    assert view.claims == [] and view.family == 1
    assert "none in this view; 1 more outside this view, in the claims' family" in view.markdown()
    t = load_table(tables["counted"], str(tmp_path / "counted" / "runs"))
    resolve(t, [])
    t.select(None, None, [0, 1, 2])                         # a seed filter keeps the counted seed
    assert summarize(t).claims[0].result.n == 3
    t = load_table(tables["counted"], str(tmp_path / "counted" / "runs"))
    resolve(t, [])
    out = summarize(t, diverged_as="out")                   # the check the other way: the declared value set aside
    assert out.claims[0].result.n == 4 and ("s", "b", 1) not in out.counted
    assert any("left out by --diverged out" in line for line in out.left_out)
    # a table that leaves them out, counted at chance from the command line as a check
    assert table_main([str(tables["left"]), "--runs-root", str(tmp_path / "left" / "runs"), "--summary",
                       "--diverged", "10"]) == 0
    out = capsys.readouterr().out
    assert f"| b > a | s | {want.text(verdict=False)} |" in out
    assert "Diverged runs counted as 10 in final test_acc (--diverged on the command line: a sensitivity check" in out
    with pytest.raises(SystemExit):
        table_main([str(tables["left"]), "--list", "--diverged", "10"])
    assert "--diverged goes with --summary" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["chance", "true", ".nan", ".inf"])
def test_a_declared_diverged_value_must_be_a_finite_number(tmp_path, capsys, value):
    table = _table(tmp_path, f"diverged: {value}\n")
    with pytest.raises(config.ConfigError, match="diverged is the value a diverged run counts as"):
        load_table(table, str(tmp_path / "runs"))
    with pytest.raises(SystemExit):
        table_main([str(_table(tmp_path / "ok")), "--summary", "--diverged", value.strip(".")])
    assert "a finite number (e.g. 10 for chance on ten classes, in points) or 'out'" in capsys.readouterr().err


def test_a_cell_with_fewer_seeds_than_declared_is_marked(tmp_path):
    table = _table(tmp_path)
    t = load_table(table, str(tmp_path / "runs"))
    for seed in range(3):
        fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, 0.6 + seed / 100])
    resolve(t, [])
    assert "(n=3 of 5)" in summarize(t).markdown()


def test_paper_metric_is_shown_beside_the_declared_one_and_best_on_test_is_flagged(tmp_path):
    table = _table(tmp_path, "paper_metric: {kind: best}\n", seeds="[0]", metric="{kind: last_k, k: 2}")
    t = load_table(table, str(tmp_path / "runs"))
    fake_run(t.root / "s-a-s0", resolved_config(table, 0), [0.5, 0.9, 0.6])
    resolve(t, [])
    s = summarize(t)
    assert s.columns == ["mean of last 2 test_acc", "paper: best test_acc"]
    assert s.cells[("s", "a", "mean of last 2 test_acc")].values == pytest.approx([75.0])
    assert s.cells[("s", "a", "paper: best test_acc")].values == pytest.approx([90.0])
    assert "picks each run's best round by the test accuracy itself" in s.markdown()


def test_at_best_reads_test_at_the_best_validation_round_and_groups_and_rounds_columns():
    rows = [{"round": 1, "test_acc": 0.5, "val_acc": 0.4, "per_group_acc": {"A": 0.4, "C": 0.6}},
            {"round": 2, "test_acc": 0.7, "val_acc": 0.6, "per_group_acc": {"A": 0.6, "C": 0.8}},
            {"round": 3, "test_acc": 0.8, "val_acc": 0.5, "per_group_acc": {"A": 0.9, "C": 0.7}}]
    m = results.Metric.parse({"kind": "at_best", "groups": True, "at_rounds": [1, 3]})
    assert results.value(m, rows, {}) == 0.7 and results.at_best(rows) == (0.7, 2)
    assert results.group_values(m, rows) == {"A": 0.6, "C": 0.8}
    assert [results.at_round(rows, r) for r in (1, 2, 3, 9)] == [0.5, 0.7, 0.8, 0.8]
    assert m.columns == ["test_acc at best val_acc", "round 1", "round 3"]
    assert results.Metric.parse(m.to_spec()) == m


# ------------------------------------------------------------------ table files: collisions and bad entries
def test_settings_with_the_same_file_name_do_not_collide(tmp_path):
    folder = tmp_path / "t"
    for sub, beta in (("a", 0.5), ("b", 0.1)):
        (folder / sub).mkdir(parents=True)
        (folder / sub / "qs.yaml").write_text("base: ../s.yaml\ndata: "
                                              f"{{partition: {{name: dirichlet, beta: {beta}, min_size: 2}}}}\n")
    write_table(folder, tmp_path / "data")
    table = folder / "t.table.yaml"
    table.write_text("title: T\nmetric: final_test_acc\nsettings: [a/qs.yaml, b/qs.yaml]\nmethods: [a.yaml]\nseeds: "
                     "[0]\n")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    assert [r.name for r in t.runs] == ["a.qs-a-s0", "b.qs-a-s0"]
    for r in t.runs:
        fake_run(r.path, r.resolved, [0.5, 0.6 if r.setting == "a.qs" else 0.7])
    s = summarize(t)
    assert s.settings == ["a.qs", "b.qs"] and not s.left_out
    assert s.cells[("a.qs", "a", s.columns[0])].values == [60.0]
    assert s.cells[("b.qs", "a", s.columns[0])].values == [70.0]


@pytest.mark.parametrize("body, words", [
    ("settings: [s.yaml, s.yaml]\nmethods: [a.yaml]\nseeds: [0]", "settings lists s.yaml more than once"),
    ("settings: [s.yaml]\nmethods: [a.yaml, ./a.yaml]\nseeds: [0]", "methods lists ./a.yaml, a.yaml more than once"),
    ("settings: [s.yaml]\nmethods: [a.yaml]\nseeds: [0, 0]", "seeds lists 0 more than once"),
    ("settings: [s.yaml]\nmethods: [a.yaml]\nseeds: 5", "seeds must be a list, e.g. seeds: [0, 1, 2, 3, 4]"),
    ("settings: [s.yaml]\nmethods: [a.yaml]\nseeds: [a]", "seeds must be a non-empty list of whole numbers"),
    ("settings: s.yaml\nmethods: [a.yaml]\nseeds: [0]", "settings must be a non-empty list of config files"),
    ("settings: [s.yaml]\nmethods: [a.yaml]\nseeds: [0]\nreference: zz", "reference 'zz' is not one of its methods"),
    ("settings: [s.yaml]\nmethods: [a.yaml]\nseeds: [0]\nclaims: [a >> b]", "a claim is 'method > method'"),
    ("settings: [s.yaml]\nmethods: [a.yaml]\nseeds: [0]\nclaims: [a > zz]", "claim 'a > zz' must compare two of its"),
    ("settings: [s.yaml]\nmethods: [a.yaml]\nseeds: [0]\nclaims: a > zz", "claims must be a non-empty list"),
    ("settings: [s.yaml]\nmethods: [a.yaml]\nseeds: [0]\ntuning: {grid: {train.lr: []}}", "must be a non-empty list"),
    ("settings: [s.yaml]\nmethods: [a.yaml]\nseeds: [0]\ntuning: {grid: {train.lr: [0.1]}, select: {kind: best}}",
     "a choice made on the test set"),
])
def test_bad_table_entries_get_a_message_not_a_traceback(tmp_path, capsys, body, words):
    table = write_table(tmp_path / "t", tmp_path / "data")
    table.write_text("title: T\nmetric: final_test_acc\n" + body + "\n")
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 2
    said = capsys.readouterr().err
    assert words in said
    first = words.split()[0]
    last = body.splitlines()[-1].split(":")[0]
    key = first if first in ("settings", "methods", "seeds", "reference", "claims") else last
    line = next(i for i, text in enumerate(("title: T\nmetric: final_test_acc\n" + body).splitlines(), 1)
                if text.startswith(f"{key}:"))
    assert f"table {table}, line {line}:" in said      # the line of the key at fault


@pytest.mark.parametrize("body, said", [
    ("claim: [a > b]", "line 6: unknown key 'claim'; did you mean 'claims'? Allowed: title, plugins,"),
    ("refrence: a", "line 6: unknown key 'refrence'; did you mean 'reference'?"),
    ("reference: A", "line 6: reference 'A' is not one of its methods (a); did you mean 'a'?"),
])
def test_a_misspelt_table_key_names_its_line_and_the_key_meant(tmp_path, capsys, body, said):
    table = write_table(tmp_path / "t", tmp_path / "data")
    table.write_text("title: T\nmetric: final_test_acc\nsettings: [s.yaml]\nmethods: [a.yaml]\nseeds: [0]\n" + body
                     + "\n")
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 2
    assert f"table {table}, {said}" in capsys.readouterr().err


# ------------------------------------------------------------------ the search
GRID = "tuning: {grid: {train.lr: [0.01, 0.1]}, per_method: {fedprox: {algorithm.mu: [0.01, 0.1]}}, rounds: 3}\n"


def _search_runs(t):
    return {(r.method, r.candidate): r for r in t.search}


EXTENDED = "tuning: {grid: {train.lr: [0.01, 0.1]}, rounds: 3, extend: {train.lr: {factor: 3, bounds: [0.001, 0.5]}}}\n"


def test_a_choice_at_an_extended_keys_end_searches_one_step_beyond_until_inside_or_at_the_bound(tmp_path):
    table = _table(tmp_path, EXTENDED, methods="[a.yaml]", seeds="[0]")
    val = {"lr=0.01": 0.5, "lr=0.1": 0.7, "lr=0.3": 0.8}     # 0.1 wins, then 0.3; 0.9 would leave the bounds

    def step() -> object:
        t = load_table(table, str(tmp_path / "runs"))
        resolve(t, [], record=True)
        for key, r in _search_runs(t).items():
            if key[1] in val and not (r.path / "summary.json").exists():
                _write(r.path, r.resolved, [{"round": i + 1, "val_acc": val[key[1]]} for i in range(3)])
        return t

    first = step()
    assert sorted(c for _, c in _search_runs(first)) == ["lr=0.01", "lr=0.1"] and first.pending == {("s", "a")}
    second = step()       # 0.1 was the largest of 2: the search adds 0.3
    assert sorted(c for _, c in _search_runs(second)) == ["lr=0.01", "lr=0.1", "lr=0.3"]
    assert second.pending == {("s", "a")}
    done = step()         # 0.3 is the largest of 3, and 0.9 lies beyond 0.5: the choice stands
    choice = done.choices[("s", "a")]
    assert choice.chosen == {"train.lr": 0.3} and not done.pending
    assert choice.record["extended"] == ["train.lr=0.1 was the largest of 2: tried 0.3"]
    text = summarize(done).markdown()
    assert "the grid extended (tuning.extend): train.lr=0.1 was the largest of 2: tried 0.3" in text
    assert "the next value would leave its bounds" in text
    for extend, words in (("{algorithm.mu: {factor: 3, bounds: [0.1, 1]}}", "not a key of the search's grids"),
                          ("{train.lr: {factor: 1, bounds: [0.001, 1]}}", "factor must be a number > 1"),
                          ("{train.lr: {factor: 2, bounds: [0.05, 1]}}", "outside its bounds"),
                          ("{train.lr: {factor: 2}}", "must give factor and bounds")):
        bad = _table(tmp_path / "bad", f"tuning: {{grid: {{train.lr: [0.01, 0.1]}}, extend: {extend}}}\n",
                     methods="[a.yaml]", seeds="[0]")
        with pytest.raises(config.ConfigError, match=words):
            load_table(bad, str(tmp_path / "runs"))


def search_extended(table: Path, runs: Path, val: dict[str, float], made=lambda path, candidate: None):
    """``table``'s search run to its choice, its grid extended as it goes: each candidate's runs
    score ``val[candidate]`` in every round (``made`` is called on each run written); the table."""
    for _ in range(len(val)):
        t = load_table(table, str(runs))
        resolve(t, [], record=True)
        for r in t.search:
            if not (r.path / "summary.json").exists():
                _write(r.path, r.resolved, [{"round": i + 1, "val_acc": val[r.candidate]} for i in range(3)])
                made(r.path, r.candidate)
    return t


def test_the_search_table_orders_an_extensions_columns_by_value(tmp_path):
    """A step below the grid (lr 0.00333, added after 0.01 won) is the first column, not the last."""
    table = _table(tmp_path, EXTENDED, methods="[a.yaml]", seeds="[0]")
    t = search_extended(table, tmp_path / "runs", {"lr=0.01": 0.7, "lr=0.1": 0.5, "lr=0.00333": 0.6})
    assert not t.pending and search_table(t).splitlines()[2:] == [
        "| setting | method | lr=0.00333 | lr=0.01 | lr=0.1 |", "| --- | --- | --- | --- | --- |",
        "| s | a | 60.00 | **70.00** | 50.00 |"]
    assert grid_columns([{"values": {"train.lr": 0.1, "algorithm.kind": k}} for k in ("b", "a")] +
                        [{"values": {"train.lr": 0.01, "algorithm.kind": "b"}}], ["train.lr", "algorithm.kind"]) \
        == ["lr=0.01+kind=b", "lr=0.1+kind=b", "lr=0.1+kind=a"]          # numbers ascending, the rest as first seen


def test_a_choice_made_before_the_table_declared_extend_extends_too(tmp_path):
    plain = "tuning: {grid: {train.lr: [0.01, 0.1]}, rounds: 3}\n"
    table = _table(tmp_path, plain, methods="[a.yaml]", seeds="[0]")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [], record=True)
    for r in t.search:
        _write(r.path, r.resolved, [{"round": i + 1, "val_acc": 0.7 if r.candidate == "lr=0.1" else 0.5}
                                    for i in range(3)])
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [], record=True)
    assert t.choices[("s", "a")].chosen == {"train.lr": 0.1} and not t.pending       # at the edge, recorded
    table.write_text(table.read_text().replace(plain, EXTENDED))
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [], record=True)
    assert t.pending == {("s", "a")} and ("s", "a") not in t.choices
    assert sorted(c for _, c in _search_runs(t)) == ["lr=0.01", "lr=0.1", "lr=0.3"]
    assert [(r.candidate, settled(r.path)) for r in t.search if r.candidate == "lr=0.3"] == [("lr=0.3", False)]


def test_tune_runs_the_extended_candidates_as_they_appear(tmp_path, capsys, monkeypatch):
    table = _table(tmp_path, EXTENDED, methods="[a.yaml]", seeds="[0]")
    val = {"lr=0.01": 0.5, "lr=0.1": 0.7, "lr=0.3": 0.8}
    passes = []

    def run_all(runs, *rest):
        passes.append(sorted(r.candidate for r in runs if not (r.path / "summary.json").exists()))
        for r in runs:
            if not (r.path / "summary.json").exists():
                _write(r.path, r.resolved, [{"round": i + 1, "val_acc": val[r.candidate]} for i in range(3)])
        return 0, 0
    monkeypatch.setattr("mpifed.tables.running.run_all", run_all)
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--tune", "0"]) == 0
    assert passes == [["lr=0.01", "lr=0.1"], ["lr=0.3"]]
    assert "the grid extended (tuning.extend): train.lr=0.1 was the largest of 2: tried 0.3" in capsys.readouterr().out


def test_search_chooses_on_validation_and_the_choice_is_part_of_the_runs_identity(tmp_path, capsys):
    table = _table(tmp_path, GRID, seeds="[0, 1]", metric="{kind: last_k, k: 2}")
    root = ["--runs-root", str(tmp_path / "runs")]
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    runs = _search_runs(t)
    assert sorted(runs) == [("a", "lr=0.01"), ("a", "lr=0.1"), ("b", "lr=0.01+mu=0.01"), ("b", "lr=0.01+mu=0.1"),
                            ("b", "lr=0.1+mu=0.01"), ("b", "lr=0.1+mu=0.1")]
    assert all(r.seed == 0 and r.root == t.root / "tuning" for r in t.search)     # the first seed, its own folder
    assert runs[("a", "lr=0.1")].resolved["train"]["rounds"] == 3 and t.pending == {("s", "a"), ("s", "b")}
    assert table_main([str(table), *root, "--list"]) == 0
    assert "4 runs of 2 setting x method pairs wait for their search" in capsys.readouterr().out

    # validation says lr 0.01 for a (the test set would say 0.1), and for b lr 0.1 / mu 0.01
    val = {("a", "lr=0.01"): 0.8, ("a", "lr=0.1"): 0.7, ("b", "lr=0.01+mu=0.01"): 0.6, ("b", "lr=0.01+mu=0.1"): 0.65,
           ("b", "lr=0.1+mu=0.01"): 0.9}
    for key, r in runs.items():
        if key in val:
            rows = [{"round": i + 1, "val_acc": val[key], "test_acc": 1.0 - val[key]} for i in range(3)]
            _write(r.path, r.resolved, rows)
    partial = load_table(table, str(tmp_path / "runs"))
    resolve(partial, [])                          # b's search lacks a candidate: its scores so far, no choice
    assert partial.pending == {("s", "b")} and search_table(partial).splitlines()[2:] == [
        "| setting | method | lr=0.01 | lr=0.1 |", "| --- | --- | --- | --- |",
        "| s | a | **80.00** | 70.00 |",
        "| s | b (search not finished: 3 of 4 candidates) | mu=0.01: 60.00; mu=0.1: 65.00 | mu=0.01: 90.00; mu=0.1: - "
        "|"]
    assert "s x b: search not finished, 3 of 4 candidates scored" in summarize(partial).markdown()
    r = runs[("b", "lr=0.1+mu=0.1")]
    _write(r.path, r.resolved, [], status={"state": "failed", "error": "NonFiniteLoss: client 1, round 2: the local "
                                                                       "loss is nan"})

    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [], record=True)
    assert {k: c.chosen for k, c in t.choices.items()} == {("s", "a"): {"train.lr": 0.01},
                                                          ("s", "b"): {"train.lr": 0.1, "algorithm.mu": 0.01}}
    book = yaml.safe_load((t.root / "choices.yaml").read_text())
    b = next(e for e in book if e["method"] == "b")
    assert [c["score"] for c in b["candidates"]] == [0.6, 0.65, 0.9, None]
    assert "diverged" in b["candidates"][3]["note"]
    assert search_table(t).splitlines()[2:] == [      # the method's own values inside the grid's columns
        "| setting | method | lr=0.01 | lr=0.1 |", "| --- | --- | --- | --- |",
        "| s | a | **80.00** | 70.00 |",
        "| s | b | mu=0.01: 60.00; mu=0.1: 65.00 | **mu=0.01: 90.00**; mu=0.1: diverged |"]
    final = {r.method: r for r in t.runs if r.seed == 1}
    assert final["a"].name == "s-a-s1" and final["a"].resolved["train"]["lr"] == 0.01
    assert final["b"].resolved["train"]["lr"] == 0.1 and final["b"].resolved["algorithm"]["mu"] == 0.01
    assert final["b"].resolved["train"]["rounds"] == 2                      # the table's horizon, not the search's
    assert "--set run.seed=1" in " ".join(final["b"].args([])) and "algorithm.mu=0.01" in final["b"].args([])

    # a run made before the choice (the default lr) is another configuration: not counted, said why
    fake_run(t.root / "s-a-s0", resolved_config(table, 0), [0.5, 0.6])
    resolve(t, [])
    s = summarize(t)
    assert any("train.lr=0.05 (here 0.01)" in line for line in s.left_out)
    text = s.markdown()
    assert "Tuned on the validation set (mean of last 2 val_acc, mean over seeds [0], 3 rounds)" in text
    assert "s x a: lr=0.01 (of lr=0.01: 80.00; lr=0.1: 70.00); at the grid's edge (lr=0.01, the smallest of 2)" in text
    assert "mu=0.01: 90.00; lr=0.1+mu=0.1: diverged in s-b-lr=0.1+mu=0.1-s0); at the grid's edge " \
           "(lr=0.1, the largest of 2; mu=0.01, the smallest of 2)" in text

    # another grid is another search: the recorded choice is not reused
    table.write_text(table.read_text().replace("[0.01, 0.1]}, per_method", "[0.01, 0.03]}, per_method"))
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    assert t.pending == {("s", "a"), ("s", "b")} and not t.choices


def test_a_choice_inside_its_grid_is_not_at_an_edge():
    def choice(chosen: dict) -> SearchChoice:
        values = [{"train.lr": lr, "algorithm.loss": name} for lr in (0.01, 0.03, 0.1) for name in ("ce", "kl")]
        return SearchChoice("s", "m", "digest", chosen, {"candidates": [{"values": v, "score": 0.5} for v in values]})
    assert choice({"train.lr": 0.03, "algorithm.loss": "kl"}).edges() == []
    assert choice({"train.lr": 0.1, "algorithm.loss": "ce"}).edges() == ["lr=0.1, the largest of 3"]
    alone = {"candidates": [{"values": {"train.lr": 0.1}}]}
    assert SearchChoice("s", "m", "digest", {"train.lr": 0.1}, alone).edges() == []
    assert SearchChoice("s", "m", "digest", {"train.lr": 0.1}, {"candidates": []}).edges() == []
    pairs = [{"algorithm": {"beta": b, "gamma": g}} for b, g in ((0.1, 1.0), (0.3, 0.5), (0.5, 2.0))]   # pairs
    tried = {"candidates": [{"values": v} for v in pairs]}
    assert SearchChoice("s", "m", "digest", pairs[0], tried).edges() == ["beta=0.1, the smallest of 3"]
    assert SearchChoice("s", "m", "digest", pairs[1], tried).edges() == ["gamma=0.5, the smallest of 3"]
    assert SearchChoice("s", "m", "digest", {"algorithm": {"beta": 0.3, "gamma": 1.0}}, tried).edges() == []


def test_a_filtered_table_waits_only_for_its_own_searches(tmp_path, capsys, monkeypatch):
    table = _table(tmp_path, GRID, seeds="[0, 1]", metric="{kind: last_k, k: 2}")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    for (method, candidate), r in _search_runs(t).items():
        if method == "a":
            _write(r.path, r.resolved,
                   [{"round": i + 1, "val_acc": 0.5 + (candidate == "lr=0.1") / 10} for i in range(3)])
    started = []
    monkeypatch.setattr("mpifed.tables.running.run_all", lambda runs, *rest: (started.extend(runs), (0, 0))[1])
    root = ["--runs-root", str(tmp_path / "runs")]
    assert table_main([str(table), *root, "--methods", "a", "--run", "0"]) == 0      # b's search is not needed
    assert [(r.method, r.seed, r.candidate) for r in started] == [("a", 0, None), ("a", 1, None)]
    out = capsys.readouterr().out
    assert "s x a: lr=0.1" in out and "s x b" not in out
    started.clear()
    assert table_main([str(table), *root, "--run", "0"]) == 0                        # the whole table waits for it
    assert all(r.candidate for r in started) and "b" in {r.method for r in started}   # the search only


def test_write_runs_lists_the_search_runs_left_to_run(tmp_path, capsys):
    table = _table(tmp_path, GRID)
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    runs = _search_runs(t)
    for candidate in ("lr=0.01", "lr=0.1"):
        r = runs[("a", candidate)]
        _write(r.path, r.resolved, [{"round": i + 1, "val_acc": 0.5} for i in range(3)])
    r = runs[("b", "lr=0.1+mu=0.1")]        # diverged: settled, running it again diverges again
    _write(r.path, r.resolved, [], status={"state": "failed", "error": "NonFiniteLoss: client 1, round 2: the local "
                                                                       "loss is nan"})
    listed = tmp_path / "runs.txt"
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--write-runs", str(listed)]) == 0
    assert "3 search runs written" in capsys.readouterr().out
    names = [line.split("run.name=")[1].split()[0] for line in listed.read_text().splitlines()]
    assert names == ["s-b-lr=0.01+mu=0.01-s0", "s-b-lr=0.01+mu=0.1-s0", "s-b-lr=0.1+mu=0.01-s0"]


def test_a_search_needs_a_validation_set(tmp_path, capsys):
    table = _table(tmp_path, GRID)
    setting = table.parent / "s.yaml"
    setting.write_text(setting.read_text().replace("  val_size: 20\n", ""))
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 2
    assert "the search chooses on the validation set (val_acc) but the setting holds none; set data.val_size" in \
        capsys.readouterr().err


@pytest.mark.e2e
def test_run_searches_first_then_runs_the_table_with_the_choice(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    table = _table(tmp_path, "tuning: {grid: {train.lr: [0.001, 0.5]}, rounds: 2}\n", seeds="[0, 1]",
                   metric="{kind: at_best}", methods="[a.yaml]")
    root = ["--runs-root", str(tmp_path / "runs")]
    assert table_main([str(table), *root, "--run", "0"]) == 0
    out = capsys.readouterr().out
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    (choice,) = t.choices.values()
    book = yaml.safe_load((t.root / "choices.yaml").read_text())
    scores = [c["score"] for c in book[0]["candidates"]]
    assert choice.chosen == {"train.lr": [0.001, 0.5][scores.index(max(scores))]}
    for r in t.runs:
        assert RunDir(r.path).status()["state"] == "finished"
        assert yaml.safe_load((r.path / "config.yaml").read_text())["train"]["lr"] == choice.chosen["train.lr"]
        assert any("test_acc" in row for row in results.read_rows(r.path))
    for r in t.search:                                  # the search chooses on validation: no test set evaluated
        rows = results.read_rows(r.path)
        assert any("val_acc" in row for row in rows) and not any("test_acc" in row for row in rows)
    assert "Tuned on the validation set (best val_acc, mean over seeds [0], 2 rounds)" in out
    assert "test_acc at best val_acc" in out and "Machine: " in out
    capsys.readouterr()
    assert table_main([str(table), *root, "--run", "0"]) == 0             # done: nothing runs again
    assert "[mpifed.table] run " not in capsys.readouterr().out


def test_overrides_of_searched_keys_are_refused(tmp_path, capsys):
    table = _table(tmp_path, GRID)
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list", "--set", "train.lr=0.2"]) == 2
    assert "the table searches this key itself" in capsys.readouterr().err


def _write(path: Path, d: dict, rows: list[dict], status: dict | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(d))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "status.json").write_text(json.dumps(status or {"state": "finished"}))
    (path / "summary.json").write_text(json.dumps({"wall_time_s": 30.0}))


# ------------------------------------------------------------------ filters, ETA, runs killed or held elsewhere
def test_the_estimate_scales_the_nearest_finished_runs_seconds_per_round_to_each_runs_rounds(tmp_path, capsys):
    table = _table(tmp_path, "tuning: {grid: {train.lr: [0.01, 0.1]}, rounds: 1}\n", seeds="[0, 1]")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 0
    assert "no estimate of the time left yet: none of the table's runs has finished" in capsys.readouterr().out
    done = t.search[0]                                     # a's first candidate: 1 round in 20 s
    assert (done.method, done.resolved["train"]["rounds"], t.runs[0].resolved["train"]["rounds"]) == ("a", 1, 2)
    _write(done.path, done.resolved, [{"round": 1, "val_acc": 0.5}])
    (done.path / "summary.json").write_text(json.dumps({"wall_time_s": 20.0}))
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 0
    # a's other candidate 20 s, b's two (the setting's searches) 40 s, the four final runs of 2 rounds 160 s
    assert ("estimated time left, one run at a time: 4m for 7 runs, 4 of them after their search, from 1 finished "
            "runs' seconds per round and local epoch") in capsys.readouterr().out


def test_the_estimate_takes_the_median_so_a_run_slowed_by_other_work_weighs_little(tmp_path, capsys):
    table = _table(tmp_path, "tuning: {grid: {train.lr: [0.01, 0.03, 0.1, 0.3]}, rounds: 1}\n", seeds="[0]",
                   methods="[a.yaml]")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    for r, wall in zip(t.search, (20.0, 200.0, 20.0)):     # the second paused beside other work
        _write(r.path, r.resolved, [{"round": 1, "val_acc": 0.5}])
        (r.path / "summary.json").write_text(json.dumps({"wall_time_s": wall}))
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 0
    # the last candidate 20 s and the final run (2 rounds) 40 s; the mean, 80 s a round, would say 4m
    assert "estimated time left, one run at a time: 1m for 2 runs, 1 of them after their search, from 3 finished" in \
        capsys.readouterr().out


def test_the_estimate_scales_another_settings_runs_by_their_local_epochs(tmp_path, capsys):
    table = _table(tmp_path, "tuning: {grid: {train.lr: [0.01, 0.1]}, rounds: 1}\n", seeds="[0]", methods="[a.yaml]")
    (table.parent / "s3.yaml").write_text("base: s.yaml\ntrain: {local_epochs: 3}\n")
    table.write_text(table.read_text().replace("settings: [s.yaml]", "settings: [s.yaml, s3.yaml]"))
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    done = t.search[0]                                     # s, lr 0.01: 1 round of 1 local epoch in 20 s
    assert done.setting == "s" and t.runs[1].resolved["train"]["local_epochs"] == 3
    _write(done.path, done.resolved, [{"round": 1, "val_acc": 0.5}])
    (done.path / "summary.json").write_text(json.dumps({"wall_time_s": 20.0}))
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 0
    # s: its other candidate 20 s, its final run (2 rounds) 40 s; s3 (3 epochs): two candidates 60 s each, 120 s final
    assert ("estimated time left, one run at a time: 5m for 5 runs, 2 of them after their search, from 1 finished "
            "runs' seconds per round and local epoch") in capsys.readouterr().out


def test_the_estimate_prices_unmeasured_local_epochs_from_the_nearest_measured_ones(tmp_path, capsys):
    table = _table(tmp_path, seeds="[0]", methods="[a.yaml]")
    for epochs in (10, 20):
        (table.parent / f"s{epochs}.yaml").write_text(f"base: s.yaml\ntrain: {{local_epochs: {epochs}}}\n")
    table.write_text(table.read_text().replace("settings: [s.yaml]", "settings: [s.yaml, s10.yaml, s20.yaml]"))
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    for r, wall in zip(t.runs[:2], (20.0, 100.0)):        # 2 rounds: 10 s a round at E = 1, 5 s a round-epoch at E = 10
        _write(r.path, r.resolved, [{"round": 1, "test_acc": 0.5}])
        (r.path / "summary.json").write_text(json.dumps({"wall_time_s": wall}))
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 0
    # E = 20's run, 2 rounds x 20 epochs at E = 10's 5 s: 200 s (both runs' median, 7.5 s, would say 5m)
    assert "estimated time left, one run at a time: 3m for 1 runs, from 2 finished" in capsys.readouterr().out


def test_filters_select_part_of_the_table_and_list_estimates_the_time_left(tmp_path, capsys):
    table = _table(tmp_path, seeds="[0, 1, 2]")
    root = ["--runs-root", str(tmp_path / "runs")]
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    _write(t.root / "s-a-s0", t.runs[0].resolved, [{"round": 1, "test_acc": 0.5}])
    assert table_main([str(table), *root, "--list", "--commands", "--methods", "a", "--seeds", "1", "2"]) == 0
    out = capsys.readouterr().out
    assert "run.name=s-a-s1" in out and "run.name=s-a-s2" in out and "s-b-" not in out and "s-a-s0" not in out
    assert ("estimated time left, one run at a time: 1m for 2 runs, from 1 finished runs' seconds per round and "
            "local epoch") in out
    _write(t.root / "s-a-s1", t.runs[1].resolved, [],
           status={"state": "failed", "error": "NonFiniteLoss: client 1, round 2: the local loss is nan"})
    assert table_main([str(table), *root, "--list", "--methods", "a"]) == 0    # a diverged run is not run again
    assert ("estimated time left, one run at a time: 1m for 1 runs, from 1 finished runs' seconds per round and "
            "local epoch") in capsys.readouterr().out
    assert table_main([str(table), *root, "--list", "--methods", "zz"]) == 2
    assert "--methods zz: not in this table (its methods: a b)" in capsys.readouterr().err


def test_a_run_killed_before_its_first_status_lists_as_failed_not_new(tmp_path, capsys):
    table = _table(tmp_path, seeds="[0]")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    t.runs[0].path.mkdir(parents=True)
    (t.runs[0].path / "config.yaml").write_text(yaml.safe_dump(t.runs[0].resolved))
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list", "--commands"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "failed" and lines[1].split()[0] == "new"
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 0
    grid = capsys.readouterr().out.splitlines()
    assert grid[1].split() == ["setting", "method", "s0"] and grid[2].split() == ["s", "a", "failed"], grid


@pytest.mark.e2e
def test_a_run_held_by_another_process_is_skipped_not_the_end_of_the_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    table = _table(tmp_path, seeds="[0]")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    held = t.runs[0].path
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from mpifed.run.rundir import RunDir; RunDir(Path(sys.argv[1])).lock(); print('held', "
                               "flush=True); time.sleep(120)", str(held)], env=env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--run", "0"]) == 0
    finally:
        holder.kill()
        holder.wait()
    out = capsys.readouterr().out
    assert "s-a-s0: another process is running it" in out and "1 runs were skipped" in out
    assert RunDir(t.runs[1].path).status()["state"] == "finished"


@pytest.mark.e2e
def test_ctrl_c_during_a_table_run_stops_the_run_cleanly_and_says_how_to_go_on(tmp_path):
    table = _table(tmp_path, seeds="[0]")
    table.parent.joinpath("s.yaml").write_text(table.parent.joinpath("s.yaml").read_text().replace(
        "train: {rounds: 2, local_epochs: 1", "train: {rounds: 6, local_epochs: 20"))
    cmd = [sys.executable, "-m", "mpifed.table", str(table), "--runs-root", str(tmp_path / "runs"), "--run", "0"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out, deadline = [], time.time() + 240
    for line in proc.stdout:
        out.append(line)
        if "round 1/6" in line:
            os.killpg(proc.pid, signal.SIGINT)          # what Ctrl-C in a terminal sends
            break
    rest, _ = proc.communicate(timeout=max(1.0, deadline - time.time()))
    text = "".join(out) + rest
    assert proc.returncode == 75, text
    run = tmp_path / "runs" / "t-t" / "s-a-s0"
    assert RunDir(run).status()["state"] == "stopped" and list((run / "checkpoints").glob("round_*.ckpt"))
    assert "Traceback" not in text
    assert "SIGINT received: the table stopped after the runs in progress" in text
    assert "mpifed.table" in text.split("Continue it with:")[1]
    assert not (tmp_path / "runs" / "t-t" / "s-b-s0").exists()


def test_summary_flags_runs_from_more_than_one_machine(tmp_path):
    table = _table(tmp_path, seeds="[0, 1]", methods="[a.yaml]")
    t = load_table(table, str(tmp_path / "runs"))
    for seed, cpu in ((0, "AMD EPYC 7763"), (1, "Intel Xeon 8380")):
        run = fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, 0.6])
        (run / "provenance.json").write_text(json.dumps({"segments": [
            {"torch": "2.14.1", "ranks": [{"rank": 0, "host": "n1", "cpu": cpu, "gpu": None}]}]}))
    resolve(t, [])
    text = summarize(t).markdown()
    assert "WARNING: these runs come from 2 machines" in text and "AMD EPYC 7763" in text and "Intel Xeon 8380" in text


def test_summary_says_one_machine_model_where_runs_differ_only_in_what_they_record(tmp_path):
    table = _table(tmp_path, seeds="[0, 1, 2]", methods="[a.yaml]")
    t = load_table(table, str(tmp_path / "runs"))
    for seed, (host, cpu_id) in enumerate((("n1", "family 25 model 1"), ("n2", "family 25 model 1"), ("n1", None))):
        _machine(fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, 0.6]), host, cpu_id)
    resolve(t, [])
    text = summarize(t).markdown()
    assert "WARNING" not in text
    assert "Machine model: one, as far as the runs record it (n1; CPU AMD EPYC (family 25 model 1)" in text
    assert "the lines differ only where a run does not record a field" in text


def _machine(run: Path, host: str, cpu_id: str | None) -> None:
    (run / "provenance.json").write_text(json.dumps({"segments": [
        {"torch": "2.14.1", "ranks": [{"rank": 0, "host": host, "cpu": "AMD EPYC", "cpu_id": cpu_id,
                                       "blas": "mkl"}]}]}))


def test_runs_of_one_seed_from_different_machines_are_not_paired_unless_told(tmp_path):
    table = _table(tmp_path, 'claims: ["b > a"]\n')
    t = load_table(table, str(tmp_path / "runs"))
    for seed in range(5):
        a = fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, REFERENCE[seed] / 100])
        b = fake_run(t.root / f"s-b-s{seed}", resolved_config(table, seed, method="b.yaml"),
                     [0.5, (REFERENCE[seed] + 2.0) / 100])
        _machine(a, "n1", "family 25 model 1 stepping 1 flags 3f2a")
        # another host of the same hardware pairs; seed 3's b ran on other hardware; seed 4's b on a run
        # from before cpu_id was recorded, which pairs with anything
        _machine(b, "n2", {3: "family 6 model 106 stepping 6 flags 9e1b", 4: None}.get(
            seed, "family 25 model 1 stepping 1 flags 3f2a"))
    resolve(t, [])
    s = summarize(t)
    why = ("seed 3's runs of b and a come from different machines (cpu_id family 6 model 106 stepping 6 flags 9e1b "
           "against family 25 model 1 stepping 1 flags 3f2a)")
    assert s.unpaired[("s", "b")].startswith(why) and "--mixed-machines" in s.unpaired[("s", "b")]
    assert s.claims[0].result is None and s.claims[0].label.startswith(f"not paired: {why}")
    assert f"not paired: {why}" in s.markdown()
    told = summarize(t, mixed_machines=True)
    assert told.unpaired == {} and told.claims[0].label == "supported" and told.claims[0].result.n == 5
    assert ("1 of 10 runs record no CPU family, model and flags (made before mpifed recorded them): whether they "
            "share a machine with the others cannot be checked, so they are paired with them.") in s.markdown()


def test_the_summary_gives_each_settings_local_steps_beside_the_papers(tmp_path):
    table = _table(tmp_path, "paper_local_steps: 50\n", seeds="[0, 1]")
    t = load_table(table, str(tmp_path / "runs"))
    for seed in range(2):
        for method in ("a", "b"):
            run = fake_run(t.root / f"s-{method}-s{seed}", resolved_config(table, seed, method=f"{method}.yaml"),
                           [0.5, 0.6])
            (run / "clients.jsonl").write_text("".join(json.dumps({"round": r, "clients": [
                {"cid": 0, "steps": 4}, {"cid": 1, "steps": 6 + seed}]}) + "\n" for r in (1, 2)))
    resolve(t, [])
    assert t.paper_local_steps == {"*": 50.0}
    assert ("Local work, steps per client a round (the mean over every client-round of the runs' clients.jsonl): "
            "s 5.2 (the paper's 50: 0.1x).") in summarize(t).markdown()
    for extra, message in (("paper_local_steps: {nope: 5}\n", "not its settings"),
                           ("paper_local_steps: 0\n", "a number > 0")):
        with pytest.raises(config.ConfigError, match=message):
            load_table(_table(tmp_path / "bad", extra), str(tmp_path / "runs"))


def test_values_that_go_together_are_one_grid_entry(tmp_path, capsys):
    table = _table(tmp_path, "tuning: {per_method: {b: {algorithm: [{mu: 0.01}, {mu: 0.1}]}}}\n", seeds="[0]")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    runs = _search_runs(t)
    assert sorted(runs) == [("b", "mu=0.01"), ("b", "mu=0.1")]             # a has no grid: nothing to search
    assert t.pending == {("s", "b")} and t.choices[("s", "a")].chosen == {}
    assert runs[("b", "mu=0.1")].resolved["algorithm"] == {**runs[("b", "mu=0.01")].resolved["algorithm"], "mu": 0.1}
    assert runs[("b", "mu=0.1")].resolved["algorithm"]["name"] == "fedprox"
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list", "--set", "algorithm.mu=0.2"]) == 2
    assert "the table searches this key itself" in capsys.readouterr().err


@pytest.mark.e2e
def test_parallel_runs_share_the_table_and_keep_each_runs_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    table = _table(tmp_path, seeds="[0, 1]")
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--run", "0", "--parallel", "3"]) == 0
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    assert all(RunDir(r.path).status()["state"] == "finished" for r in t.runs)
    logs = sorted(p.name for p in (t.root / "logs").iterdir())
    assert logs == sorted(f"{r.name}.txt" for r in t.runs)
    assert all("finished" in (t.root / "logs" / name).read_text() for name in logs)
    out = capsys.readouterr().out
    assert "(n=2 of 5)" not in out and "| b |" in out


def test_the_distribution_free_checks_by_hand():
    # d = 1, 2, 3: of the 8 sign patterns only +++ and --- have |mean| >= 2
    assert stats.sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)
    # d = 3, -1, 2, 2 (sum 6): of the 16 sign patterns, |sum| >= 6 only for the observed one, the one with
    # the -1 flipped (sum 8) and their two mirror images
    assert stats.sign_flip_p([3.0, -1.0, 2.0, 2.0]) == pytest.approx(4 / 16)
    assert stats.smallest_sign_flip_p(5) == 0.0625 and stats.smallest_sign_flip_p(6) == pytest.approx(0.03125)
    low, high = stats.bootstrap_interval([1.0, 2.0, 3.0, 2.5, 1.5])
    assert 1.0 <= low < 2.0 < high <= 3.0
    five = stats.paired({s: 1.0 + s for s in range(5)}, dict.fromkeys(range(5), 0.0))
    assert five.p < 0.05 and five.p_sign_flip == pytest.approx(0.0625)
    assert "sign-flip p = 0.062 (n = 5: never below 0.062); bootstrap range of the mean [+" in five.distribution_free()
    six = stats.paired({s: 1.0 + s for s in range(6)}, dict.fromkeys(range(6), 0.0))
    assert "never below" not in six.distribution_free() and six.p_sign_flip == pytest.approx(0.03125)


def test_a_sampled_sign_flip_p_counts_the_observed_pattern_and_is_never_zero():
    twenty = [1.0 + i / 10 for i in range(20)]          # above EXACT_UP_TO: random patterns, none as far
    assert stats.sign_flip_p(twenty) == pytest.approx(1 / (stats.PATTERNS + 1))
    assert stats.sign_flip_p([0.0] * 20) == 1.0


def test_the_bootstrap_enumerates_every_resample_at_a_few_seeds():
    # d = 0, 1 (n = 2): the 4 ordered resamples have means 0, 0.5, 0.5, 1; the inverted-CDF 2.5% and
    # 97.5% quantiles are the smallest means whose share reaches them: 0 (1/4) and 1 (4/4)
    assert stats.bootstrap_interval([0.0, 1.0]) == (0.0, 1.0)
    # n = 3, d = 0, 0, 3: means 0 (8 of 27), 1 (12), 2 (6), 3 (1): 2.5% -> 0, 97.5% (26.3 of 27) -> 3
    assert stats.bootstrap_interval([0.0, 0.0, 3.0]) == (0.0, 3.0)
    assert stats.bootstrap_interval([0.0, 0.0, 3.0], level=0.5) == (0.0, 2.0)   # 25% -> 0, 75% (20.25) -> 2
    five = [1.0, 2.0, 3.0, 2.5, 1.5]
    assert stats.bootstrap_interval(five) == stats.bootstrap_interval(list(reversed(five)))   # no random draw


def test_a_setting_declared_not_a_test_keeps_its_claims_in_the_family_and_out_of_the_counts():
    from mpifed.tables.summary import Claim, check_claims, label_counts
    values = {("e1", "a"): {s: 1.0 + s for s in range(5)}, ("e1", "b"): dict.fromkeys(range(5), 0.0),
              ("e5", "a"): {s: 3.0 + s for s in range(5)}, ("e5", "b"): dict.fromkeys(range(5), 0.0)}
    claim = [Claim("a", "b")]
    plain = check_claims(claim, ["e1", "e5"], values)
    marked = check_claims(claim, ["e1", "e5"], values, not_a_test={"e1": "one local step: a reduces to b"})
    assert [t.holm_p for t in marked] == [t.holm_p for t in plain]          # the family is as declared
    assert marked[0].label == "not a test: one local step: a reduces to b" and marked[1].label == "supported"
    assert label_counts([t.label for t in marked]) == "1 supported, 1 not a test"
    assert label_counts(["supported", "supported, by the t-test's normality alone (5 seeds cannot reach a "
                         "sign-flip p < 0.05)", "the other way by its interval alone, not after Holm",
                         "inconclusive", "not tested yet: 3 of the 5 seeds its claims need"]) == (
        "2 supported (1 by the t-test's normality alone), 1 by their interval alone, not after Holm, "
        "1 inconclusive, 1 not tested (no result, not paired or too few seeds)")


@pytest.mark.parametrize("spec,said", [
    ({"nowhere": "why"}, "not_a_test names nowhere, which are not its settings"),
    ({"s": ""}, "not_a_test: say why the claims of s test nothing"),
    (["s"], "not_a_test maps settings to why their claims test nothing"),
])
def test_a_bad_not_a_test_is_refused_naming_the_fix(tmp_path, spec, said):
    from mpifed.settings.config import ConfigError
    from mpifed.tables.table_file import load_table
    (tmp_path / "s.yaml").write_text("train: {rounds: 1}\n")
    (tmp_path / "a.yaml").write_text("algorithm: fedavg\n")
    (tmp_path / "b.yaml").write_text("algorithm: fedprox\n")
    import yaml
    (tmp_path / "t.table.yaml").write_text(yaml.safe_dump(
        {"settings": ["s.yaml"], "methods": ["a.yaml", "b.yaml"], "seeds": [0, 1], "metric": "final_test_acc",
         "claims": ["a > b"], "not_a_test": spec}))
    with pytest.raises(ConfigError, match=said):
        load_table(tmp_path / "t.table.yaml")


def _with_client_accuracies(run: Path, worst: list[float]) -> None:
    """Give a hand-written run the per-client figures data.client_holdout records: each evaluated row's
    client_acc, and summary.json's final_client_acc (the last)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row, w in zip(rows, worst):
        row["client_acc"] = {"mean": w + 0.2, "std": 0.05, "median": w + 0.25, "min": w - 0.05, "worst10": w}
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = json.loads((run / "summary.json").read_text())
    summary["final_client_acc"] = rows[-1]["client_acc"]
    (run / "summary.json").write_text(json.dumps(summary))


@pytest.mark.parametrize("metric, cell", [("final_client_acc.worst10", "41.00 ± 0.00 (n=2)"),
                                          ("{kind: last_k, k: 2, column: client_acc.worst10}", "40.50 ± 0.00 (n=2)"),
                                          ("final_client_acc.median", "66.00 ± 0.00 (n=2)")])
def test_a_per_client_statistic_is_a_tables_metric(tmp_path, metric, cell):
    table = _table(tmp_path, seeds="[0, 1]", methods="[a.yaml]", metric=metric)
    t = load_table(table, str(tmp_path / "runs"))
    for seed in (0, 1):
        run = fake_run(t.root / f"s-a-s{seed}", resolved_config(table, seed), [0.5, 0.6])
        _with_client_accuracies(run, [0.40, 0.41])
    resolve(t, [])
    assert f"| a | {cell} |" in summarize(t).markdown()


@pytest.mark.parametrize("metric, said", [
    ("final_client_acc", "'final_client_acc' is a mapping of statistics, one number per run is needed"),
    ("final_client_acc.worst", "'final_client_acc.worst' names no statistic of it"),
    ("{kind: final, column: client_acc}", "'client_acc' is a mapping of statistics")])
def test_a_per_client_metric_without_its_statistic_names_them(metric, said):
    with pytest.raises(results.MetricError, match=said + r".*worst10: the unweighted mean of the lowest ceil\(n/10\)"):
        results.Metric.parse(yaml.safe_load(metric))


def test_a_search_on_one_setting_gives_its_choice_to_every_setting(tmp_path, capsys):
    table = _table(tmp_path, "tuning: {grid: {train.lr: [0.01, 0.1]}, rounds: 3, setting: s}\n", seeds="[0, 1]",
                   metric="{kind: last_k, k: 2}")
    (table.parent / "hard.yaml").write_text("base: s.yaml\ndata: {partition: {name: dirichlet, beta: 0.1, "
                                            "min_size: 2}}\n")
    table.write_text(table.read_text().replace("settings: [s.yaml]", "settings: [s.yaml, hard.yaml]"))
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    assert {(r.setting, r.method, r.candidate) for r in t.search} == {
        ("s", m, c) for m in ("a", "b") for c in ("lr=0.01", "lr=0.1")}              # no search on hard
    assert t.pending == {(s, m) for s in ("s", "hard") for m in ("a", "b")}
    assert "hard x a: waits for the search on s" in "\n".join(search_notes(t))
    hard_only = load_table(table, str(tmp_path / "runs"))
    resolve(hard_only, [])
    hard_only.select(["hard"], None, None)
    assert len(hard_only.search) == 4                # the search hard waits for is part of a filtered table
    val = {("a", "lr=0.01"): 0.8, ("a", "lr=0.1"): 0.7, ("b", "lr=0.01"): 0.6, ("b", "lr=0.1"): 0.9}
    for r in t.search:
        _write(r.path, r.resolved, [{"round": i + 1, "val_acc": val[(r.method, r.candidate)]} for i in range(3)])
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [], record=True)
    assert not t.pending
    lr = {(r.setting, r.method): r.resolved["train"]["lr"] for r in t.runs}
    assert lr == {("s", "a"): 0.01, ("hard", "a"): 0.01, ("s", "b"): 0.1, ("hard", "b"): 0.1}
    notes = "\n".join(search_notes(t))
    assert "searched on s, its choice taken by every setting" in notes
    assert "hard x b: the choice made on s (tuning.setting)" in notes
    assert [line.split(" | ")[:2] for line in search_table(t).splitlines()[4:]] == [["| s", "a"], ["| s", "b"]]


def test_tuning_setting_must_name_a_setting_of_the_table(tmp_path, capsys):
    table = _table(tmp_path, "tuning: {grid: {train.lr: [0.01, 0.1]}, setting: ideal}\n")
    with pytest.raises(config.ConfigError, match="tuning.setting 'ideal' is not one of its settings \\(s\\)"):
        load_table(table, str(tmp_path / "runs"))
