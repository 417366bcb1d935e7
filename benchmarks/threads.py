"""Torch threads and the OpenMP wait policy, on an idle machine and with other processes on the cores.

    python benchmarks/threads.py [--rounds 6] [--hogs N] [--config configs/quickstart.yaml]

Runs the debug mode (one process) of the quick start four ways: ``resources.threads=1``;
the default thread count (the cores this process may use) with mpifed's default
``OMP_WAIT_POLICY=PASSIVE`` (waiting OpenMP threads sleep); the default count with
libgomp's own default (a value libgomp ignores, so that mpifed's default does not apply:
waiting threads spin about 300,000 times, then sleep; the behaviour before PASSIVE became
mpifed's default); and with ``OMP_WAIT_POLICY=ACTIVE`` (waiting threads only spin).
Each runs once on the machine as it is ("idle") and once beside ``--hogs`` busy-looping
processes (default: one per core, "busy"). Prints the median seconds per round (after
the first) and the ratio to ``threads=1`` under the same load.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, run_mpifed  # noqa: E402

VARIANTS = (("threads=1", ["resources.threads=1"], None),
            ("default, PASSIVE", [], "PASSIVE"),
            ("default, libgomp's", [], "libgomp-default"),
            ("default, ACTIVE", [], "ACTIVE"))


def _spin() -> None:
    while True:
        pass


def measure(config: str, rounds: int, extra: list[str], policy: str | None, root: Path, name: str) -> float:
    if policy is None:
        os.environ.pop("OMP_WAIT_POLICY", None)  # mpifed sets PASSIVE
    else:
        os.environ["OMP_WAIT_POLICY"] = policy
    args = ["--config", config, "--set", f"train.rounds={rounds}", "run.save_model=false", *extra]
    rows = run_mpifed(0, args, root, name).rows
    return statistics.median(r["time"]["round"] for r in rows[1:] or rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--hogs", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"))
    a = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; default threads = {cores}; {a.rounds} rounds of {Path(a.config).name}, median after round 1")
    print(f"{'load':>6} {'variant':>18} {'s/round':>9} {'x threads=1':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for load in ("idle", "busy"):
            hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(a.hogs if load == "busy" else 0)]
            for h in hogs:
                h.start()
            try:
                base = None
                for label, extra, policy in VARIANTS:
                    t = measure(a.config, a.rounds, extra, policy, Path(tmp), f"{load}-{len(extra)}-{policy}")
                    base = base or t
                    print(f"{load:>6} {label:>18} {t:>9.3f} {t / base:>12.2f}", flush=True)
            finally:
                for h in hogs:
                    h.terminate()
                    h.join()


if __name__ == "__main__":
    main()
