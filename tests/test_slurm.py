"""The sbatch scripts on a real one-node Slurm cluster started for this test session.

As root, the session installs Debian's slurm-wlm, munge and libpmix-dev when missing,
starts munged (if not running), slurmctld and slurmd on free ports with a configuration
in a temporary folder (the node declares 16 CPUs with SlurmdParameters=config_overrides),
its job ids starting at a random number (a step killed in an earlier session leaves its
pmix folder in /tmp under its job id, and a later job of that id would fail to start),
and credentials that expire after 20 s instead of 120 (Slurm holds a requeued job that
long before starting it again), and stops what it started at the end. Without root or
apt-get the tests are skipped.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, assert_same_model, final_model, metrics, write_tiny_table

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.e2e]

PACKAGES = ["slurm-wlm", "munge", "libpmix-dev"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _installed() -> bool:
    libpmix = any(Path(d, "libpmix.so").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                                                           "/usr/lib64", "/usr/lib"))
    return all(shutil.which(t) for t in ("slurmctld", "slurmd", "sbatch", "munged")) and libpmix


def _install() -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=True)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"could not install {' '.join(PACKAGES)}: {p.stderr[-500:]}")


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), PYTHON=sys.executable,
                        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.started: list[str] = []

    def start(self) -> None:
        host = socket.gethostname().split(".")[0]
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(f"""ClusterName=mpifedtest
SlurmctldHost={host}
AuthType=auth/munge
AuthInfo=cred_expire=20
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.pid
SlurmctldLogFile={self.root}/log/slurmctld.log
SlurmdLogFile={self.root}/log/slurmd.log
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=10
MinJobAge=3600
FirstJobId={random.randint(1000, 60_000_000)}
SlurmdParameters=config_overrides
NodeName={host} CPUs=16 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode != 0:
            Path("/run/munge").mkdir(parents=True, exist_ok=True)
            shutil.chown("/run/munge", "munge", "munge")
            subprocess.run(["munged", "--force"], check=True, capture_output=True)
            self.started.append("munged")
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([daemon, "-f", str(self.conf)], check=True, env=self.env)
            self.started.append(daemon)
        deadline = time.time() + 60
        while time.time() < deadline:
            p = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True)
            if p.returncode == 0 and p.stdout.strip() in ("idle", "mix", "alloc"):
                return
            time.sleep(1)
        raise RuntimeError(f"the Slurm node did not come up: {(self.root / 'log' / 'slurmd.log').read_text()[-2000:]}")

    def stop(self) -> None:
        """Cancel the jobs a failed test left (their slurmstepd outlives slurmd and would clash with the
        next session's job of the same id), then stop the daemons this session started."""
        p = subprocess.run(["squeue", "-h", "-o", "%A"], env=self.env, capture_output=True, text=True)
        jobs = p.stdout.split()
        if jobs:
            subprocess.run(["scancel", *jobs], env=self.env, capture_output=True)
            for jid in jobs:
                self.wait_for_steps_to_end(jid)
        for daemon in ("slurmd", "slurmctld"):
            pid_file = self.root / f"{daemon}.pid"
            if pid_file.exists():
                subprocess.run(["kill", pid_file.read_text().strip()], capture_output=True)
        if "munged" in self.started:
            subprocess.run(["pkill", "-x", "munged"], capture_output=True)

    def sbatch(self, *args: str, env: dict[str, str] | None = None) -> str:
        p = subprocess.run(["sbatch", "--parsable", *args], cwd=REPO, env={**self.env, **(env or {})},
                           capture_output=True, text=True, check=True)
        return p.stdout.strip().split(";")[0]

    def job(self, jid: str) -> dict[str, str]:
        p = subprocess.run(["scontrol", "show", "job", jid], env=self.env, capture_output=True, text=True)
        return dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)

    def wait(self, jid: str, states: tuple[str, ...] = ("COMPLETED",), timeout: float = 300) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.job(jid).get("JobState", "")
            if state in states or state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                return state
            time.sleep(1)
        raise TimeoutError(f"job {jid} still {self.job(jid).get('JobState')} after {timeout} s")

    def log_lines(self, jid: str) -> str:
        """The lines of slurmctld's and slurmd's logs that name job ``jid`` (for a failed test's message)."""
        lines = [f"{log}: {line}" for log in ("slurmctld", "slurmd")
                 for line in (self.root / "log" / f"{log}.log").read_text().splitlines() if jid in line]
        return "\n".join(lines)

    def start_requeued_when_eligible(self, jid: str, timeout: float = 60) -> None:
        """Once the requeued job ``jid`` may start again, have the scheduler start it now.

        Slurm keeps a requeued job pending until the old job's credentials have expired
        (cred_expire). Started sooner with StartTime=now, a restarted job once failed in CI
        before its script printed anything; after EligibleTime, StartTime=now only saves the
        wait for the next backfill cycle.
        """
        eligible = time.mktime(time.strptime(self.job(jid)["EligibleTime"], "%Y-%m-%dT%H:%M:%S"))
        assert eligible - time.time() < timeout, f"job {jid} is not eligible until {self.job(jid)['EligibleTime']}"
        self.wait_for_steps_to_end(jid)
        time.sleep(max(0.0, eligible + 1 - time.time()))
        self.run("scontrol", "update", f"JobId={jid}", "StartTime=now")

    def wait_for_steps_to_end(self, jid: str, timeout: float = 60) -> None:
        """Until no slurmstepd of job ``jid`` is left on the node."""
        deadline = time.time() + timeout
        while subprocess.run(["pgrep", "-f", rf"slurmstepd: \[{jid}\."], capture_output=True).returncode == 0:
            assert time.time() < deadline, f"job {jid}'s slurmstepd still there after {timeout} s"
            time.sleep(0.3)

    def run(self, *cmd: str) -> None:
        subprocess.run(list(cmd), env=self.env, check=True, capture_output=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a real Slurm test needs root to install and start slurmctld, slurmd and munged")
    if not shutil.which("apt-get") and not _installed():
        pytest.skip("Slurm is not installed and apt-get is not available to install it")
    if not _installed():
        _install()
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def quick_args(rounds: int) -> list[str]:
    return ["configs/quickstart.yaml", "--set", f"train.rounds={rounds}", "resources.threads=1",
            "run.checkpoint_every=4"]


def run_dir(runs: Path, jid: str) -> Path:
    return runs / f"quickstart-{jid}"


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_quickstart_sbatch_runs(cluster, tmp_path, launcher):
    runs = tmp_path / "runs"
    jid = cluster.sbatch("-n", "3", "-o", str(tmp_path / "%j.out"), "slurm/cpu.sbatch", *quick_args(3),
                         env={"MPIFED_RUNS": str(runs), "LAUNCHER": launcher})
    assert cluster.wait(jid) == "COMPLETED", (tmp_path / f"{jid}.out").read_text()
    log = (tmp_path / f"{jid}.out").read_text()
    assert f"3 ranks via {launcher}" in log and "MPI, 3 ranks (1 server + 2 workers)" in log
    summary = json.loads((run_dir(runs, jid) / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds_done"] == 3 and summary["final_test_acc"] > 0.5
    assert len(summary["peak_rss_mb_per_rank"]) == 3


def test_a_launcher_that_exits_0_without_running_mpifed_fails_the_job(cluster, tmp_path):
    """What srun did when it could not start the tasks: exit 0 with nothing run. The job must not end COMPLETED."""
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *mpifed.main*) exit 0;; esac\nexec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    jid = cluster.sbatch("-n", "2", "-o", str(tmp_path / "%j.out"), "slurm/cpu.sbatch", *quick_args(3),
                         env={"MPIFED_RUNS": str(tmp_path / "runs"), "PYTHON": str(fake)})
    assert cluster.wait(jid) == "FAILED"
    log = (tmp_path / f"{jid}.out").read_text()
    assert "exited with code 0; run state: unknown" in log, log
    assert "not finished (state: unknown): failing the job" in log, log


def test_warning_signal_requeues_and_resumes_to_the_same_result(cluster, tmp_path):
    runs = tmp_path / "runs"
    env = {"MPIFED_RUNS": str(runs)}
    full = cluster.sbatch("-n", "3", "-o", str(tmp_path / "%j.out"), "slurm/cpu.sbatch", *quick_args(10), env=env)
    cut = cluster.sbatch("-n", "3", "-o", str(tmp_path / "%j.out"), "slurm/cpu.sbatch", *quick_args(10), env=env)
    out = tmp_path / f"{cut}.out"
    deadline = time.time() + 180
    while "round 3/" not in (out.read_text() if out.exists() else ""):
        assert time.time() < deadline, "the job never reached round 3"
        time.sleep(0.3)
    cluster.run("scancel", "--batch", "--signal=USR1", cut)      # what --signal=B:USR1@T sends
    assert cluster.wait(cut, ("PENDING",), timeout=120) == "PENDING", out.read_text()   # requeued by the script
    cluster.start_requeued_when_eligible(cut)
    assert cluster.wait(cut) == "COMPLETED", out.read_text() + "\n" + cluster.log_lines(cut)
    assert cluster.wait(full) == "COMPLETED"
    log = out.read_text()
    assert "warning signal" in log and "requeueing" in log and "(restart 1)" in log and "resuming" in log
    assert cluster.job(cut)["Restarts"] == "1"
    assert_same_model(final_model(run_dir(runs, cut)), final_model(run_dir(runs, full)))
    assert metrics(run_dir(runs, cut)) == metrics(run_dir(runs, full))


PLUGIN = """from mpifed.algorithms.base import Algorithm
from mpifed.registry import ALGORITHMS


@ALGORITHMS.register("slurm_mine")
class Mine(Algorithm):
    \"\"\"FedAvg under a name of its own, from a file outside mpifed.\"\"\"
"""


def test_table_as_array_job(cluster, tmp_path):
    """One task per run; the table's own method comes from a file outside the repository, which the
    table names: the tasks need nothing more."""
    table = write_tiny_table(tmp_path / "t", tmp_path / "data", seeds="[0]")
    (tmp_path / "mine.py").write_text(PLUGIN)
    (tmp_path / "t" / "b.yaml").write_text("algorithm: slurm_mine\n")
    table.write_text("plugins: [../mine.py]\n" + table.read_text())
    runs_file = tmp_path / "runs.txt"
    subprocess.run([sys.executable, "-m", "mpifed.table", str(table), "--runs-root", str(tmp_path / "runs"),
                    "--write-runs", str(runs_file)], cwd=REPO, env=cluster.env, check=True, capture_output=True)
    jid = cluster.sbatch("--array=0-1", "-n", "3", "-o", str(tmp_path / "%A_%a.out"), "slurm/array.sbatch",
                         str(runs_file))
    for task in ("0", "1"):
        assert cluster.wait(f"{jid}_{task}") == "COMPLETED", (tmp_path / f"{jid}_{task}.out").read_text()
    for name in ("s-a-s0", "s-b-s0"):
        assert json.loads((tmp_path / "runs" / "t-x" / name / "summary.json").read_text())["status"] == "finished"
    assert json.loads((tmp_path / "runs" / "t-x" / "s-b-s0" / "summary.json").read_text())["algorithm"] == "slurm_mine"
