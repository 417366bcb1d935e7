"""What crossing nodes costs: the same ranks on one Slurm node and on two, phase by phase.

    python benchmarks/cross_node.py [--ranks 4] [--launcher srun]

As root, starts the test suite's Slurm cluster (tests/slurm_cluster.py: a slurmd per network
namespace, ranks on different nodes talking TCP over veth links) and submits
``slurm/multi-node.sbatch`` once per configuration and shape, one job at a time: ``--nodes=1``
with all ranks on it, then ``--nodes=2`` with half on each (the server and R/2 - 1 workers on the
first node). Prints, per job, the per-round medians of every phase (metrics.jsonl's ``time``,
first round skipped) and the two-node figure over the one-node one. The configurations: the quick
start (digits CNN, 0.1 MB of weights) and W1 (the FedAvg CNN on Fashion-MNIST, 6.6 MB).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from common import PHASES, REPO, RunFigures, breakdown_table  # noqa: E402
from slurm_cluster import Cluster, installed  # noqa: E402

CONFIGS = {
    "quickstart": ["configs/quickstart.yaml", "--set", "train.rounds=10"],
    "w1": ["mpifed/configs/bench/w1.yaml", "--set", "train.rounds=6"],
}


def job(cluster: Cluster, out: Path, config: list[str], nodes: int, ranks: int, launcher: str) -> RunFigures:
    runs = out / "runs"
    start = time.time()
    jid = cluster.sbatch(f"--nodes={nodes}", f"--ntasks-per-node={ranks // nodes}", "--gres=none", "--cpus-per-task=1",
                         "-o", str(out / "%j.out"), "slurm/multi-node.sbatch", *config, "resources.threads=1",
                         "run.checkpoint_every=0", env={"MPIFED_RUNS": str(runs), "LAUNCHER": launcher,
                                                        "OMPI_MCA_btl_tcp_if_include": "eth0",
                                                        "PRTE_MCA_oob_tcp_if_include": "eth0"})
    state = cluster.wait(jid, timeout=3600)
    if state != "COMPLETED":
        raise RuntimeError(f"job {jid} ended {state}: {(out / f'{jid}.out').read_text()[-3000:]}")
    run = runs / f"{Path(config[0]).stem}-{jid}"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    return RunFigures(ranks, rows, summary, time.time() - start, summary["first_round_started_at"] - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4, help="ranks per job (even: half on each of two nodes)")
    p.add_argument("--launcher", choices=["srun", "mpirun"], default="srun")
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=sorted(CONFIGS))
    a = p.parse_args()
    if os.geteuid() != 0 or not installed():
        sys.exit("needs root and Slurm (slurm-wlm, munge, libpmix-dev; the Slurm tests install them)")
    with tempfile.TemporaryDirectory(prefix="mpifed-cross-node-", dir="/tmp") as tmp:
        cluster = Cluster(Path(tmp) / "cluster", REPO, nodes=2)
        try:
            cluster.start()
            if len(cluster.nodes) < 2:
                sys.exit(f"only one node: {cluster.single_reason}")
            for name in a.configs:
                figs = [job(cluster, Path(tmp), CONFIGS[name], nodes, a.ranks, a.launcher) for nodes in (1, 2)]
                labels = [f"{name}, {n} node{'s' if n > 1 else ''}" for n in (1, 2)]
                print(breakdown_table(figs, labels=labels))
                one, two = (RunFigures(f.ranks, f.rows[1:], f.summary, f.wall_s, f.startup_s) for f in figs)
                ratios = " ".join(f"{p}={two.median(p) / one.median(p):.2f}x" for p in PHASES if one.median(p) > 0)
                print(f"{name}: two nodes over one: {ratios}\n", flush=True)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
