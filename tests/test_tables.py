"""Tables: a run's identity is its configuration (the table trap of issue 11), metrics as the
papers report them (final, best, last k, rounds to target, forgetting), missing raw data."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import REPO

from mpifed.settings import config
from mpifed.run import results
from mpifed.entry.table import main as table_main
from mpifed.tables.summarize import summarize
from mpifed.tables.table_file import load_table, resolve


def write_table(folder: Path, data_root: Path, methods: str = "[a.yaml]", seeds: str = "[0]",
                metric: str = "final_test_acc", dataset: str = "{name: synthetic, train_samples: 120, "
                                                               "test_samples: 40}") -> Path:
    """A table of one tiny setting (2 rounds, Dirichlet 0.5) x ``methods`` (a: fedavg, b: fedprox)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "s.yaml").write_text(
        f"data:\n  dataset: {dataset}\n  num_clients: 2\n"
        f"  partition: {{name: dirichlet, beta: 0.5, min_size: 2}}\n  prepared_root: {data_root}\n"
        "model: digits_cnn\ntrain: {rounds: 2, local_epochs: 1, batch_size: 32, eval_batch_size: 40}\n"
        "resources: {threads: 1, device: cpu}\nrun: {checkpoint_every: 0, save_model: false}\n")
    (folder / "a.yaml").write_text("algorithm: fedavg\n")
    (folder / "b.yaml").write_text("algorithm: {name: fedprox, mu: 0.01}\n")
    table = folder / "t.table.yaml"
    table.write_text(f"title: T\nmetric: {metric}\nsettings: [s.yaml]\nmethods: {methods}\nseeds: {seeds}\n")
    return table


def fake_run(path: Path, d: dict, accs: list[float | None], per_class: list[list[float]] | None = None,
             state: str = "finished", losses: list[float] | None = None) -> Path:
    """A hand-written run directory: config.yaml from ``d``, one metrics row per round (test
    accuracy ``accs[i]``, None: not evaluated), summary.json and status.json."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    rows = []
    for i, acc in enumerate(accs):
        row = {"round": i + 1, "train_loss": 2.0 - 0.1 * i}
        if acc is not None:
            row.update(test_acc=acc, test_loss=(losses[i] if losses else 1.0 - acc))
            if per_class is not None:
                row["per_class_acc"] = per_class[i]
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evaluated = [a for a in accs if a is not None]
    (path / "summary.json").write_text(json.dumps({"status": state,
                                                   "final_test_acc": evaluated[-1] if evaluated else None}))
    (path / "status.json").write_text(json.dumps({"state": state}))
    return path


def resolved_config(table: Path, seed: int = 0, *extra: str, method: str = "a.yaml") -> dict:
    return config.load([str(table.parent / "s.yaml"), str(table.parent / method)], [f"run.seed={seed}", *extra])[1]


# ------------------------------------------------------------------ the trap, as the issue types it
def test_table_trap_rounds_then_beta(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    table = write_table(tmp_path / "t", tmp_path / "data")
    root = ["--runs-root", str(tmp_path / "runs")]
    runs = tmp_path / "runs" / "t-t"

    assert table_main([str(table), *root, "--run", "0", "--set", "train.rounds=2"]) == 0
    assert (runs / "s-a-s0" / "status.json").exists()           # the table's own configuration: the plain name
    capsys.readouterr()

    assert table_main([str(table), *root, "--run", "0", "--set", "train.rounds=3"]) == 0
    out = capsys.readouterr().out
    assert "run 1/1" in out                                      # it trained, beside the 2-round run
    new = [p for p in runs.iterdir() if p.name.startswith("s-a-s0-")]
    assert len(new) == 1
    rows = results.read_rows(new[0])
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert [r["round"] for r in results.read_rows(runs / "s-a-s0")] == [1, 2]
    final3 = 100 * results.final(rows)
    assert f"{final3:.2f} (n=1)" in out
    assert "s-a-s0: made with train.rounds=2 (here 3)" in out

    assert table_main([str(table), *root, "--run", "0", "--set", "train.rounds=3"]) == 0
    assert "run 1/1" not in capsys.readouterr().out              # same configuration: done, nothing trains

    assert table_main([str(table), *root, "--summary", "--set", "data.partition.beta=0.1"]) == 0
    out = capsys.readouterr().out
    assert "| a | - |" in out                                    # no run of beta = 0.1: nothing is shown
    assert "s-a-s0: made with data.partition.beta=0.5 (here 0.1)" in out
    assert f"{new[0].name}: made with" in out and "train.rounds=3 (here 2)" in out


# ------------------------------------------------------------------ identity and directories (no training)
def test_plain_directory_with_another_configuration_is_not_reused(tmp_path):
    table = write_table(tmp_path / "t", tmp_path / "data")
    t = load_table(table, str(tmp_path / "runs"))
    fake_run(t.runs[0].root / "s-a-s0", resolved_config(table, 0, "train.lr=0.5"), [0.5, 0.6])
    resolve(t, [])
    assert t.runs[0].name.startswith("s-a-s0-") and len(t.runs[0].name) == len("s-a-s0-") + 10
    assert "train.lr=0.5 (here 0.05)" in "\n".join(summarize(t).left_out)


def test_a_left_out_run_names_the_value_that_changed_before_the_options_that_follow_from_it(tmp_path):
    table = write_table(tmp_path / "t", tmp_path / "data")
    t = load_table(table, str(tmp_path / "runs"))
    fake_run(t.runs[0].root / "s-a-s0", resolved_config(table, 0, "data.partition={name: iid}"), [0.5, 0.6])
    resolve(t, [])
    (line,) = summarize(t).left_out
    assert "s-a-s0: made with data.partition.name='iid' (here 'dirichlet'), data.partition.balance=None" in line


def test_overrides_that_do_not_change_results_keep_the_plain_run(tmp_path):
    table = write_table(tmp_path / "t", tmp_path / "data")
    t = load_table(table, str(tmp_path / "runs"))
    fake_run(t.runs[0].root / "s-a-s0", resolved_config(table), [0.5, 0.6])
    resolve(t, ["run.checkpoint_every=5", "run.keep_checkpoints=3"])
    assert t.runs[0].name == "s-a-s0"
    s = summarize(t)
    assert s.cells[("s", "a", s.columns[0])].values == [60.0] and not s.left_out


def test_summary_uses_only_finished_runs_of_the_configuration_and_says_why(tmp_path):
    table = write_table(tmp_path / "t", tmp_path / "data", seeds="[0, 1, 2]")
    t = load_table(table, str(tmp_path / "runs"))
    root = t.runs[0].root
    fake_run(root / "s-a-s0", resolved_config(table, 0), [0.5, 0.70])
    fake_run(root / "s-a-s1", resolved_config(table, 1), [0.5, 0.80])
    fake_run(root / "s-a-s2", resolved_config(table, 2), [0.5], state="stopped")
    other = resolved_config(table, 0, "data.partition.beta=0.1")
    resolve(t, ["data.partition.beta=0.1"])
    fake_run(root / t.runs[0].name, other, [0.1, 0.2])
    s = summarize(t)
    assert s.cells[("s", "a", s.columns[0])].values == [20.0]
    text = s.markdown()
    assert "20.00 (n=1 of 3)" in text and "Not run yet: 2" in text
    assert sum("data.partition.beta=0.5 (here 0.1)" in line for line in s.left_out) == 3

    resolve(t, [])
    s = summarize(t)
    assert s.cells[("s", "a", s.columns[0])].values == pytest.approx([70.0, 80.0])
    assert "75.00 ± 7.07 (n=2 of 3)" in s.markdown()             # sample std (n - 1); a seed missing
    assert any(line.endswith("s-a-s2: not finished (stopped)") for line in s.left_out)
    assert any("beta=0.1 (here 0.5)" in line for line in s.left_out)


def test_overrides_of_what_the_table_sets_itself_are_refused(tmp_path, capsys):
    table = write_table(tmp_path / "t", tmp_path / "data")
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list", "--set", "run.seed=3"]) == 2
    assert "the table sets run.seed, run.name, run.root and run.group of its runs itself" in capsys.readouterr().err


# ------------------------------------------------------------------ metrics as the papers report them
ROWS = [{"round": 1, "train_loss": 2.0},
        {"round": 2, "test_acc": 0.50, "per_class_acc": [0.4, 0.6]},
        {"round": 3, "train_loss": 1.5},
        {"round": 4, "test_acc": 0.70, "per_class_acc": [0.9, 0.5]},
        {"round": 5, "test_acc": 0.66, "per_class_acc": [0.6, 0.72]},
        {"round": 6, "test_acc": 0.68, "per_class_acc": [0.7, 0.66]}]


def test_metric_kinds_rounds_to_and_forgetting_on_hand_written_rows():
    assert results.final(ROWS) == 0.68
    assert results.best(ROWS) == (0.70, 4)
    assert results.last_k(ROWS, 2) == pytest.approx(0.67)
    assert results.last_k(ROWS, 10) == pytest.approx((0.5 + 0.7 + 0.66 + 0.68) / 4)
    assert results.rounds_to(ROWS, 0.65) == 4 and results.rounds_to(ROWS, 0.5) == 2
    assert results.rounds_to(ROWS, 0.9) is None
    # Eq. 5: class 0 peaked at 0.9, ends at 0.7; class 1 peaked at 0.72, ends at 0.66
    assert results.forgetting(ROWS) == pytest.approx(((0.9 - 0.7) + (0.72 - 0.66)) / 2)
    for spec, want in [({"kind": "final"}, 0.68), ({"kind": "best"}, 0.70),
                       ({"kind": "last_k", "k": 3}, (0.7 + 0.66 + 0.68) / 3),
                       ("final_test_acc", 0.61), ("test_acc", 0.68)]:
        assert results.value(results.Metric.parse(spec), ROWS, {"final_test_acc": 0.61}) == pytest.approx(want)


@pytest.mark.parametrize("spec, words", [
    ({"kind": "median"}, "not one of final, best, last_k"), ({"kind": "last_k", "k": 0}, "k must be"),
    ({"rounds_to": [65]}, "65% is 0.65"), ({"targets": [0.5]}, "unknown keys targets"), (3, "must be a string")])
def test_bad_metric_is_refused_with_the_fix(spec, words):
    with pytest.raises(results.MetricError, match=words):
        results.Metric.parse(spec)


def test_summary_reports_rounds_to_and_forgetting_columns(tmp_path):
    table = write_table(tmp_path / "t", tmp_path / "data", seeds="[0, 1, 2]",
                        metric="{kind: best, rounds_to: [0.65, 0.9], forgetting: true}")
    t = load_table(table, str(tmp_path / "runs"))
    root = t.runs[0].root
    pc = [[0.5, 0.5], [0.8, 0.6], [0.7, 0.6]]
    fake_run(root / "s-a-s0", resolved_config(table, 0), [0.5, 0.7, 0.65], pc)
    fake_run(root / "s-a-s1", resolved_config(table, 1), [0.66, 0.92, 0.9], pc)
    fake_run(root / "s-a-s2", resolved_config(table, 2), [0.5, 0.6, 0.64], pc)
    resolve(t, [])
    s = summarize(t)
    assert s.columns == ["best test_acc", "T(65%)", "T(90%)", "forgetting"]
    text = s.markdown()
    assert "| s: best test_acc | s: T(65%) | s: T(90%) | s: forgetting |" in text
    assert "1.5 ± 0.7 (n=2; not reached in 1)" in text            # T(65%): rounds 2 and 1, seed 2 never
    assert "2.0 (n=1; not reached in 2)" in text
    assert s.cells[("s", "a", "forgetting")].mean == pytest.approx(100 * 0.05)


def test_run_writes_rounds_to_into_summary(tmp_path):
    from conftest import run_debug, tiny
    run_debug(tiny(tmp_path, "run.rounds_to=[0.05, 1.0]"))
    summary = json.loads((tmp_path / "runs" / "run" / "summary.json").read_text())
    rows = results.read_rows(tmp_path / "runs" / "run")
    assert summary["rounds_to"] == {"0.05": results.rounds_to(rows, 0.05), "1": None}
    assert summary["rounds_to"]["0.05"] == 1
    assert summary["best_test_acc"] == results.best(rows)[0]


def test_paper_tables_declare_their_papers_metrics():
    def metric(path: str) -> results.Metric:
        return load_table(REPO / "configs" / path).metric
    assert metric("papers/fedcad/table1.table.yaml") == results.Metric("final", rounds_to=(0.65, 0.9))
    assert metric("papers/fedgkd/table3.table.yaml").kind == "best"
    assert metric("papers/fedntd/table1.table.yaml").forgetting
    assert metric("papers/fedcsd/table2.table.yaml") == results.Metric("best", column="group_mean_acc", groups=True)
    assert metric("papers/fedgkd/table6.table.yaml").at_rounds == (10, 20, 50, 100)
    repro = load_table(REPO / "configs" / "repro" / "fedcad" / "table1.table.yaml")
    assert repro.metric == results.Metric("last_k", k=5) and repro.paper_metric.rounds_to == (0.8, 0.85)
    assert metric("papers/fedntd/appG1.table.yaml").forgetting and metric("papers/fedntd/appG2.table.yaml").forgetting
    assert metric("papers/fedntd/table12.table.yaml") == results.Metric("final")
    assert metric("papers/fedgkd/table9.table.yaml").kind == "best"


# ------------------------------------------------------------------ --list and missing raw data
def test_list_marks_runs_whose_raw_data_is_missing(tmp_path, capsys):
    table = write_table(tmp_path / "t", tmp_path / "data", methods="[a.yaml, b.yaml]",
                        dataset=f"{{name: cifar10, root: {tmp_path / 'raw'}}}")
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list", "--commands"]) == 0
    out = capsys.readouterr().out
    expected = tmp_path / "raw" / "cifar-10-batches-py"
    assert out.count(f"[raw data missing: expects {expected}]") == 2
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 0
    out = capsys.readouterr().out
    assert out.count("no data") == 2
    assert f"runs lack their raw data; put it in (or point data.dataset.root at): {expected}" in out
    assert "2 of 2 runs cannot start until then" in out
    (expected).mkdir(parents=True)
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 0
    assert "missing" not in capsys.readouterr().out


def test_list_counts_settled_runs_whose_raw_data_is_absent_as_archived_not_as_unable_to_start(tmp_path, capsys):
    table = write_table(tmp_path / "t", tmp_path / "data", methods="[a.yaml, b.yaml]",
                        dataset=f"{{name: cifar10, root: {tmp_path / 'raw'}}}")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    for run, method in zip(t.runs, ("a.yaml", "b.yaml")):
        fake_run(run.path, resolved_config(table, 0, method=method), [0.5, 0.7])
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--list"]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 runs are finished (archived)" in out
    assert "cannot start" not in out and "put it in" not in out and "no data" not in out
