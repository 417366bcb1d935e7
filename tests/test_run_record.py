"""A run's state is one type whose values are what status.json holds; a run's files are named in one place
(mpifed/run/rundir.py) and read through one reader (RunRecord); the tables layer works without the command line."""
import json
import re
from pathlib import Path

from test_tables import fake_run, write_table

from mpifed.run import rundir
from mpifed.run.record import RunRecord
from mpifed.run.rundir import RunDir
from mpifed.run.state import RunState
from mpifed.tables.collection import collect
from mpifed.tables.estimate import estimate
from mpifed.tables.listing import listing
from mpifed.tables.report_tables import tables_of, write_tables
from mpifed.tables.summarize import summary_table
from mpifed.tables.table_file import load_table, resolve, status

PACKAGE = Path(__file__).resolve().parents[1] / "mpifed"
FILES = ("CONFIG", "METRICS", "CLIENTS", "CLIENT_ACC", "SUMMARY", "STATUS", "PROVENANCE", "MODEL", "LOG")


def test_a_state_is_the_string_status_json_holds(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.write_json(rundir.STATUS, {"state": RunState.STOPPED, "rounds_done": 0})
    assert json.loads((run.path / "status.json").read_text())["state"] == "stopped"
    found = RunRecord(run.path).state
    assert found is RunState.STOPPED and found == "stopped" and f"{found:>8}|{found}" == " stopped|stopped"
    assert RunRecord(run.path).status["state"] is RunState.STOPPED
    (run.path / "status.json").write_text(json.dumps({"state": "paused"}))      # no state mpifed writes
    assert RunRecord(run.path).state is None and RunRecord(run.path).status is None
    (run.path / "status.json").write_text(json.dumps({"state": ["finished"]}))
    assert RunRecord(run.path).state is None


def test_a_dead_running_run_reads_as_failed_and_a_nan_failure_as_diverged(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.write_json(rundir.STATUS, {"state": "running", "rounds_done": 1})
    assert RunRecord(run.path).state is RunState.FAILED                    # no process holds its lock
    run.write_json(rundir.STATUS, {"state": "failed", "error": "NonFiniteLoss: loss is nan"})
    assert RunRecord(run.path).state is RunState.DIVERGED and RunState.DIVERGED.settled
    assert not RunState.FAILED.settled


def test_a_record_reads_the_files_the_run_directory_names(tmp_path):
    path = fake_run(tmp_path / "run", {"algorithm": {"name": "fedavg"}}, [None, 0.5, 0.625])
    (path / rundir.CLIENTS).write_text(json.dumps({"round": 1, "clients": [{"steps": 3}]}) + "\n")
    (path / rundir.CLIENT_ACC).write_text(json.dumps({"round": 3, "acc": [0.5, 0.75]}) + "\n{cut sho")
    record = RunRecord(path)
    assert record.config == {"algorithm": {"name": "fedavg"}}
    assert record.state is RunState.FINISHED and record.summary["final_test_acc"] == 0.625
    assert [row["round"] for row in record.metrics()] == [1, 2, 3]
    assert record.clients()[0]["clients"] == [{"steps": 3}]
    assert record.client_accuracy() == [{"round": 3, "acc": [0.5, 0.75]}]              # a line cut short skipped
    assert record.model_file == path / "model.pt"
    assert RunRecord(tmp_path / "none").state is None and RunRecord(tmp_path / "none").summary == {}


def test_only_the_run_directory_spells_a_runs_file_names_or_compares_a_state_as_a_string():
    names = {getattr(rundir, name) for name in FILES}
    spelled = re.compile("[\"'](" + "|".join(map(re.escape, sorted(names))) + ")[\"']")
    compared = re.compile(r"""(==|!=)\s*["'](running|stopped|finished|failed|diverged|damaged|new)["']""")
    found = [f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if path.name != "rundir.py"
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if spelled.search(line) or compared.search(line)]
    assert not found, "name a run's files with mpifed.run.rundir's constants, states with RunState:\n" + "\n".join(
        found)


def test_a_tables_listing_estimate_summary_and_report_need_no_command_line(tmp_path):
    table = write_table(tmp_path / "t", tmp_path / "data", seeds="[0, 1]")
    t = load_table(table, str(tmp_path / "runs"))
    resolve(t, [])
    first, second = t.runs
    fake_run(first.path, first.resolved, [0.5, 0.625])
    (first.path / rundir.SUMMARY).write_text(json.dumps({"wall_time_s": 120.0, "final_test_acc": 0.625}))
    assert (status(first), status(second)) == (RunState.FINISHED, RunState.NEW)
    grid = listing(t, [])
    assert "62.50" in grid and "new" in grid
    assert estimate(t).startswith("estimated time left, one run at a time: 2m for 1 runs, from 1 finished")
    assert "62.50" in summary_table(t)
    written = write_tables(tables_of(collect([str(table)], str(tmp_path / "runs"), [], None)), tmp_path / "report")
    assert [p.name for p in written] == ["table.md", "table.csv", "table.tex"]
    assert "62.50" in written[0].read_text()
