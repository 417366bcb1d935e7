"""``python -m mpifed.prepare --config X [--set k=v ...] [--force] [--show] [--plot]``: write a config's
client shards, test set and manifest (runs also do this on their own when the data is absent).
``--show`` prints the per-client class counts and partition statistics of the prepared data;
``--plot`` draws them as a clients x classes heatmap, ``partition.png`` in the prepared folder
(needs ``pip install 'mpifed[plots]'``)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from mpifed import config
from mpifed.data.prepared import Manifest, ensure_prepared, prepare, prepared_dir


def class_table(m: Manifest) -> str:
    """Per-client sample and class counts as a text table (classes as columns, up to 20 shown)."""
    counts = m.client_class_counts
    shown = min(counts.shape[1], 20)
    head = f"{'client':>7} {'samples':>8} {'classes':>7} | " + " ".join(f"{c:>5}" for c in range(shown))
    if counts.shape[1] > shown:
        head += f"  (+{counts.shape[1] - shown} more classes)"
    lines = [head, "-" * len(head)]
    for k, row in enumerate(counts):
        lines.append(f"{k:>7} {int(row.sum()):>8} {int((row > 0).sum()):>7} | " + " ".join(f"{int(v):>5}" for v in row[:shown]))
    total = counts.sum(axis=0)
    lines.append(f"{'all':>7} {int(total.sum()):>8} {int((total > 0).sum()):>7} | " + " ".join(f"{int(v):>5}" for v in total[:shown]))
    stats = ", ".join(f"{k} {v}" for k, v in m.stats.items())
    lines.append(f"test set {m.test_size} samples; server-held {m.server_size}; {stats}")
    return "\n".join(lines)


def plot_partition(m: Manifest) -> Path:
    """The per-client class counts as a heatmap, written to ``partition.png`` beside the shards."""
    from mpifed import plots
    counts = m.client_class_counts.astype(float)
    counts[counts == 0] = np.nan
    spec = m.spec["partition"]
    how = ", ".join(f"{k} {v}" for k, v in spec.items() if k not in ("name", "fingerprint"))
    title = f"{m.spec['dataset']['name']}, {spec['name']}{f' ({how})' if how else ''}: samples per client and class"
    return plots.heatmap(m.root / "partition.png", title, counts, [str(k) for k in range(m.num_clients)],
                         "class", "client", "samples (blank: none)", fmt="{:.0f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpifed.prepare", description=__doc__)
    p.add_argument("--config", action="append", default=[], metavar="YAML")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE")
    p.add_argument("--force", action="store_true", help="rebuild the prepared folder even if it exists")
    p.add_argument("--show", action="store_true", help="print the per-client class counts")
    p.add_argument("--plot", action="store_true", help="draw the per-client class counts to partition.png in the "
                   "prepared folder (needs pip install 'mpifed[plots]')")
    args = p.parse_args(argv)
    if args.plot:
        from mpifed import plots
        try:
            plots.require()
        except plots.PlotsUnavailable as exc:
            print(f"[mpifed.prepare] --plot: {exc}", file=sys.stderr)
            return 2
    try:
        cfg, _ = config.load(args.config, [o for group in args.set for o in group])
        manifest = prepare(cfg) if args.force else ensure_prepared(cfg)
    except Exception as exc:  # every error here is a user's: say it plainly
        print(f"[mpifed.prepare] {exc}", file=sys.stderr)
        return 2
    print(f"prepared data: {prepared_dir(cfg)}")
    if args.show:
        np.set_printoptions(linewidth=200)
        print(class_table(manifest))
    if args.plot:
        print(f"partition plot: {plot_partition(manifest)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
