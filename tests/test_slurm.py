"""The sbatch scripts on a real Slurm cluster of three nodes started for this test session
(tests/slurm_cluster.py: a slurmd per network namespace, one slurmctld, munge).

Every job here trains the quick start's digits; a job's result is compared, metrics.jsonl value by
value and the final model, with a debug-mode run of the same seed on this host. Without root or
apt-get the tests are skipped; where namespaces cannot be made, the cluster has one node and the
tests that need more are skipped, saying why.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import REPO, assert_same_model, final_model, metrics, write_tiny_table
from mpifed.round.placement import choose_device
from slurm_cluster import Cluster, install, installed
from test_mps import STANDIN

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.e2e]

# What a site with several interfaces per node sets (docs/operations.md, "Several nodes"); each test
# node has one link, eth0, besides lo.
SITE = {"OMPI_MCA_btl_tcp_if_include": "eth0", "PRTE_MCA_oob_tcp_if_include": "eth0"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a real Slurm test needs root to install and start slurmctld, slurmd and munged")
    if not shutil.which("apt-get") and not installed():
        pytest.skip("Slurm is not installed and apt-get is not available to install it")
    if not installed():
        install()
    c = Cluster(tmp_path_factory.mktemp("slurm"), REPO, nodes=3)
    try:
        c.start()
        yield c
    finally:
        c.stop()
    assert not c.left_over(), f"the test cluster was not torn down: {c.left_over()}"


def quick_args(rounds: int) -> list[str]:
    return ["configs/quickstart.yaml", "--set", f"train.rounds={rounds}", "resources.threads=1",
            "run.checkpoint_every=2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Debug-mode runs (one process on this host) of the quick start for 3 and 10 rounds."""
    root = tmp_path_factory.mktemp("reference")
    procs = {rounds: subprocess.Popen(
        [sys.executable, "-m", "mpifed.main", "--config", *quick_args(rounds), f"run.root={root}",
         f"run.name=r{rounds}"], cwd=REPO, env={**os.environ, "MPIFED_PROGRESS": "0"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for rounds in (3, 10)}
    done = {}

    def get(rounds: int) -> Path:
        if rounds not in done:
            _, err = procs[rounds].communicate(timeout=300)
            assert procs[rounds].returncode == 0, err
            done[rounds] = root / f"r{rounds}"
        return done[rounds]
    yield get
    for p in procs.values():
        p.kill()
        p.wait()


def run_dir(runs: Path, jid: str) -> Path:
    return runs / f"quickstart-{jid}"


def assert_same_run(a: Path, b: Path) -> None:
    assert metrics(a) == metrics(b)
    assert_same_model(final_model(a), final_model(b))


def hosts(cluster: Cluster, nodelist: str) -> list[str]:
    return cluster.run("scontrol", "show", "hostnames", nodelist).split()


def ranks(run: Path, segment: int = -1) -> list[dict]:
    return json.loads((run / "provenance.json").read_text())["segments"][segment]["ranks"]


def assert_placed(run: Path, nodes: list[str], segment: int = -1) -> None:
    """The server on the first node; on each node the workers numbered 0, 1, ... among themselves,
    each on the device that number gives it."""
    placed = ranks(run, segment)
    assert placed[0]["role"] == "server" and placed[0]["host"] == nodes[0] and placed[0]["node_worker"] == -1
    per_node = defaultdict(list)
    for r in placed[1:]:
        per_node[r["host"]].append(r["node_worker"])
    assert sorted(per_node) == sorted(nodes), placed
    assert all(numbers == list(range(len(numbers))) for numbers in per_node.values()), placed
    for r in placed:
        assert r["device"] == choose_device(r["role"] == "server", r["node_worker"], "auto", "cpu", r["node_gpus"])


def out_file(tmp_path: Path, jid: str) -> str:
    path = tmp_path / f"{jid}.out"
    return path.read_text() if path.exists() else ""


def wait_for(tmp_path: Path, jid: str, text: str, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while text not in out_file(tmp_path, jid):
        assert time.time() < deadline, f"job {jid} never printed {text!r}: {out_file(tmp_path, jid)}"
        time.sleep(0.3)


def multi_node(cluster: Cluster, tmp_path: Path, rounds: int, launcher: str = "srun", nodes: int = 2,
               per_node: int = 2, env: dict[str, str] | None = None, exclude: str = "") -> str:
    extra = [f"--exclude={exclude}"] if exclude else []
    return cluster.sbatch(f"--nodes={nodes}", f"--ntasks-per-node={per_node}", "--gres=none", "--cpus-per-task=1",
                          *extra, "-o", str(tmp_path / "%j.out"), "slurm/multi-node.sbatch", *quick_args(rounds),
                          env={"MPIFED_RUNS": str(tmp_path / "runs"), "LAUNCHER": launcher, **SITE, **(env or {})})


def test_cpu_sbatch_on_one_node(cluster, tmp_path, reference):
    runs = tmp_path / "runs"
    jid = cluster.sbatch("-n", "4", "-o", str(tmp_path / "%j.out"), "slurm/cpu.sbatch", *quick_args(3),
                         env={"MPIFED_RUNS": str(runs)})
    assert cluster.wait(jid) == "COMPLETED", out_file(tmp_path, jid)
    log = out_file(tmp_path, jid)
    assert "4 ranks via srun" in log and "MPI, 4 ranks (1 server + 3 workers)" in log
    summary = json.loads((run_dir(runs, jid) / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds_done"] == 3 and summary["final_test_acc"] > 0.5
    assert len(summary["peak_rss_mb_per_rank"]) == 4
    assert len({r["host"] for r in ranks(run_dir(runs, jid))}) == 1
    assert_same_run(run_dir(runs, jid), reference(3))


def test_a_launcher_that_exits_0_without_running_mpifed_fails_the_job(cluster, tmp_path):
    """What srun did when it could not start the tasks: exit 0 with nothing run. The job must not end COMPLETED."""
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *mpifed.main*) exit 0;; esac\nexec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    jid = cluster.sbatch("-n", "2", "-o", str(tmp_path / "%j.out"), "slurm/cpu.sbatch", *quick_args(3),
                         env={"MPIFED_RUNS": str(tmp_path / "runs"), "PYTHON": str(fake)})
    assert cluster.wait(jid) == "FAILED"
    log = out_file(tmp_path, jid)
    assert "exited with code 0; run state: unknown" in log, log
    assert "not finished (state: unknown): failing the job" in log, log


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_multi_node_run_equals_the_single_node_run(cluster, tmp_path, reference, launcher):
    cluster.need_nodes(2)
    jid = multi_node(cluster, tmp_path, 3, launcher)
    assert cluster.wait(jid) == "COMPLETED", out_file(tmp_path, jid) + cluster.log_lines(jid)
    nodes = hosts(cluster, cluster.job(jid)["NodeList"])
    assert len(nodes) == 2
    assert f"4 ranks via {launcher}" in out_file(tmp_path, jid)
    run = run_dir(tmp_path / "runs", jid)
    assert_placed(run, nodes)
    assert_same_run(run, reference(3))


PLUGIN = """from mpifed.algorithms.base import Algorithm
from mpifed.registry import ALGORITHMS


@ALGORITHMS.register("slurm_mine")
class Mine(Algorithm):
    \"\"\"FedAvg under a name of its own, from a file outside mpifed.\"\"\"
"""


def test_table_as_array_job_on_several_nodes(cluster, tmp_path):
    """One task per run, each on a node of its own (--exclusive), each equal to the same table run here in
    the debug mode; the table's own method comes from a file outside the repository, which the table
    names: the tasks need nothing more."""
    cluster.need_nodes(2)
    table = write_tiny_table(tmp_path / "t", tmp_path / "data", seeds="[0]")
    (tmp_path / "mine.py").write_text(PLUGIN)
    (tmp_path / "t" / "b.yaml").write_text("algorithm: slurm_mine\n")
    table.write_text("plugins: [../mine.py]\n" + table.read_text())
    runs_file = tmp_path / "runs.txt"
    subprocess.run([sys.executable, "-m", "mpifed.table", str(table), "--runs-root", str(tmp_path / "runs"),
                    "--write-runs", str(runs_file)], cwd=REPO, env=cluster.env, check=True, capture_output=True)
    jid = cluster.sbatch("--array=0-1", "-n", "3", "--exclusive", "-o", str(tmp_path / "%A_%a.out"),
                         "slurm/array.sbatch", str(runs_file))
    here = subprocess.run([sys.executable, "-m", "mpifed.table", str(table), "--runs-root", str(tmp_path / "here"),
                           "--run", "0"], cwd=REPO, env=cluster.env, capture_output=True, text=True)
    assert here.returncode == 0, here.stderr
    for task in ("0", "1"):
        assert cluster.wait(f"{jid}_{task}") == "COMPLETED", (tmp_path / f"{jid}_{task}.out").read_text()
    ran_on = []
    for name in ("s-a-s0", "s-b-s0"):
        run = tmp_path / "runs" / "t-x" / name
        assert json.loads((run / "summary.json").read_text())["status"] == "finished"
        ran_on.append({r["host"] for r in ranks(run)})
        assert_same_run(run, tmp_path / "here" / "t-x" / name)
    assert json.loads((tmp_path / "runs" / "t-x" / "s-b-s0" / "summary.json").read_text())["algorithm"] == "slurm_mine"
    assert len(ran_on[0]) == len(ran_on[1]) == 1 and ran_on[0] != ran_on[1], ran_on


def test_warning_signal_requeues_onto_other_nodes_and_resumes_to_the_same_result(cluster, tmp_path, reference):
    cluster.need_nodes(3)
    jid = multi_node(cluster, tmp_path, 10)
    wait_for(tmp_path, jid, "round 3/")
    first = hosts(cluster, cluster.job(jid)["NodeList"])
    cluster.run("scancel", "--batch", "--signal=USR1", jid)      # what --signal=B:USR1@T sends
    assert cluster.wait(jid, ("PENDING",), timeout=120) == "PENDING", out_file(tmp_path, jid)   # requeued by the script
    cluster.run("scontrol", "update", f"JobId={jid}", f"ExcNodeList={first[0]}")    # as if that node were drained
    cluster.start_requeued_when_eligible(jid)
    assert cluster.wait(jid) == "COMPLETED", out_file(tmp_path, jid) + "\n" + cluster.log_lines(jid)
    log = out_file(tmp_path, jid)
    assert "warning signal" in log and "requeueing" in log and "(restart 1)" in log and "resuming" in log
    assert cluster.job(jid)["Restarts"] == "1"
    second = hosts(cluster, cluster.job(jid)["NodeList"])
    assert first[0] not in second and len(second) == 2
    run = run_dir(tmp_path / "runs", jid)
    assert_placed(run, first, segment=0)
    assert_placed(run, second, segment=1)
    assert_same_run(run, reference(10))


HANGS_ON_PNODE2 = """import os
import signal
import socket

from mpifed.algorithms.base import Algorithm, Client
from mpifed.registry import ALGORITHMS


class HangingClient(Client):
    def loss(self, ctx, batch, out):
        if socket.gethostname() == "pnode2":
            os.kill(os.getpid(), signal.SIGSTOP)
        return super().loss(ctx, batch, out)


@ALGORITHMS.register("hangs_on_pnode2")
class Hangs(Algorithm):
    \"\"\"FedAvg, except that the workers on the host pnode2 stop in their first step.\"\"\"

    Client = HangingClient
"""


def test_a_rank_hung_on_another_node_is_named_with_its_node(cluster, tmp_path):
    cluster.need_nodes(2)
    plugin = tmp_path / "hangs.py"
    plugin.write_text(HANGS_ON_PNODE2)
    jid = cluster.sbatch("--nodes=2", "--ntasks-per-node=2", "--gres=none", "--cpus-per-task=1",
                         "--nodelist=pnode1,pnode2", "-o", str(tmp_path / "%j.out"), "slurm/multi-node.sbatch",
                         *quick_args(3), "algorithm.name=hangs_on_pnode2", "comm.timeout_s=5", "--plugin", str(plugin),
                         env={"MPIFED_RUNS": str(tmp_path / "runs"), **SITE})
    assert cluster.wait(jid, timeout=180) == "FAILED"
    log = out_file(tmp_path, jid)
    assert "rank 0 on pnode1: rank(s) 2 on pnode2, 3 on pnode2 did not reach 'end of local training'" in log, log
    assert f"`scontrol requeue {jid}` continues" in log


# nvidia-cuda-mps-control on every node: test_mps's stand-in, its record kept per host
MPS_CONTROL = """#!/bin/bash
export MPS_STANDIN_LOG="$MPS_RECORDS/$(hostname).txt"
exec bash "$(dirname "$0")/standin" "$@"
"""
# the interpreter the ranks start with records what each rank sees, then runs
RANK_PYTHON = f"""#!/bin/bash
case "$*" in *mpifed.main*)
    up=down; [ -e "$CUDA_MPS_PIPE_DIRECTORY/server" ] && up=up
    echo "$(hostname) ${{CUDA_MPS_PIPE_DIRECTORY:-none}} $up" >> "$MPS_RECORDS/ranks.txt";;
esac
exec {sys.executable} "$@"
"""


def test_each_node_gets_its_own_mps_daemon(cluster, tmp_path):
    """Three ranks a node on one (stand-in) GPU: both nodes' ranks share it, so each node starts a daemon
    in its own /tmp, its ranks use that one, and the job's end quits both."""
    cluster.need_nodes(2)
    bin_dir, records = tmp_path / "bin", tmp_path / "records"
    bin_dir.mkdir()
    records.mkdir()
    for name, text in (("standin", STANDIN), ("nvidia-cuda-mps-control", MPS_CONTROL), ("python", RANK_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    jid = multi_node(cluster, tmp_path, 2, per_node=3, env={
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "0",
        "MPS_RECORDS": str(records), "PYTHON": str(bin_dir / "python")})
    assert cluster.wait(jid) == "COMPLETED", out_file(tmp_path, jid)
    nodes = hosts(cluster, cluster.job(jid)["NodeList"])
    folder = f"/tmp/mpifed-mps-{jid}"
    assert "[slurm] MPS: a control daemon on 2 of 2 nodes" in out_file(tmp_path, jid)
    for node in nodes:
        calls = (records / f"{node}.txt").read_text().splitlines()
        assert calls[0] == "get_server_list pipe=/tmp/nvidia-mps"                 # no daemon of the site's
        assert f"-d pipe={folder}/pipe log={folder}/log" in calls and calls[-1] == f"quit pipe={folder}/pipe"
        assert not (cluster.node_tmp(node) / f"mpifed-mps-{jid}").exists()
        assert not (cluster.node_tmp(node) / f"mpifed-mps-{jid}.nodes").exists()
    seen = sorted((records / "ranks.txt").read_text().splitlines())
    assert seen == sorted(f"{node} {folder}/pipe up" for node in nodes for _ in range(3))


def test_mps_on_that_no_node_can_honour_fails_the_job_before_the_ranks_start(cluster, tmp_path):
    cluster.need_nodes(2)
    jid = cluster.sbatch("--nodes=2", "--ntasks-per-node=2", "--gres=none", "--cpus-per-task=1", "-o",
                         str(tmp_path / "%j.out"), "slurm/multi-node.sbatch", *quick_args(2), "resources.mps=on",
                         env={"MPIFED_RUNS": str(tmp_path / "runs"), "CUDA_VISIBLE_DEVICES": ""})
    assert cluster.wait(jid) == "FAILED"
    log = out_file(tmp_path, jid)
    nodes = hosts(cluster, cluster.job(jid)["NodeList"])
    assert f"[slurm] MPS: failed on {' '.join(nodes)} (an error above" in log and "2 of 2 nodes answered" in log, log
    assert all(f"[mpifed.mps] {node}: resources.mps=on, but no rank uses a GPU" in log for node in nodes), log
    assert "ranks via" not in log and not (tmp_path / "runs").exists()


def test_a_node_that_fails_mid_run_fails_the_job_and_a_requeue_continues_exactly(cluster, tmp_path, reference):
    """The second node dies (every process on it killed at once). srun ends the step, the job fails
    (Slurm marks the node down after SlurmdTimeout), and `scontrol requeue`, as the job's log says,
    resumes the run from its last checkpoint on the nodes still up."""
    cluster.need_nodes(3)
    jid = multi_node(cluster, tmp_path, 10)
    wait_for(tmp_path, jid, "round 5/")
    first = hosts(cluster, cluster.job(jid)["NodeList"])
    victim = first[1]
    try:
        cluster.crash(victim)
        assert cluster.wait(jid, ("FAILED",), timeout=180) == "FAILED", out_file(tmp_path, jid)
        assert f"`scontrol requeue {jid}` continues" in out_file(tmp_path, jid)
        cluster.run("scontrol", "requeue", jid)
        cluster.start_requeued_when_eligible(jid)
        assert cluster.wait(jid) == "COMPLETED", out_file(tmp_path, jid) + "\n" + cluster.log_lines(jid)
        second = hosts(cluster, cluster.job(jid)["NodeList"])
        assert victim not in second
        log = out_file(tmp_path, jid)
        assert "(restart 1)" in log and "resuming" in log
        assert_same_run(run_dir(tmp_path / "runs", jid), reference(10))
    finally:
        cluster.start_slurmd(victim)
        cluster.wait_nodes_up(timeout=120)
