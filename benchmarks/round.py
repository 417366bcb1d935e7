"""W1 round times against the floor, measured in one run (the machine is noisy: compare ratios).

    python benchmarks/round.py [--rounds 10] [--repeats 3] [--modes 3 11 0] [--methods fedntd fedgkd fedcsd fedcad]

Each repeat runs the 2-process floor (benchmarks/floor.py) and then W1 (configs/bench/w1.yaml)
under ``mpirun -n 3``, ``-n 11`` and the debug mode (0), back to back, so that every ratio is
taken between runs minutes apart (this machine's speed drifts over longer spans). Prints the
per-round medians (after the first round), the breakdown, start-up time to round 1, peak
memory summed over ranks, and the median over repeats of the ratios: mpifed / floor,
-n 11 / -n 3, downlink + uplink share of a round. With ``--methods``, also each method's
per-round median under ``-n 3`` relative to FedAvg's (measured right before it).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, breakdown_table, run_mpifed  # noqa: E402
from floor import floor  # noqa: E402

W1 = str(REPO / "configs" / "bench" / "w1.yaml")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--modes", type=int, nargs="+", default=[3, 11, 0], help="rank counts (0: debug mode)")
    p.add_argument("--methods", nargs="*", default=[], help="methods to time against FedAvg under -n 3")
    p.add_argument("--set", nargs="+", default=[], help="extra overrides for every run (e.g. data.dataset.root=...)")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    rounds = ["--set", f"train.rounds={a.rounds}", *a.set]
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            fl = floor(W1, a.set, a.rounds, 2)
            floor_median = statistics.median(fl[1:] or fl)
            print(f"\nrepeat {rep + 1}: floor (2 processes) {floor_median:.3f} s per round", flush=True)
            figs = {n: run_mpifed(n, ["--config", W1, *rounds], Path(tmp), f"w1-{n}") for n in a.modes}
            print(breakdown_table(list(figs.values())))
            for n, f in figs.items():
                rows = f.rows[1:] or f.rows
                t = statistics.median(r["time"]["round"] for r in rows)
                comm = statistics.median(r["time"]["downlink"] + r["time"]["uplink"] for r in rows)
                mode = "debug" if n == 0 else f"-n {n}"
                ratios.setdefault(f"{mode} / floor", []).append(t / floor_median)
                ratios.setdefault(f"{mode}: downlink + uplink share (%)", []).append(100 * comm / t)
                print(f"{mode}: {t:.3f} s per round = {t / floor_median:.3f} x floor; downlink + uplink "
                      f"{100 * comm / t:.2f}%; start-up {f.startup_s:.1f} s; peak RSS {f.peak_rss_total_mb:.0f} MB "
                      f"over {len(f.summary['peak_rss_mb_per_rank'])} ranks",
                      flush=True)
            if 3 in figs and 11 in figs:
                ratios.setdefault("-n 11 / -n 3", []).append(figs[11].median("round") / figs[3].median("round"))
        print(f"\nmedians over {a.repeats} repeat(s):")
        for k, v in ratios.items():
            print(f"  {k}: {statistics.median(v):.3f}  (each repeat: {', '.join(f'{x:.3f}' for x in v)})")
        for m in a.methods:
            base = run_mpifed(3, ["--config", W1, *rounds], Path(tmp), "w1-fedavg")
            extra = ["data.server_holdout_per_class=32"] if m in ("fedcad", "fedgkd_vote") else []
            f = run_mpifed(3, ["--config", W1, *rounds, "--set", f"algorithm.name={m}", *extra], Path(tmp), f"w1-{m}")
            print(f"  {m:12s} {f.median('round'):.3f} s per round = {f.median('round') / base.median('round'):.3f} x "
                  f"FedAvg ({base.median('round'):.3f} s just before)", flush=True)


if __name__ == "__main__":
    main()
