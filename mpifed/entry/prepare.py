"""``python -m mpifed.prepare --config X [--set k=v ...] [--force] [--show] [--plot] [--download]`` (also
``mpifed-prepare``): write a config's client shards, test set and manifest (runs also do this on
their own when the data is absent). ``--show`` prints the per-client class counts and partition
statistics of the prepared data; ``--plot`` draws them as a clients x classes heatmap,
``partition.png`` in the prepared folder (needs ``pip install 'mpifed[plots]'``). ``--download``
first fetches the data set's raw files into ``data.dataset.root`` when they are missing (MNIST,
Fashion-MNIST, CIFAR-10/100, CINIC-10, Tiny-ImageNet), checked against the published checksums;
docs/data-download.md has the details and the manual steps for LEAF FEMNIST and Office-Caltech-10."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from mpifed import __version__
from mpifed.settings import config
from mpifed.data.download import MIRROR_ENV, DownloadError, fetch
from mpifed.data.prepared import Manifest
from mpifed.preparation.build import ensure_prepared, prepare
from mpifed.preparation.spec import prepared_dir
from mpifed.data.raw import class_names
from mpifed.plugin.registry import DATASETS


def _dataset_root(cfg: config.Config) -> str:
    root = getattr(cfg.data.dataset.options, "root", None)
    if root is None:
        raise DownloadError(f"data set {cfg.data.dataset.name} is not read from files: there is nothing to download")
    return root


def class_table(m: Manifest) -> str:
    """Per-client sample and class counts as a text table (classes as columns, up to 20 shown)."""
    counts = m.client_class_counts
    shown = min(counts.shape[1], 20)
    head = f"{'client':>7} {'samples':>8} {'classes':>7} | " + " ".join(f"{c:>5}" for c in range(shown))
    if counts.shape[1] > shown:
        head += f"  (+{counts.shape[1] - shown} more classes)"
    lines = [head, "-" * len(head)]
    for k, row in enumerate(counts):
        lines.append(f"{k:>7} {int(row.sum()):>8} "
                     f"{int((row > 0).sum()):>7} | " + " ".join(f"{int(v):>5}" for v in row[:shown]))
    total = counts.sum(axis=0)
    lines.append(f"{'all':>7} {int(total.sum()):>8} "
                 f"{int((total > 0).sum()):>7} | " + " ".join(f"{int(v):>5}" for v in total[:shown]))
    stats = ", ".join(f"{k} {v}" for k, v in m.stats.items())
    val = f"validation set {m.val_size}; " if m.val_size else ""
    lines.append(f"test set {m.test_size} samples; {val}server-held {m.server_size}; {stats}")
    return "\n".join(lines)


def plot_partition(m: Manifest) -> Path:
    """The per-client class counts as a heatmap, written to ``partition.png`` beside the shards."""
    from mpifed.tables import plots
    counts = m.client_class_counts.astype(float)
    counts[counts == 0] = np.nan
    spec = m.spec["partition"]
    shown = ", ".join(f"{k} {v}" for k, v in spec.items() if k not in ("name", "fingerprint", *_TUNING))
    shown = f" ({shown})" if shown else ""
    title = f"{m.spec['dataset']['name']}: {m.num_clients} clients, {spec['name']} partition{shown}"
    return plots.heatmap(m.root / "partition.png", title, "training samples per client and class (blank: none)", counts,
                         [str(k) for k in range(m.num_clients)],
                         class_names(DATASETS.get(m.spec["dataset"]["name"]), m.num_classes),
                         "class", "client", "samples", fmt="{:.0f}")


# how a partition is searched for, not what it is: left out of the plot's title
_TUNING = ("min_size", "balance", "max_tries", "min_fraction")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpifed.prepare", description=__doc__)
    p.add_argument("--config", action="append", default=[], metavar="YAML",
                   help="config file (repeatable; later files override earlier ones); default: the quick start")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override config keys, e.g. --set data.dataset.name=cifar10 data.num_clients=100")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                   help="load a Python file or module first (a data set or partition of your own); repeatable")
    p.add_argument("--force", action="store_true", help="rebuild the prepared folder even if it exists")
    p.add_argument("--show", action="store_true", help="print the per-client class counts")
    p.add_argument("--plot", action="store_true", help="draw the per-client class counts to partition.png in the "
                   "prepared folder (needs pip install 'mpifed[plots]')")
    p.add_argument("--download", action="store_true",
                   help="first fetch the data set's raw files into data.dataset.root if they are missing, "
                        "checking the published checksums")
    p.add_argument("--mirror", metavar="URL", default=None,
                   help=f"with --download: fetch each file from URL/<file name> instead of its published address "
                        f"(default: ${MIRROR_ENV})")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    args = p.parse_args(argv)
    if args.plot:
        from mpifed.tables import plots
        try:
            plots.require()
        except plots.PlotsUnavailable as exc:
            print(f"[mpifed.prepare] --plot: {exc}", file=sys.stderr)
            return 2
    try:
        cfg, _ = config.load(args.config, [o for group in args.set for o in group], plugins=args.plugin)
        if args.download:
            fetch(cfg.data.dataset.name, _dataset_root(cfg), args.mirror)
        manifest = prepare(cfg) if args.force else ensure_prepared(cfg, convert=True)
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
