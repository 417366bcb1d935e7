"""Every method on one heavily skewed Fashion-MNIST split: final and best test accuracy, with seeds.

    python benchmarks/methods.py --seeds 0 1 [--parallel 7] [--ranks 0] [-- --set train.rounds=10]

Every registered method (or ``--methods``) runs with its own defaults (nothing is tuned against this table) on
``configs/bench/methods.yaml``; ``--parallel`` runs that many at once (a GPU or a many-core
machine); ``--ranks`` is the rank count of each run (0: debug mode). Prints final and best
accuracy per method (mean +- std over seeds) and whether each beats FedAvg.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, run_mpifed  # noqa: E402

from mpifed.registry import ALGORITHMS  # noqa: E402



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--methods", nargs="+", default=ALGORITHMS.names(), help="default: every registered method")
    p.add_argument("--ranks", type=int, default=0)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("mpifed_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    extra = a.mpifed_args[1:] if a.mpifed_args[:1] == ["--"] else a.mpifed_args
    base = ["--config", str(REPO / "configs" / "bench" / "methods.yaml")]
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [(m, s) for s in a.seeds for m in a.methods]

        def one(job):
            m, s = job
            figs = run_mpifed(a.ranks, base + extra + ["--set", f"algorithm.name={m}", f"run.seed={s}", "data.partition_seed=0"],
                              Path(tmp), f"{m}-s{s}")
            print(f"  {m:12s} seed {s}: final {figs.summary['final_test_acc']:.4f} best {figs.summary['best_test_acc']:.4f} "
                  f"({figs.summary['wall_time_s']:.0f} s)", flush=True)
            return m, s, figs.summary

        with ThreadPoolExecutor(a.parallel) as pool:
            results = list(pool.map(one, jobs))
    final = {m: [r["final_test_acc"] for mm, _, r in results if mm == m] for m in a.methods}
    best = {m: [r["best_test_acc"] for mm, _, r in results if mm == m] for m in a.methods}

    def fmt(v):
        return f"{100 * statistics.fmean(v):6.2f} +- {100 * statistics.pstdev(v):4.2f}"

    print(f"\nFashion-MNIST, 10 clients, Dirichlet(0.1), seeds {a.seeds}; extra arguments: {' '.join(extra) or '-'}")
    print("| method | final acc (%) | best acc (%) | final > FedAvg in every seed |\n| --- | --- | --- | --- |")
    for m in a.methods:
        beats = all(f > g for f, g in zip(final[m], final["fedavg"])) if m != "fedavg" and "fedavg" in final else "-"
        print(f"| {m} | {fmt(final[m])} | {fmt(best[m])} | {beats} |")


if __name__ == "__main__":
    main()
