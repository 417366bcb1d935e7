"""A rank that dies or hangs ends the whole job quickly, naming the rank and the last checkpoint."""
import os
import re
import signal
import socket
import subprocess
import time

import pytest

from conftest import LAUNCH, REPO, env, tiny

pytestmark = [pytest.mark.mpi, pytest.mark.e2e]


def start_mpi(args):
    return subprocess.Popen([str(LAUNCH), "3", *args], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(proc, timeout=60):
    """Wait for the job to end (at most ``timeout`` s); return its output."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the job did not end:\n" + proc.communicate()[0])


STOPPING_CLIENT = '''
import os
import signal
from pathlib import Path

from mpifed.algorithms.base import Algorithm, Client
from mpifed.registry import ALGORITHMS


class StoppingClient(Client):
    """FedAvg's client, except that rank 2 stops (SIGSTOP) as it begins its first client of round 3."""

    def begin_client(self, ctx):
        if ctx.server_round == 3 and os.environ.get("OMPI_COMM_WORLD_RANK") == "2":
            Path(__file__).with_suffix(".pid").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)


@ALGORITHMS.register("stopping")
class Stopping(Algorithm):
    Client = StoppingClient
'''


def stopping_run(tmp_path, *extra):
    """A run in which rank 2 stops as it begins its first client of round 3, after the checkpoint of
    round 2: it stops there whatever the machine's load (a signal sent from outside needs rounds
    long enough to aim at, and those can outlast a short comm.timeout_s on a loaded machine, as
    can the other worker's round)."""
    plugin = tmp_path / "stopping.py"
    plugin.write_text(STOPPING_CLIENT)
    args = tiny(tmp_path, "algorithm.name=stopping", "train.participation=1.0", "train.rounds=6",
                "run.checkpoint_every=2", *extra)
    return plugin, start_mpi([*args, "--plugin", str(plugin)])


def since_fault(plugin):
    """Seconds since the plugin's rank stopped (it wrote its pid just before)."""
    return time.time() - plugin.with_suffix(".pid").stat().st_mtime


def kill_left_over(plugin):
    """SIGKILL the process whose pid the plugin wrote, if it is still there (a stopped rank)."""
    pid = plugin.with_suffix(".pid")
    if pid.exists():
        try:
            os.kill(int(pid.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def pid_of_rank_when(proc, rank, marker):
    """Read output until ``marker``; return the pid of ``rank`` from the start-up lines, and the output so far."""
    pid, out = None, []
    for line in proc.stdout:
        out.append(line)
        m = re.search(rf"rank {rank} \(worker\): host \S+ pid (\d+)", line)
        if m:
            pid = int(m.group(1))
        if marker in line:
            if pid:
                return pid, "".join(out)
            break
    os.killpg(proc.pid, signal.SIGKILL)          # not left running to its 400th round
    raise AssertionError("".join(out))


def test_killed_worker_ends_the_job_naming_rank_and_checkpoint(has_mpirun, tmp_path):
    """Killed from outside mid-training: rounds of about two seconds, the signal half a second after
    round 3 ends."""
    proc = start_mpi([*tiny(tmp_path, "train.rounds=400", "train.local_epochs=40", "run.checkpoint_every=2"),
                      "--verbose"])   # a line per rank, with its pid
    victim, before = pid_of_rank_when(proc, 2, "round 3/")
    time.sleep(0.5)
    os.kill(victim, signal.SIGKILL)
    start = time.time()
    text = before + finish(proc)
    assert time.time() - start < 60 and proc.returncode != 0
    assert re.search(r"rank 2 with PID \d+ .* exited on\s+signal 9", text), text
    last = text.strip().splitlines()[-1]      # the launcher's, whether or not rank 0 got to say it
    assert "[mpifed.launch] the job failed (mpirun exited with " in last and "Last checkpoint:" in last
    assert "round_000002.ckpt" in last and "--resume" in last, text


def test_hung_worker_is_named_after_the_timeout(has_mpirun, tmp_path):
    plugin, proc = stopping_run(tmp_path, "comm.timeout_s=5")
    try:
        text = finish(proc)
        took = since_fault(plugin)
    finally:
        kill_left_over(plugin)
    assert took < 60 and proc.returncode != 0
    host = socket.gethostname()       # rank 0 learnt every rank's host at start-up
    assert f"rank 0 on {host}: rank(s) 2 on {host} did not reach 'end of local training'" in text, text
    assert "comm.timeout_s=5" in text
    assert "Last checkpoint:" in text and "round_000002.ckpt" in text and "--resume" in text


STALLING_MODEL = '''
import os
import signal
from pathlib import Path

from mpifed.models.cnn import DigitsCNN
from mpifed.registry import MODELS


@MODELS.register("stalling_cnn")
class StallingCNN(DigitsCNN):
    """DigitsCNN, except that rank 2 stops (SIGSTOP) the first time it builds one."""

    @staticmethod
    def build(options, image_shape, num_classes):
        if os.environ.get("OMPI_COMM_WORLD_RANK") == "2":
            Path(__file__).with_suffix(".pid").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
        return DigitsCNN.build(options, image_shape, num_classes)
'''


def test_a_rank_hung_in_start_up_is_named_under_the_start_up_phase(has_mpirun, tmp_path):
    plugin = tmp_path / "stalling.py"
    plugin.write_text(STALLING_MODEL)
    proc = start_mpi(tiny(tmp_path, "model.name=stalling_cnn", "comm.timeout_s=5") + ["--plugin", str(plugin)])
    try:
        text = finish(proc, timeout=120)
    finally:
        kill_left_over(plugin)
    assert proc.returncode != 0
    host = socket.gethostname()       # rank 2's host is not known yet
    assert f"rank 0 on {host}: rank(s) 2 did not reach 'start-up: ranks'" in text and "comm.timeout_s=5" in text, text
