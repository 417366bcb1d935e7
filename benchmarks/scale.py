"""The server does not grow with the number of clients: its memory and per-round overhead at K = 10, 100, 1,000.

    python benchmarks/scale.py [--clients 10 100 1000] [--rounds 6] [--ranks 3]

Tiny synthetic clients (20 images of 8x8 each), the same 10 clients sampled per round
whatever K (participation 10/K), a few workers. Prints the server's peak memory, its
per-round overhead (the round minus the time spent waiting for local training and
evaluation: planning, packing, the reductions, aggregation, logging) and the ratio of
memory at the largest K to the smallest.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import run_mpifed  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--ranks", type=int, default=3)
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in a.clients:
            args = ["--set", "data.dataset.name=synthetic", f"data.dataset.train_samples={20 * k}",
                    "data.dataset.test_samples=500",
                    f"data.num_clients={k}", "data.partition=iid", f"train.participation={10 / k}",
                    f"train.rounds={a.rounds}",
                    "train.local_epochs=1", "train.batch_size=20", "model=digits_cnn", f"data.prepared_root={tmp}/data",
                    "run.checkpoint_every=2"]
            f = run_mpifed(a.ranks, args, Path(tmp), f"k{k}")
            overhead = [r["time"]["round"] - r["time"]["local_training"] - r["time"].get("evaluation", 0.0)
                        for r in f.rows[1:]]
            rows.append((k, f.summary["peak_rss_mb_per_rank"][0], statistics.median(overhead),
                         f.summary["cpu_s_per_rank"][0]))
    print(f"{'clients':>8} {'server peak RSS (MB)':>21} {'server overhead per round (s)':>30} {'server CPU (s)':>15}")
    for k, rss, over, cpu in rows:
        print(f"{k:>8} {rss:>21.1f} {over:>30.4f} {cpu:>15.2f}")
    print(f"server memory at K = {rows[-1][0]} / K = {rows[0][0]}: {rows[-1][1] / rows[0][1]:.3f}")


if __name__ == "__main__":
    main()
