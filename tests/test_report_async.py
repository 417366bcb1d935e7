"""The report's asynchronous figures (mpifed.tables.figures_async): accuracy against simulated time, one panel per
algorithm and one line per aggregation, and the staleness histogram; checked by their CSVs' numbers, on
hand-written runs of a table whose methods differ by aggregation and on small real runs."""
from __future__ import annotations

import csv
import json
import math
from collections import Counter

import pytest

from conftest import run_debug, tiny
from test_tables import resolved_config, write_table

from mpifed.entry.report import main as report_main
from mpifed.run import results
from mpifed.tables.curves import FigureOptions, t_quantile
from mpifed.tables.figures_async import at_simulated_times, series

SYNC = {0: [(5.0, 0.6, None), (10.0, 0.8, None)], 1: [(6.0, 0.7, None), (12.0, 0.9, None)]}
FEDBUFF = {0: [(1.0, 0.2, [0, 0]), (3.0, 0.4, [0, 1])], 1: [(2.0, 0.3, [0, 2]), (4.0, 0.5, [1, 1])]}


def written_run(path, d, rows):
    """A finished run directory of config ``d`` with one metrics row per (simulated time, test accuracy,
    staleness list or None for a synchronous round); seed 0's second step drops one update as stale."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(json.dumps(d))
    lines = []
    for i, (clock, acc, staleness) in enumerate(rows):
        row = {"round": i + 1, "test_acc": acc, "test_loss": 1 - acc, "sim_clock": clock}
        if staleness is not None:
            row.update(version=i + 1, staleness=staleness, stale_dropped=int(clock == 3.0))
        lines.append(json.dumps(row) + "\n")
    (path / "metrics.jsonl").write_text("".join(lines))
    (path / "summary.json").write_text(json.dumps({"status": "finished", "final_test_acc": rows[-1][1]}))
    (path / "status.json").write_text(json.dumps({"state": "finished"}))


def rows_of(path):
    return list(csv.DictReader(path.open()))


def test_a_table_whose_methods_differ_by_aggregation_gets_accuracy_against_simulated_time_and_staleness(tmp_path):
    table = write_table(tmp_path / "t", tmp_path / "data", methods="[sync.yaml, fedbuff.yaml]", seeds="[0, 1]")
    setting = table.parent / "s.yaml"
    setting.write_text(setting.read_text() + "system: {clock: true}\n")
    (table.parent / "sync.yaml").write_text("algorithm: fedavg\n")
    (table.parent / "fedbuff.yaml").write_text("algorithm: fedavg\naggregation: {name: fedbuff, buffer: 2, "
                                                "concurrency: 2, max_staleness: 3}\n")
    for method, runs in (("sync", SYNC), ("fedbuff", FEDBUFF)):
        for seed, rows in runs.items():
            written_run(tmp_path / "runs" / "t-t" / f"s-{method}-s{seed}",
                        resolved_config(table, seed, method=f"{method}.yaml"), rows)
    out = tmp_path / "report"
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert (out / "s-async.png").stat().st_size > 10_000 and (out / "s-staleness.png").stat().st_size > 10_000
    curves = rows_of(out / "s-async.csv")
    got = {(r["method"], float(r["simulated time (s)"])): r for r in curves}
    assert {r["panel"] for r in curves} == {"FedAvg: test accuracy (%)"}
    # each seed's last evaluation at or before t, from the latest first evaluation to the earliest last one
    assert sorted(got) == [("FedBuff (K=2)", 2.0), ("FedBuff (K=2)", 3.0), ("sync", 6.0), ("sync", 10.0)]
    half = t_quantile(1) * math.sqrt(50) / math.sqrt(2)          # two seeds 10 points apart: sd sqrt(50)
    for key, (mean, seeds) in {("FedBuff (K=2)", 2.0): (25, (20, 30)), ("FedBuff (K=2)", 3.0): (35, (40, 30)),
                               ("sync", 6.0): (65, (60, 70)), ("sync", 10.0): (75, (80, 70))}.items():
        assert float(got[key]["mean"]) == pytest.approx(mean) == pytest.approx(sum(seeds) / 2)
        assert float(got[key]["high"]) - float(got[key]["mean"]) == pytest.approx(half, rel=1e-5)
        assert got[key]["n"] == "2" and got[key]["band"] == "t95"
    histogram = {r["staleness"]: r for r in rows_of(out / "s-staleness.csv")}
    assert {r["aggregation"] for r in histogram.values()} == {"FedBuff (K=2)"}        # sync takes no stale update
    # taken: seed 0 [0, 0] [0, 1], seed 1 [0, 2] [1, 1]; one dropped as stale; per run 4 taken, 0.5 dropped
    expected = {"0": (4, 2.0), "1": (3, 1.5), "2": (1, 0.5), "dropped (> 3)": (1, 0.5)}
    assert {s: (int(r["updates"]), float(r["per_run"])) for s, r in histogram.items()} == expected
    assert float(histogram["0"]["share"]) == pytest.approx(100 * 2 / 4.5, rel=1e-5)
    assert sum(float(r["share"]) for r in histogram.values()) == pytest.approx(100, rel=1e-5)


def test_a_run_without_the_virtual_clock_has_no_curve_against_simulated_time(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_acc": 0.5}) + "\n")
    assert at_simulated_times("sync", [run], "test_acc") is None


@pytest.mark.e2e
def test_real_runs_sync_fedbuff_and_fedasync_of_two_methods_side_by_side(tmp_path):
    clock = ("system.clock=true", "system.speed_sigma=0.8")
    made = {"sync": ("train.rounds=3",),
            "fedbuff": ("train.rounds=6", "aggregation.name=fedbuff", "aggregation.buffer=2",
                        "aggregation.concurrency=3"),
            "fedasync": ("train.rounds=8", "aggregation.name=fedasync", "aggregation.concurrency=4",
                         "aggregation.max_staleness=1", "system.dropout=0.2")}
    for method in ("fedavg", "fedntd"):
        for aggregation, options in made.items():
            if method == "fedntd" and aggregation == "fedasync":
                continue
            run_debug(tiny(tmp_path, *clock, *options, f"algorithm.name={method}", name=f"{method}-{aggregation}"))
    runs = tmp_path / "runs"
    out = tmp_path / "report"
    assert report_main([str(runs), "--out", str(out)]) == 0
    labels = {"sync": "sync", "fedbuff": "FedBuff (K=2)", "fedasync": "FedAsync"}
    curves = rows_of(out / "runs-async.csv")
    for r in curves:
        method = r["panel"].split(":")[0].lower()
        aggregation = next(k for k, v in labels.items() if v == r["method"])
        rows = results.read_rows(runs / f"{method}-{aggregation}")
        at = float(r["simulated time (s)"]) * (1 + 1e-5)        # the CSV's 6 digits may round the time down
        assert float(r["mean"]) == pytest.approx(100 * results.at_time(rows, at), rel=1e-5)
    assert Counter((r["panel"].split(":")[0], r["method"]) for r in curves) == {
        ("FedAvg", "sync"): 3, ("FedAvg", "FedBuff (K=2)"): 6, ("FedAvg", "FedAsync"): 8,
        ("FedNTD", "sync"): 3, ("FedNTD", "FedBuff (K=2)"): 6}
    histogram = rows_of(out / "runs-staleness.csv")
    for panel, aggregation in (("FedAvg", "fedbuff"), ("FedAvg", "fedasync"), ("FedNTD", "fedbuff")):
        rows = results.read_rows(runs / f"{panel.lower()}-{aggregation}")
        mine = {r["staleness"]: int(r["updates"]) for r in histogram
                if r["panel"] == panel and r["aggregation"] == labels[aggregation]}
        taken = Counter(str(s) for row in rows for s in row["staleness"])
        dropped = sum(row["stale_dropped"] for row in rows)
        assert {k: v for k, v in mine.items() if not k.startswith("dropped")} == {
            str(s): taken.get(str(s), 0) for s in range(max(map(int, taken)) + 1)}
        bound = 1 if aggregation == "fedasync" else 20
        assert mine[f"dropped (> {bound})"] == dropped
    assert any(r["staleness"] == "dropped (> 1)" and int(r["updates"]) > 0 for r in histogram)
    only_sync = tmp_path / "sync-only"
    only_sync.mkdir()
    (runs / "fedavg-sync").rename(only_sync / "fedavg-sync")
    assert report_main([str(only_sync), "--out", str(tmp_path / "report-sync")]) == 0
    assert not list((tmp_path / "report-sync").glob("*-async.*")) and not list(
        (tmp_path / "report-sync").glob("*-staleness.*"))


def test_lines_are_labelled_by_aggregation_and_by_method_where_two_share_one(tmp_path):
    configs = {"avg": {"algorithm": {"name": "fedavg"}, "aggregation": {"name": "sync"}},
               "avg-buff": {"algorithm": {"name": "fedavg"}, "aggregation": {"name": "fedbuff", "buffer": 5}},
               "avg-buff-lr": {"algorithm": {"name": "fedavg"}, "aggregation": {"name": "fedbuff", "buffer": 5}},
               "ntd-async": {"algorithm": {"name": "fedntd"}, "aggregation": {"name": "fedasync"}},
               "ntd": {"algorithm": {"name": "fedntd"}}}                   # a config without the key: sync
    methods = []
    for name, d in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(json.dumps(d))
        methods.append((name, [tmp_path / name]))
    found = series(methods, FigureOptions(labels=("avg-buff-lr=lr 0.1",)))
    assert [(s.panel, s.label, s.aggregation) for s in found] == [
        ("FedAvg", "sync", "sync"), ("FedNTD", "sync", "sync"), ("FedAvg", "FedBuff (K=5): avg-buff", "fedbuff"),
        ("FedAvg", "FedBuff (K=5): lr 0.1", "fedbuff"), ("FedNTD", "FedAsync", "fedasync")]
