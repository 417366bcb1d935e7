"""What a population costs as it grows: preparing it, its files and bytes on disk, start-up, a round, memory.

    python benchmarks/scale.py [--clients 1000 10000 100000 1000000] [--methods fedavg scaffold]
                               [--rounds 3] [--ranks 3] [--cohort 10] [--state-mb 0]

Synthetic clients of 20 images of 8x8 each (64 bytes; the raw data is the images and their int64
labels), the same cohort of ``--cohort`` clients a round whatever K, digits_cnn. Per K: the prepare
step (python -m mpifed.prepare, in a process of its own: its wall time and peak memory), the files
and bytes of the prepared folder against the raw bytes; then per method a run of ``--rounds`` rounds
on ``--ranks`` ranks: launch to round 1, the median round after the first, the server's and the
largest worker's peak memory, and the files and bytes on disk of the run's client-state store
(``--state-mb`` is resources.client_state_mb: 0 sends every state of a stateful method through the
store). Last, each figure at the largest K over the smallest.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, run_mpifed  # noqa: E402

SAMPLES = 20          # per client
TEST = 500
RAW_BYTES = 8 * 8 + 8  # an image and its label
PEAK = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024); sys.exit(code)")


def data_sets(k: int, root: Path) -> list[str]:
    return ["data.dataset.name=synthetic", f"data.dataset.train_samples={SAMPLES * k}",
            f"data.dataset.test_samples={TEST}", f"data.num_clients={k}", "data.partition=iid",
            f"data.prepared_root={root}"]


def prepare(k: int, root: Path) -> tuple[float, int, Path]:
    """Seconds, peak RSS (MiB) and folder of a fresh prepare of K clients."""
    start = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PEAK, sys.executable, "-m", "mpifed.prepare", "--set",
                        *data_sets(k, root)], cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if p.returncode != 0:
        raise RuntimeError(f"prepare of {k} clients failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    lines = p.stdout.strip().splitlines()
    folder = Path(next(line for line in lines if line.startswith("prepared data: ")).removeprefix("prepared data: "))
    return seconds, int(lines[-1]), folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, nargs="+", default=[1000, 10_000, 100_000, 1_000_000])
    p.add_argument("--methods", nargs="+", default=["fedavg", "scaffold"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--cohort", type=int, default=10)
    p.add_argument("--state-mb", type=int, default=0)
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in a.clients:
            prep_s, prep_mb, folder = prepare(k, Path(tmp) / "data")
            files = [f for f in folder.rglob("*") if f.is_file()]
            on_disk = sum(f.stat().st_size for f in files)
            raw = (SAMPLES * k + TEST) * RAW_BYTES
            for method in a.methods:
                args = ["--set", *data_sets(k, Path(tmp) / "data"), f"algorithm.name={method}",
                        f"train.participation={a.cohort / k}", f"train.rounds={a.rounds}", "train.local_epochs=1",
                        "train.batch_size=20", "model=digits_cnn", "run.checkpoint_every=0", "run.save_model=false",
                        f"resources.client_state_mb={a.state_mb}"]
                f = run_mpifed(a.ranks, args, Path(tmp) / "runs", f"k{k}-{method}")
                rss = f.summary["peak_rss_mb_per_rank"]
                state = [s for s in (Path(tmp) / "runs" / f"k{k}-{method}" / "client_state").glob("*") if s.is_file()]
                rows.append({"K": k, "method": method, "prepare_s": prep_s, "prepare_mb": prep_mb,
                             "files": len(files), "disk_mb": on_disk / 2**20, "disk_raw": on_disk / raw,
                             "startup_s": f.startup_s,
                             "round_s": statistics.median(r["time"]["round"] for r in f.rows[1:]),
                             "server_mb": rss[0], "worker_mb": max(rss[1:] or rss), "state_files": len(state),
                             "state_mb": sum(s.stat().st_blocks * 512 for s in state) / 2**20})
            shutil.rmtree(folder)
            print(f"done K = {k}", file=sys.stderr, flush=True)
    cols = [("K", "{:>9,}"), ("method", "{:>9}"), ("prepare_s", "{:>10.1f}"), ("prepare_mb", "{:>11.0f}"),
            ("files", "{:>6}"), ("disk_mb", "{:>9.1f}"), ("disk_raw", "{:>9.3f}"), ("startup_s", "{:>10.2f}"),
            ("round_s", "{:>8.3f}"), ("server_mb", "{:>10.0f}"), ("worker_mb", "{:>10.0f}"),
            ("state_files", "{:>11}"), ("state_mb", "{:>9.2f}")]
    print(" ".join(f"{name:>{len(fmt.format(rows[0][name]))}}" for name, fmt in cols))
    for r in rows:
        print(" ".join(fmt.format(r[name]) for name, fmt in cols))
    for method in a.methods:
        mine = [r for r in rows if r["method"] == method]
        small, large = mine[0], mine[-1]
        print(f"{method}, K = {large['K']:,} over K = {small['K']:,}: "
              + ", ".join(f"{name} {large[name] / small[name]:.2f}x"
                          for name in ("startup_s", "round_s", "server_mb", "worker_mb")))


if __name__ == "__main__":
    main()
