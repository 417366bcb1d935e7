"""Per-round times on a GPU machine: several workers sharing one GPU.

    python benchmarks/gpu.py [--workers 4 10] [--rounds 4] [--workloads ...] [--set KEY=VALUE ...]

Runs (a) the quick start and (b) two paper settings, FedGKD Table 3's CIFAR-10 (ResNet-8 GN,
20 clients, C = 0.2, E = 20) and FedNTD Table 1's CIFAR-10 sharding (FedAvg CNN, 100 clients,
C = 0.1, E = 5), on synthetic data of CIFAR-10's shape and size (50,000 + 10,000 images of
3x32x32: times depend on shapes and counts, not on pixel values), with 1 server (CPU) and
N workers on the machine's GPUs, and prints the per-round medians. ``--set`` adds settings to
every run, e.g. ``resources.mps=off`` (the launcher's MPS daemon: ``auto`` starts one when
workers share a GPU), ``resources.cuda_graphs=on``, ``resources.precision=tf32``.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, breakdown_table, run_mpifed  # noqa: E402

CIFAR_SHAPED = ["data.dataset.name=synthetic", "data.dataset.channels=3", "data.dataset.size=32",
                "data.dataset.train_samples=50000", "data.dataset.test_samples=10000", "data.dataset.num_classes=10"]

WORKLOADS = {
    "quickstart": ["--config", str(REPO / "configs/quickstart.yaml")],
    "fedgkd-cifar10": ["--config", str(REPO / "configs/papers/fedgkd/cifar10-alpha0.5.yaml"), "--set", *CIFAR_SHAPED,
                       "data.server_holdout_per_class=500"],
    "fedntd-cifar10": ["--config", str(REPO / "configs/papers/fedntd/cifar10-shard2.yaml"), "--set", *CIFAR_SHAPED],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[4, 10])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="settings added to every run")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.workloads:
            figs = []
            for w in a.workers:
                args = WORKLOADS[name] + ["--set", f"train.rounds={a.rounds}", "resources.device=cuda",
                                          "run.checkpoint_every=0", f"data.prepared_root={tmp}/data", *a.set]
                f = run_mpifed(w + 1, args, Path(tmp), f"{name}-{w}", timeout=3000)
                figs.append(f)
            print(f"\n{name}: 1 server + {a.workers} workers on {f.summary.get('dataset')}; seconds per round "
                  f"(median after the first round){'; ' + ' '.join(a.set) if a.set else ''}")
            print(breakdown_table(figs))


if __name__ == "__main__":
    main()
