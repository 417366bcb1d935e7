"""Fault injection with real processes: kill -9 of the server and of a worker mid-round, a worker
stopped beyond comm.timeout_s, a full disk, a corrupt checkpoint, a torn jsonl line, two runs
racing for one name, changed raw data, a partition file changed before a resume, a run folder
whose provenance.json an attacker crafted to run code of theirs.

After each fault the run directory is checked on disk: no file mixes runs, status.json (as
:meth:`RunDir.status` reads it) tells the truth, and ``--resume`` either continues exactly
(equal to the uninterrupted run) or refuses with a message.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import (LAUNCH, REPO, assert_same_model, command, env, final_model, metrics, plugin_method,
                      run_debug, run_mpi, tiny)
from mpifed.run import checkpoint
from mpifed.settings.config import build
from mpifed.local.optim import round_lr
from mpifed.run.rundir import RunDir

pytestmark = pytest.mark.e2e

ROUNDS = ("train.rounds=4", "train.local_epochs=8", "run.checkpoint_every=2")   # rounds long enough to aim a signal at
SHORT = ("train.rounds=4", "run.checkpoint_every=2")   # for faults made between runs, which need no long rounds


def args(tmp, *extra, name="cut", rounds=ROUNDS):
    return tiny(tmp, *rounds, *extra, name=name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (debug mode: the same results as any rank count)."""
    tmp = tmp_path_factory.mktemp("reference")
    run_debug(args(tmp, name="full"))
    return tmp / "runs" / "full"


@pytest.fixture(scope="module")
def short_reference(tmp_path_factory):
    """The uninterrupted run of the SHORT rounds."""
    tmp = tmp_path_factory.mktemp("short_reference")
    run_debug(args(tmp, name="full", rounds=SHORT))
    return tmp / "runs" / "full"


def same_data(tmp, reference):
    """Use the reference's prepared data (tiny() puts it under tmp/data)."""
    (tmp / "data").symlink_to(reference.parents[1] / "data")


def start(cmd):
    return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def pids_when(proc, marker, out):
    """Read output until ``marker``; return {rank: pid} from the start-up lines."""
    pids = {}
    for line in proc.stdout:
        out.append(line)
        m = re.search(r"rank (\d+) \((?:server|worker|server and worker)\): host \S+ pid (\d+)", line)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
        if marker in line:
            if pids:
                return pids
            break
    os.killpg(proc.pid, signal.SIGKILL)          # not left running to its 400th round
    raise AssertionError("".join(out))


def finish(proc, out, timeout=90):
    try:
        rest, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the job did not end:\n" + "".join(out))
    return "".join(out) + rest


def assert_one_run(run, lr=None):
    """Every record in ``run`` belongs to one run: rounds 1..n once each, in order, in both logs; each
    row's learning rate follows config.yaml's; the checkpoints hold config.yaml's config; no temporary file."""
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    rows = metrics(run)
    assert [r["round"] for r in rows] == list(range(1, len(rows) + 1))
    clients = [json.loads(line)["round"] for line in (run / "clients.jsonl").read_text().splitlines()]
    assert clients == [r["round"] for r in rows]
    train = build(cfg).train
    assert all(r["lr"] == round_lr(train, r["round"] - 1) for r in rows) and (lr is None or train.lr == lr)
    for ckpt in checkpoint.all_checkpoints(run / "checkpoints"):
        assert checkpoint.load(ckpt)["config"] == cfg
    assert not [f for f in run.rglob("*") if ".tmp" in f.name]


def assert_resumes_exactly(run, reference, mpi=0):
    if mpi:
        run_mpi(mpi, ["--resume", str(run)])
    else:
        run_debug(["--resume", str(run)])
    assert RunDir(run).status()["state"] == "finished"
    assert metrics(run) == metrics(reference)
    assert_same_model(final_model(run), final_model(reference))
    assert_one_run(run)


@pytest.mark.mpi
@pytest.mark.parametrize("victim", [0, 2], ids=["server", "worker"])
def test_kill_9_mid_round(has_mpirun, tmp_path, reference, victim):
    same_data(tmp_path, reference)
    out = []
    proc = start([str(LAUNCH), "3", *args(tmp_path), "--verbose"])      # a line per rank, with its pid
    pids = pids_when(proc, "round 3/", out)
    os.kill(pids[victim], signal.SIGKILL)
    text = finish(proc, out)
    assert proc.returncode == 128 + signal.SIGKILL, text      # as docs/operations.md's table of exit codes says
    run = tmp_path / "runs" / "cut"
    status = RunDir(run).status()
    assert status["state"] == "failed", status
    assert 2 <= len(metrics(run)) < 4
    assert_one_run(run)
    assert_resumes_exactly(run, reference, mpi=3 if victim == 0 else 0)


@pytest.mark.mpi
def test_worker_stopped_beyond_the_timeout(has_mpirun, tmp_path, reference):
    same_data(tmp_path, reference)
    out = []
    proc = start([str(LAUNCH), "3", *args(tmp_path, "comm.timeout_s=10"), "--verbose"])
    pids = pids_when(proc, "round 3/", out)
    os.kill(pids[2], signal.SIGSTOP)
    try:
        text = finish(proc, out)
    finally:
        try:
            os.kill(pids[2], signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode != 0
    run = tmp_path / "runs" / "cut"
    on_disk = json.loads((run / "status.json").read_text())  # written by the server before MPI_Abort
    assert on_disk["state"] == "failed" and "comm.timeout_s=10" in on_disk["error"], text
    assert "failed:" in (run / "log.txt").read_text() and "comm.timeout_s=10" in (run / "log.txt").read_text()
    assert_one_run(run)
    assert_resumes_exactly(run, reference)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_full_disk_then_resume_after_freeing_space(tmp_path, short_reference):
    same_data(tmp_path, short_reference)
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        p = subprocess.run([sys.executable, "-m", "mpifed.main", *args(tmp_path, f"run.root={disk}", rounds=SHORT)],
                           cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert "No space left on device writing" in p.stderr and "--resume" in p.stderr
        run = disk / "cut"
        assert RunDir(run).status()["state"] == "failed"
        assert not [f for f in run.rglob("*") if ".tmp" in f.name]
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        assert_resumes_exactly(run, short_reference)
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def test_corrupt_checkpoint_is_refused_then_the_one_before_resumes_exactly(tmp_path, short_reference):
    same_data(tmp_path, short_reference)
    run_debug(args(tmp_path, "run.checkpoint_every=1", rounds=SHORT))
    run = tmp_path / "runs" / "cut"
    last = checkpoint.latest(run / "checkpoints")
    data = bytearray(last.read_bytes())
    data[-10] ^= 0xFF
    last.write_bytes(bytes(data))
    p = subprocess.run([sys.executable, "-m", "mpifed.main", "--resume", str(run)], cwd=REPO, env=env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "corrupt" in p.stderr and last.name in p.stderr and "delete it" in p.stderr
    assert RunDir(run).status()["state"] == "finished"
    last.unlink()
    assert_resumes_exactly(run, short_reference)


def test_torn_jsonl_lines_are_dropped_on_resume(tmp_path, short_reference):
    same_data(tmp_path, short_reference)
    run_debug(args(tmp_path, rounds=SHORT))
    run = tmp_path / "runs" / "cut"
    checkpoint.path_for(run / "checkpoints", 4).unlink()
    for log in ("metrics.jsonl", "clients.jsonl"):
        with open(run / log, "a") as f:
            f.write('{"round": 5, "tr')
    assert_resumes_exactly(run, short_reference)


@pytest.mark.mpi
def test_two_runs_racing_for_one_name(has_mpirun, tmp_path, reference):
    """The second run, even with --overwrite, is refused while the first is alive; the first's files stay its own."""
    same_data(tmp_path, reference)
    out = []
    first = start([str(LAUNCH), "2", *args(tmp_path, "train.lr=0.05", "train.rounds=400"), "--verbose"])
    pids = pids_when(first, "round 1/", out)
    second = run_debug(args(tmp_path, "train.lr=0.01") + ["--overwrite"], check=False)   # any mode: the same lock
    first.send_signal(signal.SIGUSR1)
    text = finish(first, out)
    assert first.returncode == 75, text
    assert second.returncode == 2 and "in use by another run" in second.stderr, second.stderr
    assert f"pid {pids[0]}" in second.stderr
    run = tmp_path / "runs" / "cut"
    assert RunDir(run).status()["state"] == "stopped" and len(metrics(run)) >= 1
    assert "[mpifed] stopped: " in text and "final test accuracy" not in text   # stopped: no final accuracy yet
    assert_one_run(run, lr=0.05)


def test_changed_raw_data_refuses_run_and_resume(tmp_path):
    from test_rundir import tiny_mnist, write_mnist
    write_mnist(tmp_path / "mnist", 200, 50, seed=0)
    run_debug(tiny_mnist(tmp_path))
    write_mnist(tmp_path / "mnist", 200, 50, seed=1)  # same sizes, other images and labels
    run = tmp_path / "runs" / "run"
    before = (run / "summary.json").read_bytes()
    for cmd in (tiny_mnist(tmp_path, name="b"), ["--resume", str(run), "--set", "train.rounds=2"]):
        p = subprocess.run([sys.executable, "-m", "mpifed.main", *cmd], cwd=REPO, env=env(), capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and "raw data changed" in p.stderr and "--force" in p.stderr, p.stderr
        assert str(Path(tmp_path / "mnist").resolve()) in p.stderr
    assert (run / "summary.json").read_bytes() == before and RunDir(run).status()["state"] == "finished"


def test_changed_partition_file_refuses_resume_until_it_is_put_back(tmp_path):
    split = tmp_path / "split.json"
    clients = {str(k): list(range(60 * k, 60 * (k + 1))) for k in range(5)}
    split.write_text(json.dumps(clients))
    run_debug(args(tmp_path, f"data.partition={{name: from_file, path: {split}}}", "train.rounds=2", rounds=SHORT))
    run = tmp_path / "runs" / "cut"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    swapped = {**clients, "0": clients["1"], "1": clients["0"]}
    split.write_text(json.dumps(swapped))
    resume = [sys.executable, "-m", "mpifed.main", "--resume", str(run), "--set", "train.rounds=3"]
    p = subprocess.run(resume, cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert f"the partition file {split} changed since the run started" in p.stderr and "Put back" in p.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before
    split.write_text(json.dumps(clients))
    run_debug(["--resume", str(run), "--set", "train.rounds=3"])
    assert len(metrics(run)) == 3 and RunDir(run).status()["state"] == "finished"


# ------------------------------------------------------------------ nothing runs, nothing is lost
def _finished(tmp, reference, name="done"):
    same_data(tmp, reference)
    run_debug(args(tmp, "train.rounds=2", name=name, rounds=SHORT))
    return tmp / "runs" / name


def _rewrite_checkpoint(run, **extra):
    """The run's latest checkpoint written again with ``extra`` entries (a well-formed file: header and checksum)."""
    latest = checkpoint.latest(run / "checkpoints")
    payload = {**checkpoint.load(latest), **extra}
    checkpoint.save(run / "checkpoints", checkpoint.rounds_done(latest), payload, keep=2)


class _Runs:
    """Unpickling this calls open(path, "w"): code from the file, run by loading it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_that_would_run_code_is_not_loaded(tmp_path, short_reference):
    run = _finished(tmp_path, short_reference)
    ran = tmp_path / "the-payload-ran"
    _rewrite_checkpoint(run, extra=_Runs(ran))
    p = run_debug(["--resume", str(run), "--set", "train.rounds=3"], check=False)
    assert p.returncode == 2 and not ran.exists()
    assert re.search(r"holds a Python object \(\S*open\) beyond the tensors and plain values", p.stderr)
    assert "--trust-checkpoint" in p.stderr and "Traceback" not in p.stderr


def test_a_trusted_checkpoint_with_other_objects_resumes_when_asked(tmp_path, short_reference):
    import argparse
    run = _finished(tmp_path, short_reference)
    _rewrite_checkpoint(run, note=argparse.Namespace(by="an older mpifed"))
    p = run_debug(["--resume", str(run), "--set", "train.rounds=3"], check=False)
    assert p.returncode == 2 and "argparse.Namespace" in p.stderr
    run_debug(["--resume", str(run), "--set", "train.rounds=3", "--trust-checkpoint"])
    assert len(metrics(run)) == 3


def test_a_checkpoint_without_a_runs_state_is_one_message(tmp_path, short_reference):
    run = _finished(tmp_path, short_reference)
    latest = checkpoint.latest(run / "checkpoints")
    checkpoint.save(run / "checkpoints", checkpoint.rounds_done(latest), {"rounds_done": 2}, keep=2)
    p = run_debug(["--resume", str(run), "--set", "train.rounds=3"], check=False)
    assert p.returncode == 2 and "is not a checkpoint of an mpifed run (it lacks global_floats" in p.stderr


def test_links_in_a_run_directory_are_never_followed(tmp_path, short_reference):
    from mpifed.tables.archive import archive_runs
    run = _finished(tmp_path, short_reference)
    secret = tmp_path / "secret.txt"
    secret.write_text("password hashes\n")
    (run / "notes.txt").symlink_to(secret)
    done = archive_runs([run], run.parent, tmp_path / "archive", [])
    copy = tmp_path / "archive" / run.name
    assert done.links == [run / "notes.txt"]
    assert not (copy / "notes.txt").exists() and (copy / "metrics.jsonl").is_file()
    (run / "notes.txt").unlink()
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's log\n")
    (run / "log.txt").unlink()
    (run / "log.txt").symlink_to(victim)
    p = run_debug(["--resume", str(run), "--set", "train.rounds=3"], check=False)
    assert p.returncode == 2 and "holds symbolic links where a run keeps its own files (log.txt)" in p.stderr
    assert victim.read_text() == "someone else's log\n" and len(metrics(run)) == 2


def test_a_run_never_takes_over_a_folder_mpifed_did_not_make(tmp_path, short_reference):
    same_data(tmp_path, short_reference)
    foreign = tmp_path / "runs" / "foreign"
    (foreign / "client_state").mkdir(parents=True)
    (foreign / "client_state" / "important.txt").write_text("keep me\n")
    (foreign / "notes.txt").write_text("mine\n")
    before = sorted(p.relative_to(foreign) for p in foreign.rglob("*"))
    for extra in ([], ["--overwrite"]):
        p = run_debug(args(tmp_path, name="foreign", rounds=SHORT) + extra, check=False)
        assert p.returncode == 2 and f"{foreign} exists and was not made by mpifed" in p.stderr
        assert sorted(p.relative_to(foreign) for p in foreign.rglob("*")) == before
    (tmp_path / "runs" / "empty").mkdir()
    run_debug(args(tmp_path, "train.rounds=1", name="empty", rounds=SHORT))   # an empty folder is used
    assert (tmp_path / "runs" / "empty" / ".mpifed-run").is_file()


SETTING = """data:
  dataset: {name: synthetic, train_samples: 300, test_samples: 120}
  num_clients: 5
  partition: {name: dirichlet, beta: 0.5, min_size: 5}
  prepared_root: data
train: {rounds: 2, local_epochs: 1, batch_size: 16, eval_batch_size: 50}
resources: {threads: 1, device: cpu}
"""


@pytest.fixture(scope="module")
def plugin_table(tmp_path_factory):
    """A table of one run of a method of the user's own (penalty.py, named by the table file), run."""
    home = tmp_path_factory.mktemp("plugin_table")
    (home / "penalty.py").write_text(plugin_method("penalty"))
    (home / "t").mkdir()
    (home / "t" / "s.yaml").write_text(SETTING)
    (home / "t" / "mine.yaml").write_text("algorithm: {name: penalty, penalty: 0.05}\n")
    (home / "t" / "t.table.yaml").write_text("plugins: [../penalty.py]\nmetric: final_test_acc\nsettings: [s.yaml]\n"
                                             "methods: [mine.yaml]\nseeds: [0]\n")
    subprocess.run([sys.executable, "-m", "mpifed.table", "t/t.table.yaml", "--run", "0"], cwd=home, env=env(),
                   check=True, capture_output=True, timeout=300)
    return home


def _copy_of(plugin_table, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(plugin_table, home, symlinks=True)
    return home, home / "runs" / "t-t" / "s-mine-s0"


@pytest.mark.parametrize("how", ["origin", "copy up", "copy absolute"])
def test_a_crafted_provenance_runs_no_code_in_any_command(tmp_path, plugin_table, how):
    """An attacker's run folder: its provenance.json records as the run's plugin a file of theirs, by
    an absolute origin (with its hash) or a copy outside the run folder. Resume, evaluate, report and
    the table's summary run none of it; the first two refuse with one message, the readers read the
    run's names."""
    home, run = _copy_of(plugin_table, tmp_path)
    ran = tmp_path / "the-payload-ran"
    evil = tmp_path / "theirs" / "evil.py"
    evil.parent.mkdir()
    evil.write_text(f"import pathlib\npathlib.Path({str(ran)!r}).write_text('ran')\n" + plugin_method("evil"))
    record = json.loads((run / "provenance.json").read_text())
    plugin = record["segments"][-1]["plugins"][0]
    plugin.update(sha256=hashlib.sha256(evil.read_bytes()).hexdigest(), provides=["algorithm evil"],
                  files=["evil.py"], origin=str(evil) if how == "origin" else str(tmp_path / "gone.py"),
                  copy={"origin": None, "copy up": "../../../../theirs", "copy absolute": str(evil.parent)}[how])
    (run / "provenance.json").write_text(json.dumps(record))
    said = ("the run was made with code from outside mpifed, which mpifed runs only when you say so: plugin "
            f"{evil} (SHA-256" if how == "origin" else "records a plugin whose copy is not a folder of the run's "
            "plugins/ (")
    resumed = [command(home, "mpifed.main", "--resume", str(run), "--set", "train.rounds=3", check=False)]
    if how != "origin":   # refused in every case: trusting the run does not make a copy elsewhere the run's
        resumed.append(command(home, "mpifed.main", "--resume", str(run), "--set", "train.rounds=3",
                               "--trust-run-code", check=False))
    evaluated = command(home, "mpifed.evaluate", str(run), check=False)
    for p in (*resumed, evaluated):
        assert p.returncode == 2 and p.stderr.count(said) == 1 and "Traceback" not in p.stderr
    assert len(metrics(run)) == 2
    report = command(home, "mpifed.report", str(run.parent), "--out", str(tmp_path / "report"))
    summary = command(home, "mpifed.table", "t/t.table.yaml", "--summary", "--plugin", "penalty.py")
    assert "| mine |" in summary.stdout and "left out" not in summary.stdout and "Traceback" not in report.stderr
    assert not ran.exists()


def test_a_run_of_a_plugin_resumes_with_the_code_its_configs_name(tmp_path, plugin_table):
    """As the Slurm scripts resume a requeued job: the job's own arguments (a config naming the plugin)
    and --resume, no flag more."""
    home, run = _copy_of(plugin_table, tmp_path)
    (home / "job.yaml").write_text("plugins: [penalty.py]\n")
    refused = command(home, "mpifed.main", "--config", "t/s.yaml", "--config", "t/mine.yaml", "--set",
                      "train.rounds=3", "--resume", str(run), check=False)
    assert refused.returncode == 2 and f"its copy: {run}/plugins/penalty-" in refused.stderr
    command(home, "mpifed.main", "--config", "t/s.yaml", "--config", "t/mine.yaml", "--config", "job.yaml", "--set",
            f"run.root={run.parent}", f"run.name={run.name}", "train.rounds=3", "--resume")
    assert len(metrics(run)) == 3
