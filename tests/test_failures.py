"""A rank that dies or hangs ends the whole job quickly, naming the rank and the last checkpoint."""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import LAUNCH, REPO, env, tiny

pytestmark = [pytest.mark.mpi, pytest.mark.e2e]


def start_mpi(args):
    return subprocess.Popen([str(LAUNCH), "3", *args], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def pid_of_rank_when(proc, rank, marker, out):
    """Read output until ``marker``; return the pid of ``rank`` from the start-up lines."""
    pid = None
    for line in proc.stdout:
        out.append(line)
        m = re.search(rf"rank {rank} \(worker\): host \S+ pid (\d+)", line)
        if m:
            pid = int(m.group(1))
        if marker in line and pid:
            return pid
    raise AssertionError("".join(out))


def finish(proc, out, timeout=60):
    start = time.time()
    try:
        rest, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the job did not end:\n" + "".join(out))
    return time.time() - start, "".join(out) + rest


def long_run(tmp_path, *extra):
    """Rounds of about two seconds, so that a signal sent just after a round ends lands mid-training."""
    return tiny(tmp_path, "train.rounds=400", "train.local_epochs=40", "run.checkpoint_every=2", *extra)


def test_killed_worker_ends_the_job_naming_rank_and_checkpoint(has_mpirun, tmp_path):
    out = []
    proc = start_mpi(long_run(tmp_path))
    victim = pid_of_rank_when(proc, 2, "round 3/", out)
    time.sleep(0.5)
    os.kill(victim, signal.SIGKILL)
    took, text = finish(proc, out)
    assert took < 60 and proc.returncode != 0
    assert re.search(r"rank 2 with PID \d+ .* exited on\s+signal 9", text), text
    assert "Last checkpoint:" in text and "round_000002.ckpt" in text and "--resume" in text


def test_hung_worker_is_named_after_the_timeout(has_mpirun, tmp_path):
    out = []
    proc = start_mpi(long_run(tmp_path, "comm.timeout_s=5"))
    victim = pid_of_rank_when(proc, 2, "round 3/", out)
    time.sleep(0.5)
    os.kill(victim, signal.SIGSTOP)
    try:
        took, text = finish(proc, out)
    finally:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert took < 60 and proc.returncode != 0
    assert "rank 0: rank(s) 2 did not reach 'end of local training'" in text and "comm.timeout_s=5" in text, text
    assert "Last checkpoint:" in text and "--resume" in text


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
    out = []
    proc = start_mpi(tiny(tmp_path, "model.name=stalling_cnn", "comm.timeout_s=5") + ["--plugin", str(plugin)])
    try:
        took, text = finish(proc, out, timeout=120)
    finally:
        pid = plugin.with_suffix(".pid")
        if pid.exists():
            try:
                os.kill(int(pid.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode != 0
    assert "rank 0: rank(s) 2 did not reach 'start-up: ranks'" in text and "comm.timeout_s=5" in text, text
