"""The start-up check of the client blocks, against a run's whole start-up.

    python benchmarks/shard_check.py [--dataset fashion_mnist] [--clients 100] [--workers 1 2] [--repeats 3]

Prepares the data set (Fashion-MNIST from /usr/share/datasets/fashion-mnist by default: 60,000
training images), runs one round in the debug mode and reads its start-up (launch to the start
of round 1, which includes the check), then times the check alone as worker 0 of W does it
(1/W of the blocks: each opens and holds the clients the manifest lists; a client's checksum is
verified when it is read). Prints the seconds and the share of the start-up.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from common import run_mpifed  # noqa: E402

from mpifed.settings import config  # noqa: E402
from mpifed.data.prepared import verify_blocks  # noqa: E402
from mpifed.preparation.build import ensure_prepared  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="fashion_mnist")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sets = [f"data.dataset.name={a.dataset}", f"data.num_clients={a.clients}", "data.partition=iid",
                "model.name=digits_cnn", "train.rounds=1", "train.participation=0.05", "run.save_model=false",
                f"data.prepared_root={tmp}/data"]
        cfg, _ = config.load([], sets)
        manifest = ensure_prepared(cfg, log=lambda _: None)
        size = sum(p.stat().st_size for p in (manifest.root / "clients").iterdir())
        startups = [run_mpifed(0, ["--set", *sets], Path(tmp), f"s{i}").startup_s for i in range(a.repeats)]
        startup = statistics.median(startups)
        print(f"{a.dataset}: {manifest.num_clients} clients in {len(manifest.blocks)} block(s), "
              f"{size / 2**20:.1f} MiB; debug-mode start-up "
              f"(launch to round 1, check included) median {startup:.2f} s of {a.repeats}")
        for workers in a.workers:
            times = []
            for _ in range(a.repeats):
                start = time.perf_counter()
                verify_blocks(manifest, 0, workers)
                times.append(time.perf_counter() - start)
            t = statistics.median(times)
            print(f"  check by worker 0 of {workers}: {t:.3f} s = {100 * t / startup:.1f}% of the start-up")


if __name__ == "__main__":
    main()
