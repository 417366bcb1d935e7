"""Every method on one heavily skewed Fashion-MNIST split: final and best test accuracy, with seeds.

    python benchmarks/methods.py --seeds 0 1 [--parallel 7] [--ranks 0] [--runs-root DIR] [-- --set train.rounds=10]

Every registered method (or ``--methods``) runs with its own defaults (nothing is tuned against this table) on
``configs/bench/methods.yaml``; ``--parallel`` runs that many at once (a GPU or a many-core
machine); ``--ranks`` is the rank count of each run (0: debug mode). ``--runs-root`` keeps every
run in DIR/<method>-s<seed> and reuses the finished ones (mpifed refuses one made with other
settings), so the table can be built over several sittings; without it the runs go to a
temporary folder. Prints final and best accuracy per method (mean +- sample std over seeds) and,
beside FedAvg, each method's final accuracy minus FedAvg's in the same seed.
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


def mean_std(values: list[float]) -> str:
    """Percent mean +- sample std (n - 1), or the single value."""
    pct = [100 * v for v in values]
    if len(pct) < 2:
        return f"{pct[0]:.2f}"
    return f"{statistics.fmean(pct):.2f} ± {statistics.stdev(pct):.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--methods", nargs="+", default=ALGORITHMS.names(), help="default: every registered method")
    p.add_argument("--ranks", type=int, default=0)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--runs-root", type=Path, help="keep the runs here and reuse finished ones (default: discard them)")
    p.add_argument("mpifed_args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    extra = a.mpifed_args[1:] if a.mpifed_args[:1] == ["--"] else a.mpifed_args
    base = ["--config", str(REPO / "configs" / "bench" / "methods.yaml")]
    with tempfile.TemporaryDirectory() as tmp:
        root = a.runs_root.resolve() if a.runs_root else Path(tmp)
        jobs = [(m, s) for s in a.seeds for m in a.methods]

        def one(job):
            m, s = job
            figs = run_mpifed(a.ranks, base + extra + ["--set", f"algorithm.name={m}", f"run.seed={s}", "data.partition_seed=0"],
                              root, f"{m}-s{s}", resume=a.runs_root is not None)
            print(f"  {m:12s} seed {s}: final {figs.summary['final_test_acc']:.4f} best {figs.summary['best_test_acc']:.4f} "
                  f"({figs.summary['wall_time_s']:.0f} s)", flush=True)
            return m, s, figs.summary

        with ThreadPoolExecutor(a.parallel) as pool:
            results = list(pool.map(one, jobs))
    final = {(m, s): r["final_test_acc"] for m, s, r in results}
    best = {(m, s): r["best_test_acc"] for m, s, r in results}

    print(f"\nFashion-MNIST, 10 clients, Dirichlet(0.1), seeds {a.seeds}; extra arguments: {' '.join(extra) or '-'}")
    seeds = " / ".join(str(s) for s in a.seeds)
    print(f"| method | final acc (%) | best acc (%) | final − FedAvg per seed {seeds} (pp) |\n| --- | --- | --- | --- |")
    for m in a.methods:
        if m != "fedavg" and "fedavg" in a.methods:
            diff = " / ".join(f"{100 * (final[m, s] - final['fedavg', s]):+.2f}" for s in a.seeds)
        else:
            diff = "-"
        print(f"| {m} | {mean_std([final[m, s] for s in a.seeds])} | {mean_std([best[m, s] for s in a.seeds])} | {diff} |")


if __name__ == "__main__":
    main()
