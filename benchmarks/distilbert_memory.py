"""Peak memory of one worker fine-tuning DistilBERT-base (FedGKD Table 4's model), on CPU or a GPU.

    python benchmarks/distilbert_memory.py [--steps 2] [--batch 64] [--length 128] [--device cpu|cuda]

Builds what a worker holds for one client: the flat model (DistilBERT-base shape, 66M
parameters, random weights: the memory does not depend on the values), its gradient, the
inference copy used for evaluation, one client's token ids; then runs the method-independent
local training loop (FedAvg's ``Client.train``: Adam, as the paper) for ``steps`` batches and
reports the process's peak resident memory (and on a GPU the peak allocated GPU memory) and
the seconds per step. Adam's two moment buffers exist from the first step, so a few steps
reach the peak.
"""
from __future__ import annotations

import argparse
import resource
import time

import torch

from mpifed.algorithms.base import Client, ClientContext, Setup
from mpifed.config import TrainConfig
from mpifed.data.store import ClientData
from mpifed.data.transforms import TokenTransform
from mpifed.flat import FlatModel
from mpifed.inference import InferenceCopy
from mpifed.registry import MODELS


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    entry = MODELS.get("distilbert")
    before = peak_rss_mb()

    def new_model() -> FlatModel:
        return FlatModel(entry.build(entry.Options(), (args.length,), args.classes).to(device))

    flat = new_model()
    eval_copy = InferenceCopy(flat)
    cfg = TrainConfig(local_epochs=1, batch_size=args.batch, optimizer="adam", lr=1e-5, weight_decay=0.0)
    setup = Setup(args.classes, 1, 1, flat.num_floats, flat.num_params, flat.ints.numel(), flat.model.feature_dim, cfg,
                  device, new_model)
    n = args.steps * args.batch
    inputs = {"input_ids": torch.randint(1000, 30000, (n, args.length), dtype=torch.int32, device=device),
              "attention_mask": torch.ones(n, args.length, dtype=torch.uint8, device=device)}
    data = ClientData(0, inputs, torch.randint(0, args.classes, (n,), device=device))
    ctx = ClientContext(cid=0, round=0, lr=1e-5, flat=flat, global_weights=flat.floats.clone(), data=data,
                        transform=TokenTransform(device), generator=torch.Generator().manual_seed(0), train_cfg=cfg)
    start = time.perf_counter()
    Client(None, setup).train(ctx)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / ctx.steps
    print(f"DistilBERT-base: {flat.num_params:,} parameters; batch {args.batch}, length {args.length}, "
          f"{ctx.steps} Adam steps on {device} with {torch.get_num_threads()} threads")
    print(f"peak RSS {peak_rss_mb():.0f} MB (before the model was built: {before:.0f} MB); "
          f"{seconds:.1f} s per step; the evaluation copy ({sum(t.numel() for t in eval_copy.net.parameters()):,} "
          f"parameters) held as a worker holds it")
    if device.type == "cuda":
        print(f"peak GPU memory allocated {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MB")


if __name__ == "__main__":
    main()
