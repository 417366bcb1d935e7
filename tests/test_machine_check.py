"""--recheck (mpifed.tables.machine_check): a search whose candidates ran on different machines,
its other machines' best candidates run again here, and whether it chooses the same."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from test_table_evidence import EXTENDED, _table, _write, search_extended

from mpifed.entry.table import main as table_main
from mpifed.tables import machine_check
from mpifed.tables.table_file import load_table, resolve

pytestmark = pytest.mark.unit

HERE = {"cpu_id": frozenset(["family 25 model 17 stepping 1 flags 6a93d77188"]), "blas": frozenset(["mkl"]),
        "gpu": frozenset(), "torch": frozenset(["2.14.1"])}
OLD = "family 25 model 1 stepping 1 flags ecfefe0ffb"


def _record(path: Path, cpu_id: str | None) -> None:
    rank = {"rank": 0, "cpu": "AMD EPYC", "blas": "mkl", "device": "cpu", "gpu": None}
    if cpu_id:
        rank["cpu_id"] = cpu_id
    (path / "provenance.json").write_text(json.dumps({"segments": [{"torch": "2.14.1", "ranks": [rank]}]}))


def _searched(tmp_path: Path, monkeypatch) -> Path:
    """A search of lr for one method: 0.01 and 0.1 from before runs recorded their CPU (0.1 wins, at
    the grid's edge), the extension's 0.3 made on this machine (it loses)."""
    monkeypatch.setattr(machine_check, "this_machine", lambda: HERE)
    table = _table(tmp_path, EXTENDED, methods="[a.yaml]", seeds="[0]")
    t = search_extended(table, tmp_path / "runs", {"lr=0.01": 0.5, "lr=0.1": 0.7, "lr=0.3": 0.6},
                        lambda path, candidate: _record(path, next(iter(HERE["cpu_id"])) if candidate == "lr=0.3"
                                                        else None))
    assert not t.pending and t.choices[("s", "a")].chosen == {"train.lr": 0.1}
    return table


def test_each_other_machines_best_candidate_is_run_here_and_the_choice_is_made_from_here_alone(tmp_path, monkeypatch):
    table = _searched(tmp_path, monkeypatch)
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    assert machine_check.machine_of(t.root / "tuning" / "s-a-lr=0.3-s0", HERE) == machine_check.HERE
    assert machine_check.machine_of(t.root / "tuning" / "s-a-lr=0.1-s0", HERE) == machine_check.UNRECORDED
    _record(t.root / "tuning" / "s-a-lr=0.01-s0", OLD)
    assert machine_check.machine_of(t.root / "tuning" / "s-a-lr=0.01-s0", HERE) == OLD

    checks = machine_check.plan(t, tmp_path / "here", HERE)
    assert len(checks) == 1
    groups = {g.machine: g for g in checks[0].groups}
    assert set(groups) == {machine_check.HERE, machine_check.UNRECORDED, OLD}
    assert groups[machine_check.HERE].reruns == []
    (rerun,) = groups[machine_check.UNRECORDED].reruns
    assert rerun.path == tmp_path / "here" / t.root.name / "tuning" / "s-a-lr=0.1-s0"
    assert f"run.root={tmp_path / 'here' / t.root.name / 'tuning'}" in rerun.args([])
    assert [r.name for r in groups[OLD].reruns] == ["s-a-lr=0.01-s0"]
    text = machine_check.report(checks, t, HERE)
    assert "| s | a | lr=0.1 | " in text and "lr=0.1 (unrecorded): 70.00 -> -" in text and "| not run yet |" in text
    assert "1 searches compared candidates from more than one machine: 0 choose the same on this machine, 0 " \
           "another, 1 wait for their re-runs" in text

    # here, 0.1 scores 55.00 and 0.01 50.00: this machine's own 0.3 (60.00) would win
    _write(rerun.path, rerun.resolved, [{"round": i + 1, "val_acc": 0.55} for i in range(3)])
    old = groups[OLD].reruns[0]
    _write(old.path, old.resolved, [{"round": i + 1, "val_acc": 0.5} for i in range(3)])
    text = machine_check.report(machine_check.plan(t, tmp_path / "here", HERE), t, HERE)
    assert "lr=0.1 (unrecorded): 70.00 -> 55.00;" in text and "lr=0.3 (this machine): 60.00" in text
    assert f"lr=0.01 ({OLD}): 50.00 -> 50.00, every round identical" in text     # the same metrics, round by round
    assert "; 1 of the 2 re-run candidates trained identically, round by round, on both machines" in text
    assert text.splitlines()[4].endswith("| **lr=0.3** |")
    assert "0 choose the same on this machine, 1 another" in text
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    assert t.choices[("s", "a")].chosen == {"train.lr": 0.1}          # the table's own choice is not touched

    record = next(c for c in t.choices[("s", "a")].record["candidates"] if c["values"] == {"train.lr": 0.1})
    record["runs"] = ["tuning/s-a-lr=0.1-gone"]          # a record whose run the table does not list
    text = machine_check.report(machine_check.plan(t, tmp_path / "here", HERE), t, HERE)
    assert "lr=0.1: its runs are not in the table any more, not re-run" in text
    assert text.splitlines()[4].endswith("| not checked: a machine's best is not re-run |")
    assert "0 choose the same on this machine, 0 another, 1 cannot be checked" in text


def test_recheck_runs_the_reruns_and_prints_the_verdicts(tmp_path, capsys, monkeypatch):
    table = _searched(tmp_path, monkeypatch)
    made = []

    def run_all(runs, ranks, *rest):
        for r in runs:
            made.append((r.path, ranks))
            _write(r.path, r.resolved, [{"round": i + 1, "val_acc": 0.65} for i in range(3)])
        return 0, 0
    monkeypatch.setattr("mpifed.tables.running.run_all", run_all)
    runs = ["--runs-root", str(tmp_path / "runs")]
    assert table_main([str(table), *runs, "--recheck", str(tmp_path / "here")]) == 0
    out = capsys.readouterr().out
    assert [p.name for p, _ in made] == ["s-a-lr=0.1-s0"] and made[0][1] == 0
    assert "lr=0.1 (unrecorded): 70.00 -> 65.00" in out and out.splitlines()[4].endswith("| the same |")
    assert "1 choose the same on this machine, 0 another" in out

    # an archived recheck read on another machine: its machine's verdicts, nothing run
    _record(made[0][0], OLD)
    assert table_main([str(table), *runs, "--recheck", str(tmp_path / "here")]) == 0
    out = capsys.readouterr().out
    assert f"re-runs ran on another machine ({OLD}): their verdicts, nothing run here" in out
    assert len(made) == 1 and "lr=0.1 (unrecorded): 70.00 -> 65.00" in out and "lr=0.3 (" in out
    other = made[0][0].parent / "s-a-lr=0.3-s0"
    other.mkdir()
    _record(other, None)
    assert table_main([str(table), *runs, "--recheck", str(tmp_path / "here")]) == 2
    assert "come from 2 machines; a recheck is made on one" in capsys.readouterr().err
    shutil.rmtree(other)
    _record(made[0][0], next(iter(HERE["cpu_id"])))
    on_gpu = json.loads((made[0][0] / "provenance.json").read_text())
    on_gpu["segments"][0]["ranks"][0]["gpu"] = "NVIDIA H200"            # this CPU's re-runs, made on its GPU
    (made[0][0] / "provenance.json").write_text(json.dumps(on_gpu))
    assert table_main([str(table), *runs, "--recheck", str(tmp_path / "here")]) == 0
    out = capsys.readouterr().out
    assert "another machine" not in out.split("|")[0] and "lr=0.1 (unrecorded): 70.00 -> 65.00" in out
    assert made[-1][0].name == "s-a-lr=0.3-s0"            # on the GPU, the table's CPU run is another machine's
    shutil.rmtree(made[-1][0])
    del made[1:]
    _record(made[0][0], next(iter(HERE["cpu_id"])))

    held = made[0][0]                                   # a run of another configuration in its place
    config = held / "config.yaml"
    config.write_text(config.read_text().replace("train_samples: 140", "train_samples: 150"))
    assert table_main([str(table), *runs, "--recheck", str(tmp_path / "here")]) == 2     # not read as the re-run
    assert f"{held} holds a run of another configuration than s-a-lr=0.1-s0's" in capsys.readouterr().err

    assert table_main([str(table), *runs, "--recheck", str(tmp_path / "runs")]) == 2
    assert "that is the table's own runs folder" in capsys.readouterr().err
    monkeypatch.setattr(machine_check, "this_machine", lambda: {**HERE, "cpu_id": frozenset([OLD])})
    for run in (tmp_path / "runs").rglob("provenance.json"):
        _record(run.parent, None)                      # every candidate unrecorded: one group
    assert table_main([str(table), *runs, "--recheck", str(tmp_path / "here")]) == 0
    assert "compared candidates from one machine (or from runs that recorded none): nothing to recheck" in \
        capsys.readouterr().out
