"""Checkpoints and resume: a run stopped by a signal and resumed equals the run never stopped, and so
does every method that keeps state, trained further from a checkpoint."""
import json
import signal
import subprocess
import sys
import time

import pytest

from conftest import (LAUNCH, REPO, assert_resumed_equals_uninterrupted, assert_same_model, env, final_model, metrics,
                      run_debug, run_mpi, small_setup, tiny)
from mpifed.run import checkpoint
from mpifed.algorithms.base import Server
from mpifed.registry import ALGORITHMS

pytestmark = pytest.mark.e2e


def start(cmd):
    return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop_after(proc, marker, sig=signal.SIGUSR1, timeout=240):
    """Send ``sig`` once ``marker`` appears in the output; return (exit code, output)."""
    out = []
    deadline = time.time() + timeout
    sent = False
    for line in proc.stdout:
        out.append(line)
        if not sent and marker in line:
            proc.send_signal(sig)
            sent = True
        if time.time() > deadline:
            proc.kill()
            break
    return proc.wait(), "".join(out)


def args_for(tmp, *extra, name):
    return tiny(tmp, "train.rounds=6", "run.checkpoint_every=2", *extra, name=name)


def test_stopped_by_a_signal_and_resumed_equals_uninterrupted_debug(tmp_path):
    run_debug(args_for(tmp_path, name="full"))
    code, out = stop_after(start([sys.executable, "-m", "mpifed.main", *args_for(tmp_path, name="cut")]), "round 2/6")
    assert code == 75, out
    assert "stopped after round" in out and " -m mpifed.main --resume " in out.split("continue with: ")[1]
    cut = tmp_path / "runs" / "cut"
    assert '"state": "stopped"' in (cut / "status.json").read_text()
    done = len(metrics(cut))
    assert 2 <= done < 6
    run_debug(["--resume", str(cut)])
    assert_same_model(final_model(cut), final_model(tmp_path / "runs" / "full"))
    assert metrics(cut) == metrics(tmp_path / "runs" / "full")


def _keeps_state(name):
    """Whether the method keeps state between rounds, as it declares it: its server's (Server.state, or a
    state_dict of its own) or its clients' (Messages.client_state)."""
    cls = ALGORITHMS.get(name)
    return bool(cls.Server.state or cls.Server.state_dict is not Server.state_dict
                or cls(cls.Options(), small_setup()).messages().client_state)


STATEFUL = [(f"algorithm.name={name}", *(["data.server_holdout_per_class=3"] if ALGORITHMS.get(name).needs_server_data
                                         else [])) for name in ALGORITHMS.names() if _keeps_state(name)]
STATEFUL.append(("algorithm.name=feddyn", "algorithm.evaluate=clients_mean", "algorithm.optimizer=official",
                 "train.momentum=0", "train.grad_clip=10"))      # FedDyn as its official code runs it: more state


@pytest.mark.parametrize("method", STATEFUL, ids=[" ".join(m).replace("algorithm.", "") for m in STATEFUL])
def test_every_stateful_method_resumed_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path, method):
    """The run's state after round 3 (its checkpoint, and the client states of clients that skipped
    rounds: 3 of 5 train each round) is all that round 4 onward needs: training further from it
    gives the numbers of the run never stopped."""
    sets = (*method, "train.participation=0.6")
    assert_resumed_equals_uninterrupted(tmp_path / "runs", args_for(tmp_path, *sets, name="full"),
                                        args_for(tmp_path, *sets, "train.rounds=3", name="cut"), rounds=6)


@pytest.mark.mpi
def test_stopped_and_resumed_equals_uninterrupted_mpi(has_mpirun, tmp_path):
    method = ("algorithm.name=fedcsd", "algorithm.mu=0.5")
    run_debug(args_for(tmp_path, *method, name="full"))   # the debug run equals the MPI run (test_method_behaviour)
    code, out = stop_after(start([str(LAUNCH), "3", *args_for(tmp_path, *method, name="cut")]), "round 2/6")
    assert code == 75, out
    run_mpi(3, ["--resume", str(tmp_path / "runs" / "cut")])
    assert_same_model(final_model(tmp_path / "runs" / "cut"), final_model(tmp_path / "runs" / "full"))
    assert metrics(tmp_path / "runs" / "cut") == metrics(tmp_path / "runs" / "full")


def test_more_rounds_on_resume_continue_the_same_run(tmp_path):
    run_debug(args_for(tmp_path, "algorithm.name=fedgkd", name="full"))
    short = tiny(tmp_path, "train.rounds=4", "run.checkpoint_every=2", "algorithm.name=fedgkd", name="short")
    run_debug(short)
    run_debug(["--resume", str(tmp_path / "runs" / "short"), "--set", "train.rounds=6", "run.eval_every=1"])
    assert_same_model(final_model(tmp_path / "runs" / "short"), final_model(tmp_path / "runs" / "full"))
    assert metrics(tmp_path / "runs" / "short") == metrics(tmp_path / "runs" / "full")


def test_resume_refuses_changes_to_the_math(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=2"))
    p = run_debug(["--resume", str(tmp_path / "runs" / "run"), "--set", "train.lr=0.5",
                   "data.partition.beta=0.1"], check=False)
    assert p.returncode == 2
    assert "data.partition.beta" in p.stderr and "train.lr" in p.stderr and "change the results" in p.stderr


def test_resume_notices_that_the_prepared_population_changed(tmp_path):
    """The run's pinned prepared folder, re-prepared meanwhile with six clients instead of five: resuming
    refuses, naming the difference, instead of training another population."""
    import contextlib
    import io

    from mpifed.entry.prepare import main as prepare
    folder = tmp_path / "pinned"
    run_debug(tiny(tmp_path, f"data.prepared_dir={folder}"))
    with contextlib.redirect_stdout(io.StringIO()):
        assert prepare(tiny(tmp_path, f"data.prepared_dir={folder}", "data.num_clients=6") + ["--force"]) == 0
    p = run_debug(["--resume", str(tmp_path / "runs" / "run"), "--set", "train.rounds=3"], check=False)
    assert p.returncode == 2 and "made with other settings (differing: num_clients)" in p.stderr, p.stderr
    assert len(metrics(tmp_path / "runs" / "run")) == 2


def test_checkpoint_of_an_older_version_resumes_with_the_new_settings_at_their_defaults(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=2"))
    folder = tmp_path / "runs" / "run" / "checkpoints"
    state = checkpoint.load(checkpoint.latest(folder))
    del state["config_math"]["data"]["max_length"]
    checkpoint.save(folder, state["rounds_done"], state, keep=1)
    p = run_debug(["--resume", str(tmp_path / "runs" / "run"), "--set", "train.rounds=3"])
    assert "predates the settings data.max_length=128" in p.stdout and len(metrics(tmp_path / "runs" / "run")) == 3


def test_corrupt_checkpoint_is_reported_not_loaded(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=2"))
    latest = checkpoint.latest(tmp_path / "runs" / "run" / "checkpoints")
    latest.write_bytes(latest.read_bytes()[:-100])
    p = run_debug(["--resume", str(tmp_path / "runs" / "run")], check=False)
    assert p.returncode == 2 and "truncated" in p.stderr and latest.name in p.stderr


def test_resume_without_checkpoint_starts_the_run(tmp_path):
    p = run_debug(tiny(tmp_path, "train.rounds=1") + ["--resume"])
    assert "finished" in p.stdout and "no checkpoint" not in p.stdout      # a new run is no warning
    p = run_debug(["--resume", str(tmp_path / "nothing-here")], check=False)
    assert p.returncode == 2 and "no run there" in p.stderr
    p = run_debug(["--resume", "--set", f"run.root={tmp_path / 'runs'}"], check=False)
    assert p.returncode == 2 and "run.name is not set" in p.stderr


def test_resume_from_an_older_checkpoint_keeps_client_state(tmp_path):
    """Client-state versions stay while any kept checkpoint needs them, and a line torn by a
    crash mid-append does not stop the resume."""
    scaffold = ("algorithm.name=scaffold", "train.participation=0.6", "run.keep_checkpoints=3")
    run_debug(args_for(tmp_path, *scaffold, name="full"))
    run_debug(args_for(tmp_path, *scaffold, name="cut"))
    cut = tmp_path / "runs" / "cut"
    for rounds_done in (4, 6):
        checkpoint.path_for(cut / "checkpoints", rounds_done).unlink()
    with open(cut / "clients.jsonl", "a") as f:
        f.write('{"round": 7, "clie')
    p = run_debug(["--resume", str(cut)])
    assert "resuming" in p.stdout and "after round 2" in p.stdout
    assert_same_model(final_model(cut), final_model(tmp_path / "runs" / "full"))
    assert metrics(cut) == metrics(tmp_path / "runs" / "full")
    assert client_losses(cut) == client_losses(tmp_path / "runs" / "full")


def client_losses(run):
    rows = [json.loads(line) for line in (run / "clients.jsonl").read_text().splitlines()]
    return [(r["round"], [(c["cid"], c["train_loss"]) for c in r["clients"]]) for r in rows]


def test_client_state_is_a_store_of_a_few_files_not_a_file_per_client(tmp_path):
    run_debug(tiny(tmp_path, "algorithm.name=scaffold", "train.rounds=4", "run.checkpoint_every=0"))
    assert sorted(p.name for p in (tmp_path / "runs" / "run" / "client_state").iterdir()) == ["block_00000.bin",
                                                                                             "store.json"]


def test_resume_with_fewer_rounds_than_done_is_refused(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=2"))
    p = run_debug(["--resume", str(tmp_path / "runs" / "run"), "--set", "train.rounds=1"], check=False)
    assert p.returncode == 2 and "already completed 2 rounds" in p.stderr
