"""Per-round time breakdown of one configuration at one or more rank counts.

    python benchmarks/round_breakdown.py --ranks 3 11 0 -- --config configs/quickstart.yaml --set train.rounds=10

``--ranks 0`` is the single-process debug mode. Prints, per mode, the median over rounds
(after the first) of: downlink (pack + Bcast), local_training (until the slowest worker
is done), uplink (Reduce + gather), aggregate, evaluation, worker_idle_mean (time workers
wait for the slowest during local training) and the whole round; plus start-up time to
round 1 and peak RSS summed over ranks.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import breakdown_table, run_mpifed  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[3], help="rank counts to run (0: debug mode)")
    p.add_argument("mpifed_args", nargs=argparse.REMAINDER, help="after --: arguments for mpifed.entry.main")
    a = p.parse_args()
    args = a.mpifed_args[1:] if a.mpifed_args[:1] == ["--"] else a.mpifed_args
    with tempfile.TemporaryDirectory() as tmp:
        figs = [run_mpifed(n, args, Path(tmp), f"bench-{n}") for n in a.ranks]
    print(breakdown_table(figs))
    for f in figs:
        t = f.median("round")
        comm = f.median("downlink") + f.median("uplink")
        print(f"{'debug' if f.ranks == 0 else f'-n {f.ranks}'}: round {t:.3f} s, downlink+uplink {100 * comm / t:.2f}% "
              f"of it, final accuracy {f.summary['final_test_acc']:.4f}")


if __name__ == "__main__":
    main()
