"""Rank 0's outputs besides the run files: the round line's ETA, the live bar, the trackers
(TensorBoard, MLflow, W&B)."""
import io
import json
import struct
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

from conftest import REPO, env, run_debug, tiny
from mpifed.run.progress import Progress, duration


def test_durations_and_eta():
    assert [duration(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m"]
    p = Progress(total=10, start=4, live=False)
    p.begun -= 20.0                                   # 2 rounds (5 and 6) took 20 s: 4 more take 40 s
    assert p.eta(6) == "ETA 40s"


def test_with_a_time_budget_the_line_shows_the_simulated_clock_and_the_eta_follows_it():
    p = Progress(total=100_000, start=0, live=False)
    p.budget_from(3600.0, 600.0)                      # a resumed run: 600 simulated s before this invocation
    p.begun -= 30.0                                   # 10 rounds took 30 s and 300 simulated s: 2700 s more
    assert p.eta(10, 900.0) == "ETA 4m30s"
    row = {"test_acc": 0.71234, "test_loss": 12.3456, "val_acc": 0.69871, "train_loss": 10.0123,
           "time": {"round": 123.456}, "sim_clock": 3599.5}
    line = p.line(99_999, row)
    assert line.startswith("round 99999 t=3600s  acc 0.7123") and len(line) <= 100, line
    assert Progress(total=10, start=0, live=False).line(1, {**row, "time": {"round": 1.0}}).startswith("round 1/10 ")

def test_a_round_line_fits_in_100_columns_whatever_it_shows():
    p = Progress(total=1000, start=0, live=False)
    p.begun -= 40_000.0
    row = {"test_acc": 0.71234, "test_loss": 12.3456, "val_acc": 0.69871, "train_loss": 10.0123,
           "time": {"round": 123.456}}
    line = p.line(1, row)
    assert line.startswith("round 1/1000  acc 0.7123  loss 12.3456  val_acc 0.6987  train_loss 10.0123  123.46 s  ETA ")
    assert len(p.line(999, row)) <= 100 and len(line) <= 100, line
    assert p.line(3, {"train_loss": 0.5, "time": {"round": 1.0}}).startswith("round 3/1000  train_loss 0.5000  1.00 s")


@pytest.mark.e2e
def test_round_lines_carry_the_eta_and_no_bar_without_a_terminal(tmp_path):
    p = run_debug(tiny(tmp_path, "train.rounds=2"))
    lines = [line for line in p.stdout.splitlines() if line.startswith("round ")]
    assert len(lines) == 2 and all("ETA" in line and len(line) <= 100 for line in lines)
    assert "\r" not in p.stdout and "round/s" not in p.stderr and "it/s" not in p.stderr


def test_live_bar_keeps_lines_above_it():
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        p = Progress(total=3, start=0, live=True)
        p.write("round 1/3 ...")
        p.advance(1)
        p.close()
    assert "round 1/3 ..." in out.getvalue() and "1/3 [" in out.getvalue() and not err.getvalue()


@pytest.mark.e2e
def test_tensorboard_events_hold_the_metrics_rows(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out = run_debug(tiny(tmp_path, "train.rounds=3", "run.tensorboard=true")).stdout
    run = tmp_path / "runs" / "run"
    assert f"TensorBoard events in {run / 'tensorboard'}; view them with: tensorboard --logdir {run.parent}" in out
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    acc = [(e.step, e.value) for e in events.Scalars("test_acc")]
    assert acc == [(r["round"], pytest.approx(r["test_acc"])) for r in rows]
    assert {"train_loss", "lr", "time/round", "per_class_acc/0"} <= set(events.Tags()["scalars"])

    from tensorboard.plugins.hparams import plugin_data_pb2
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["train.lr"].number_value == pytest.approx(0.05)
    assert start.hparams["algorithm.name"].string_value == "fedavg"
    assert start.hparams["data.num_clients"].number_value == 5
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert {"test_acc", "val_acc"} <= {m.name.tag for m in experiment.metric_infos}
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "    algorithm:\n" in config and "      name: fedavg\n" in config


@pytest.mark.e2e
def test_a_debug_run_goes_on_when_its_stdout_closes(tmp_path):
    """``python -m mpifed.main ... | head -1``: the run finishes, its log.txt has every line."""
    proc = subprocess.Popen([sys.executable, "-m", "mpifed.main", *tiny(tmp_path, "train.rounds=3")], cwd=REPO,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("[")
    proc.stdout.close()                                     # as head does after its line
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    run = tmp_path / "runs" / "run"
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    assert "round 3/3" in (run / "log.txt").read_text()


@pytest.mark.e2e
def test_a_new_run_started_with_resume_reads_as_a_start_and_counts_in_words(tmp_path):
    out = run_debug([*tiny(tmp_path, "train.rounds=1"), "--resume"]).stdout
    assert "no checkpoint" not in out
    assert ", 1 round; single process" in out and "finished: 1 round, final" in out


@pytest.mark.e2e
def test_mlflow_tracks_a_run_across_a_resume_and_gets_the_reports_figures(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from mpifed.entry.report import main as report_main
    out = run_debug(tiny(tmp_path, "train.rounds=2", "run.mlflow=true")).stdout
    run = tmp_path / "runs" / "run"
    record = json.loads((run / "mlflow.json").read_text())
    assert record["tracking_uri"] == (tmp_path / "runs" / "mlruns").resolve().as_uri()
    assert f"tracking: MLflow run {record['run_id']} (experiment 'quickstart')" in out   # the config file's name
    run_debug(["--resume", str(run), "--set", "train.rounds=3"])             # the same MLflow run goes on
    client = MlflowClient(record["tracking_uri"])
    tracked = client.get_run(record["run_id"])
    assert tracked.info.status == "FINISHED" and tracked.info.run_name == "run"
    assert tracked.data.params["data.num_clients"] == "5" and tracked.data.params["algorithm.name"] == "fedavg"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    history = sorted((m.step, m.value) for m in client.get_metric_history(record["run_id"], "test_acc"))
    assert history == [(r["round"], pytest.approx(r["test_acc"])) for r in rows]
    assert tracked.data.metrics["final_test_acc"] == pytest.approx(rows[-1]["test_acc"])
    assert "summary.json" in [a.path for a in client.list_artifacts(record["run_id"])]
    assert len(client.search_runs([tracked.info.experiment_id])) == 1

    assert report_main([str(tmp_path / "runs"), "--out", str(tmp_path / "report"), "--mlflow"]) == 0
    added = {a.path for a in client.list_artifacts(record["run_id"], "report")}
    assert {"report/table.md", "report/runs-curves.png"} <= added


@pytest.mark.e2e
def test_mlflow_follows_the_tracking_uri_of_the_environment_and_keeps_artifacts_in_its_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    store = (tmp_path / "elsewhere").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.chdir(tmp_path)
    run_debug(tiny(tmp_path, "train.rounds=1", "run.mlflow=true", "run.group=my-sweep"))
    record = json.loads((tmp_path / "runs" / "run" / "mlflow.json").read_text())
    assert record["tracking_uri"] == store and not (tmp_path / "runs" / "mlruns").exists()
    client = MlflowClient(store)
    tracked = client.get_run(record["run_id"])
    assert client.get_experiment(tracked.info.experiment_id).name == "my-sweep"
    assert tracked.info.artifact_uri.startswith(store) and not (tmp_path / "mlruns").exists()


@pytest.mark.e2e
def test_mlflow_tracks_a_run_in_a_sqlite_store_as_mlflows_docs_show_it(tmp_path):
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow.tracking import MlflowClient
    store = f"sqlite:///{tmp_path}/mlflow.db"
    run_debug(tiny(tmp_path, "train.rounds=1", "run.mlflow=true", f"run.mlflow_uri={store}"))
    record = json.loads((tmp_path / "runs" / "run" / "mlflow.json").read_text())
    tracked = MlflowClient(store).get_run(record["run_id"])
    assert tracked.info.status == "FINISHED" and "test_acc" in tracked.data.metrics
    assert (tmp_path / "mlartifacts").is_dir()


@pytest.mark.e2e
def test_a_database_store_without_its_packages_is_one_message_naming_the_extra(tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "alembic" else real(name, *a))
    p = run_debug(tiny(tmp_path, "run.mlflow=true", f"run.mlflow_uri=sqlite:///{tmp_path}/mlflow.db"), check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert (f"the store sqlite:///{tmp_path}/mlflow.db is a database, which MLflow reaches through alembic, not "
            f"installed: pip install 'mpifed[mlflow]'") in p.stderr
    assert not (tmp_path / "runs" / "run").exists()


def test_an_experiment_in_a_sqlite_store_keeps_its_artifacts_beside_the_database(tmp_path):
    from mpifed.run.mlflow_log import artifact_location
    assert artifact_location(f"sqlite:///{tmp_path}/db/mlflow.db") == (tmp_path / "db" / "mlartifacts").as_uri()
    assert artifact_location("http://server:5000") is None and artifact_location(tmp_path.as_uri()) is None


def wandb_records(folder):
    """The records of every offline W&B run file under ``folder``, file by file, as protobuf messages
    (the file: a 7-byte header, then LevelDB-log records in 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2
    out = []
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        raw, pos, part, records = path.read_bytes(), 7, b"", []
        assert raw.startswith(b":W&B")
        while pos + 7 <= len(raw):
            room = 32768 - pos % 32768
            if room < 7:
                pos += room
                continue
            _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
            if kind == 0:
                pos += room
                continue
            part, pos = part + raw[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):          # a whole record, or a record's last piece
                records.append(wandb_internal_pb2.Record.FromString(part))
                part = b""
        out.append(records)
    return out


def wandb_key(item):
    return item.key or "/".join(item.nested_key)


@pytest.fixture
def wandb_home(tmp_path, monkeypatch):
    """W&B installed (else the test is skipped), its settings and caches kept inside ``tmp_path``."""
    pytest.importorskip("wandb")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))


@pytest.mark.e2e
def test_wandb_offline_holds_the_config_the_group_and_every_round_across_a_resume(tmp_path, monkeypatch, wandb_home):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = run_debug(tiny(tmp_path, "train.rounds=2", "run.wandb=true", "run.wandb_project=proj")).stdout
    run = tmp_path / "runs" / "run"
    record = json.loads((run / "wandb.json").read_text())
    assert record["round"] == 2
    assert f"tracking: W&B run {record['id']} (project 'proj', group 'quickstart'): offline" in out
    run_debug(["--resume", str(run), "--set", "train.rounds=3"])
    for _ in range(60):       # wandb's service closes a run's file a moment after finish() returns
        files = wandb_records(run)
        if len(files) == 2 and all(f and f[-1].WhichOneof("record_type") == "exit" for f in files):
            break
        time.sleep(0.5)
    assert len(files) == 2 and all(f and f[-1].WhichOneof("record_type") == "exit" for f in files)
    started = [r.run for records in files for r in records if r.WhichOneof("record_type") == "run"]
    assert {(s.run_id, s.project, s.run_group, s.display_name) for s in started} == {
        (record["id"], "proj", "quickstart", "run")}
    config = {wandb_key(u): json.loads(u.value_json) for u in started[0].config.update}
    assert config["train"]["lr"] == pytest.approx(0.05) and config["algorithm"]["name"] == "fedavg"
    history = [(r.history.step.num, {wandb_key(i): json.loads(i.value_json) for i in r.history.item})
               for records in files for r in records if r.WhichOneof("record_type") == "history"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(step, h["test_acc"]) for step, h in history] == [(r["round"], pytest.approx(r["test_acc"])) for r in rows]
    summary = {wandb_key(i): json.loads(i.value_json) for r in files[1] if r.WhichOneof("record_type") == "summary"
               for i in r.summary.update}
    assert summary["status"] == "finished" and summary["final_test_acc"] == pytest.approx(rows[-1]["test_acc"])


@pytest.mark.e2e
def test_a_run_without_tracking_never_imports_mlflow(tmp_path):
    code = ("import sys; from mpifed.entry.main import main; "
            f"code = main({tiny(tmp_path)!r}); sys.exit(code or ('mlflow' in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.e2e
def test_tracking_without_its_package_is_one_message_before_anything_starts(tmp_path, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    p = run_debug(tiny(tmp_path, "run.mlflow=true"), check=False)
    assert p.returncode == 2 and "run.mlflow=true needs the mlflow package: pip install 'mpifed[mlflow]'" in p.stderr
    assert not (tmp_path / "runs" / "run").exists()


@pytest.mark.e2e
def test_wandb_that_cannot_start_is_one_message_naming_the_ways_out(tmp_path, monkeypatch, wandb_home):
    monkeypatch.setenv("WANDB_MODE", "no-such-mode")
    # a process of its own: in this one, a W&B session an earlier test started ignores WANDB_MODE
    code = f"import sys; from mpifed.entry.main import main; sys.exit(main({tiny(tmp_path, 'run.wandb=true')!r}))"
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "run.wandb: W&B did not start the run" in p.stderr, p.stderr
    assert "WANDB_MODE=offline" in p.stderr and "Traceback" not in p.stderr
