"""Archiving a table (mpifed.tables.archive): the settled runs' records without their weights, which
summarise to the same table and can be continued."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from test_table_evidence import GRID, _table, _write
from test_tables import fake_run

from mpifed.run.rundir import RunDir
from mpifed.settings import config
from mpifed.entry.table import main as table_main
from mpifed.tables.table_file import load_table, resolve

pytestmark = pytest.mark.unit

NOT_RECORD = ("model.pt", "checkpoints/round_2.ckpt", "client_state/1/state.bin", ".lock", ".metrics.jsonl.tmp99")


def _settled_table(tmp_path: Path) -> tuple[Path, Path]:
    """A table whose search has chosen (one candidate diverged) and whose runs have finished,
    each with weights, a lock and a crashed write beside its record, but for s-b-s2, stopped halfway."""
    table = _table(tmp_path, GRID, seeds="[0, 1, 2]", metric="{kind: last_k, k: 2}")
    runs = tmp_path / "runs"
    t = load_table(table, str(runs))
    resolve(t, [])
    for r in t.search:
        if r.candidate == "lr=0.1+mu=0.1":
            nan = {"state": "failed", "error": "NonFiniteLoss: round 2: the loss is nan"}
            _write(r.path, r.resolved, [], status=nan)
        else:
            score = 0.9 if r.candidate in ("lr=0.01", "lr=0.1+mu=0.01") else 0.5
            _write(r.path, r.resolved, [{"round": i + 1, "val_acc": score, "test_acc": 0.5} for i in range(3)])
    t = load_table(table, str(runs))
    resolve(t, [], record=True)
    for r in t.runs:
        state = "stopped" if r.name == "s-b-s2" else "finished"
        accs = [0.4, 0.5 + 0.01 * r.seed + (0.05 if r.method == "b" else 0.0)]
        fake_run(r.path, r.resolved, accs, state=state)
        for w in NOT_RECORD:
            (r.path / w).parent.mkdir(parents=True, exist_ok=True)
            (r.path / w).write_bytes(b"weights")
    return table, t.root


def test_archive_keeps_the_settled_runs_records_without_weights_and_summarises_the_same(tmp_path, capsys):
    table, root = _settled_table(tmp_path)
    source, dest = ["--runs-root", str(tmp_path / "runs")], tmp_path / "results"
    assert table_main([str(table), *source, "--archive", str(dest)]) == 0
    out = capsys.readouterr().out
    # 6 search runs (one diverged) and 5 of the 6 final runs; the stopped one is left out
    assert f"archived 11 runs to {dest / root.name} (11 written, 0 already there" in out
    assert "1 runs not settled (not run, running, stopped or failed) were left out" in out
    assert f"--runs-root {dest} --summary" in out
    copy = dest / root.name
    assert (copy / "choices.yaml").read_bytes() == (root / "choices.yaml").read_bytes()
    assert (copy / "tuning" / "s-b-lr=0.1+mu=0.1-s0" / "status.json").is_file()      # the diverged candidate
    assert not (copy / "s-b-s2").exists()
    for run in [p for p in copy.rglob("config.yaml")]:
        original = root / run.parent.relative_to(copy)
        assert sorted(p.name for p in run.parent.iterdir()) == [".mpifed-run", "config.yaml", "metrics.jsonl",
                                                                 "status.json", "summary.json"]
        assert (run.parent / "metrics.jsonl").read_bytes() == (original / "metrics.jsonl").read_bytes()
    assert not [p for p in copy.rglob("*") if p.name in ("model.pt", "checkpoints", "client_state", ".lock")]

    def summary(runs_root: Path) -> str:
        assert table_main([str(table), "--runs-root", str(runs_root), "--summary", "--seeds", "0", "1"]) == 0
        return capsys.readouterr().out.replace(str(runs_root), "ROOT")
    text = summary(tmp_path / "runs")
    assert "s x a: lr=0.01" in text and summary(dest) == text

    # again: nothing to write; a record that changed is rewritten, whole
    assert table_main([str(table), *source, "--archive", str(dest)]) == 0
    assert "(0 written, 11 already there as they are" in capsys.readouterr().out
    with open(root / "s-a-s1" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"round": 3, "test_acc": 0.7}) + "\n")
    assert table_main([str(table), *source, "--archive", str(dest)]) == 0
    assert "(1 written, 10 already there as they are" in capsys.readouterr().out
    assert (copy / "s-a-s1" / "metrics.jsonl").read_bytes() == (root / "s-a-s1" / "metrics.jsonl").read_bytes()
    assert not [p for p in copy.iterdir() if p.name.startswith(".")]                 # no temporary folder left


def test_an_archive_continues_as_a_runs_root_and_cannot_be_written_over_its_source(tmp_path, capsys):
    table, root = _settled_table(tmp_path)
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--archive", str(tmp_path / "results")]) == 0
    capsys.readouterr()
    more = tmp_path / "more"
    shutil.copytree(tmp_path / "results", more)
    assert table_main([str(table), "--runs-root", str(more), "--list", "--commands"]) == 0
    listed = capsys.readouterr().out
    assert listed.count("finished") == 11 and "run.name=s-b-s2" in listed      # only the stopped run is left to do
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--archive", str(tmp_path / "runs")]) == 2
    assert "that is where the table's runs are; name another folder" in capsys.readouterr().err
    assert table_main([str(table), "--runs-root", str(more), "--archive", str(tmp_path / "again"),
                       "--methods", "a"]) == 0
    said = capsys.readouterr().out
    assert f"its summary: python -m mpifed.table {table} --runs-root {tmp_path / 'again'} --methods a --summary" in said
    assert table_main([str(table), "--runs-root", str(more), "--archive", str(tmp_path / "again"), "--methods", "a",
                       "--set",
                       "train.local_epochs=2"]) == 0                # runs with other results: the summary names them
    assert (f"its summary: python -m mpifed.table {table} --runs-root {tmp_path / 'again'} --methods a --set "
            f"train.local_epochs=2 --summary") in capsys.readouterr().out
    with pytest.raises(SystemExit):
        table_main([str(table), "--runs-root", str(more), "--list", "--by-seed"])
    assert "--by-seed goes with --summary" in capsys.readouterr().err


def test_an_archive_never_overwrites_an_archived_run_of_another_configuration(tmp_path, capsys):
    """A fresh runs folder whose new runs took the plain names that the archive's earlier runs (of
    another configuration) hold: --archive refuses, naming the run, and writes nothing."""
    table, root = _settled_table(tmp_path)
    results = tmp_path / "results"
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--archive", str(results)]) == 0
    capsys.readouterr()
    held = results / root.name / "s-a-s0"          # the archive's earlier run of that name: other data
    (held / "config.yaml").write_text((held / "config.yaml").read_text().replace("train_samples: 140",
                                                                                  "train_samples: 150"))
    before = (held / "config.yaml").read_bytes()
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--archive", str(results)]) == 2
    err = capsys.readouterr().err
    assert f"{held} holds a settled run of another configuration" in err and f"cp -r {results / root.name} " in err
    assert (held / "config.yaml").read_bytes() == before


def test_reuse_takes_identical_runs_from_another_tables_folder_and_nothing_else(tmp_path, capsys):
    table, root = _settled_table(tmp_path)
    other = tmp_path / "u"
    shutil.copytree(table.parent, other)
    table_file = other / "t.table.yaml"
    table_file.write_text(table_file.read_text().replace("seeds: [0, 1, 2]", "seeds: [0, 1, 3]"))
    (other / "a.yaml").write_text("algorithm: fedavg\ntrain: {weight_decay: 0.001}\n")      # another configuration
    u_table, runs = str(other / "t.table.yaml"), ["--runs-root", str(tmp_path / "runs")]
    u = load_table(u_table, str(tmp_path / "runs"))
    resolve(u, [])
    own = next(r for r in u.search if r.candidate == "lr=0.01+mu=0.01")
    _write(own.path, own.resolved, [{"round": 1, "val_acc": 0.2}], status={"state": "stopped"})   # a run of its own
    assert table_main([u_table, *runs, "--reuse", str(tmp_path / "nowhere")]) == 2
    assert f"--reuse {tmp_path / 'nowhere'}: no such folder" in capsys.readouterr().err

    assert table_main([u_table, *runs, "--reuse", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    # b's other three candidates (one diverged); nothing of a; b's runs wait for the search's own run
    assert "3 runs reused from" in out and "9 of the table's runs still to make, 6 of them after their search" in out
    assert f"reused {root / 'tuning' / 's-b-lr=0.1+mu=0.01-s0'} as {u.root / 'tuning' / 's-b-lr=0.1+mu=0.01-s0'}" in out
    assert json.loads((own.path / "status.json").read_text())["state"] == "stopped"
    assert not [p for p in u.root.rglob("*") if p.name.startswith("s-a-")]
    copied = u.root / "tuning" / "s-b-lr=0.1+mu=0.01-s0"
    assert (copied / "metrics.jsonl").read_bytes() == (root / "tuning" / copied.name / "metrics.jsonl").read_bytes()

    # once its own search run finishes, the choice is made and b's finished runs of seeds 0 and 1 come in
    _write(own.path, own.resolved, [{"round": i + 1, "val_acc": 0.5} for i in range(3)])
    assert table_main([u_table, *runs, "--reuse", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "2 runs reused from" in out and "6 of the table's runs still to make, 3 of them after their search" in out
    assert (u.root / "s-b-s1" / "summary.json").read_bytes() == (root / "s-b-s1" / "summary.json").read_bytes()
    assert not (u.root / "s-b-s0" / "model.pt").exists()
    assert table_main([u_table, *runs, "--list", "--commands"]) == 0
    listed = capsys.readouterr().out
    assert listed.count(" finished ") == 6 and listed.count(" diverged ") == 1
    u = load_table(u_table, str(tmp_path / "runs"))
    resolve(u, [])
    assert u.choices[("s", "b")].chosen == {"train.lr": 0.1, "algorithm.mu": 0.01}


def test_reuse_gives_a_table_run_a_run_that_evaluated_the_test_set_and_skips_hidden_folders(tmp_path, capsys):
    table, root = _settled_table(tmp_path)
    other = tmp_path / "u"
    shutil.copytree(table.parent, other)
    u_table = str(other / "t.table.yaml")
    u = load_table(u_table, str(tmp_path / "runs"))
    early = tmp_path / "early"                  # searched first: a validation-only copy and a stale hidden one
    shutil.copytree(root / "s-a-s0", early / "a-val-only")
    rows = [json.loads(line) for line in (root / "s-a-s0" / "metrics.jsonl").read_text().splitlines()]
    val_only = "".join(json.dumps({"round": r["round"], "val_acc": 0.5}) + "\n" for r in rows)
    (early / "a-val-only" / "metrics.jsonl").write_text(val_only)
    shutil.copytree(root / "s-a-s1", early / ".s-a-s1.old99")
    (early / ".s-a-s1.old99" / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_acc": 0.01}) + "\n")
    assert table_main([u_table, "--runs-root", str(tmp_path / "runs"), "--reuse", str(early),
                       str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    for name in ("s-a-s0", "s-a-s1"):
        assert (u.root / name / "metrics.jsonl").read_bytes() == (root / name / "metrics.jsonl").read_bytes()
        assert f"reused {root / name} as {u.root / name}" in out
    assert table_main([u_table, "--runs-root", str(tmp_path / "runs"), "--list", "--set", "run.eval_test=false"]) == 2
    assert "--set run.eval_test: a table's runs report the test set" in capsys.readouterr().err


def test_reuse_gives_a_search_run_the_searchs_record_not_the_table_run_of_its_configuration(tmp_path, capsys):
    """A search at the table's rounds: the chosen candidate's run at the search's seed has the identity
    of that seed's table run (the test set is not part of it), whose folder sorts first; the search run
    still gets the search's record, and the table run the table run's."""
    table = _table(tmp_path, "tuning: {grid: {train.lr: [0.01, 0.1]}}\n", methods="[a.yaml]", seeds="[0, 1]")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    for r in t.search:
        _write(r.path, r.resolved, [{"round": 1, "val_acc": 0.9 if r.candidate == "lr=0.01" else 0.5}])
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [], record=True)
    for r in t.runs:
        fake_run(r.path, r.resolved, [0.4, 0.5 + 0.01 * r.seed])
    chosen = next(r for r in t.search if r.candidate == "lr=0.01")
    final = next(r for r in t.runs if r.seed == 0)
    assert config.digest(chosen.identity) == config.digest(final.identity)
    other = tmp_path / "u"
    shutil.copytree(table.parent, other)
    u_table = str(other / table.name)
    assert table_main([u_table, "--runs-root", str(tmp_path / "again"), "--reuse", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    u = load_table(u_table, str(tmp_path / "again"))
    for source in (chosen.path, final.path):
        copy = u.root / source.relative_to(t.root)
        assert f"reused {source} as {copy}" in out
        assert (copy / "metrics.jsonl").read_bytes() == (source / "metrics.jsonl").read_bytes()
        assert (copy / "config.yaml").read_bytes() == (source / "config.yaml").read_bytes()


def test_reuse_takes_a_table_run_that_diverged_before_it_evaluated_the_test_set(tmp_path, capsys):
    """A final run whose loss became NaN before its first test evaluation is settled: reused, not run again."""
    table, root = _settled_table(tmp_path)
    diverged = root / "s-a-s2"
    (diverged / "metrics.jsonl").write_text(json.dumps({"round": 1, "train_loss": 2.3}) + "\n")
    (diverged / "status.json").write_text(json.dumps(
        {"state": "failed", "error": "NonFiniteLoss: client 0, round 2, epoch 1: the local loss is nan"}))
    other = tmp_path / "u"
    shutil.copytree(table.parent, other)
    u_table = str(other / "t.table.yaml")
    assert table_main([u_table, "--runs-root", str(tmp_path / "again"), "--reuse", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    u = load_table(u_table, str(tmp_path / "again"))
    assert f"reused {diverged} as {u.root / 's-a-s2'}" in out
    assert RunDir(u.root / "s-a-s2").state() == "diverged"
    assert table_main([u_table, "--runs-root", str(tmp_path / "again"), "--list", "--commands"]) == 0
    assert capsys.readouterr().out.count(" diverged ") == 2        # the search's candidate and this run


def test_prune_frees_the_settled_runs_resume_state_and_keeps_their_record(tmp_path, capsys):
    table, root = _settled_table(tmp_path)
    runs = ["--runs-root", str(tmp_path / "runs")]
    assert table_main([str(table), *runs, "--summary"]) == 0
    before = capsys.readouterr().out
    held = RunDir(root / "s-a-s0")
    held.lock()                                              # a process working on it: left alone
    try:
        assert table_main([str(table), *runs, "--prune"]) == 0
    finally:
        held.unlock()
    out = capsys.readouterr().out
    assert "freed 0.0 MB: the checkpoints and client state of 4 settled runs" in out
    assert "1 runs held by another process" in out
    for run in [root / "s-a-s1", root / "s-b-s1"]:
        assert not (run / "checkpoints").exists() and not (run / "client_state").exists()
        assert (run / "model.pt").is_file() and (run / "metrics.jsonl").is_file()
    for run in [root / "s-a-s0", root / "s-b-s2"]:                     # held; stopped (it resumes from them)
        assert (run / "checkpoints" / "round_2.ckpt").is_file() and (run / "client_state" / "1" / "state.bin").is_file()
    assert table_main([str(table), *runs, "--summary"]) == 0
    assert capsys.readouterr().out == before
