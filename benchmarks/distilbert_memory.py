"""Peak memory and step time of one worker fine-tuning DistilBERT-base (FedGKD Table 4's model), on CPU or a GPU.

    python benchmarks/distilbert_memory.py [--steps 2] [--batch 64] [--length 128] [--device cpu|cuda]
        [--precision fp32|tf32|bf16] [--cuda-graphs] [--plain]

Builds what a worker holds for one client: the flat model (DistilBERT-base shape, 66M
parameters, random weights: the memory does not depend on the values), its gradient, the
inference copy used for evaluation, one client's token ids; then runs the method-independent
local training loop (FedAvg's ``Client.train``: Adam, as the paper) for ``steps`` batches and
reports the process's peak resident memory (and on a GPU the peak allocated GPU memory), the
first step's seconds (one-time set-up: kernel loading, oneDNN/cuBLAS plans, Adam's buffers)
and the median of the later steps. ``--precision`` and ``--cuda-graphs`` are
``resources.precision`` and ``resources.cuda_graphs``.

``--plain`` also times the same model, batch and optimiser in plain PyTorch, for comparison:
Hugging Face's ``DistilBertForSequenceClassification`` with ``torch.optim.Adam`` (its default
implementation for the device) under the same precision, its gradients set to None each step.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from mpifed.algorithms.base import Client, ClientContext, Setup
from mpifed.settings.config import TrainConfig
from mpifed.data.store import ClientData
from mpifed.data.transforms import TokenTransform
from mpifed.local.flat import FlatModel
from mpifed.local.inference import InferenceCopy
from mpifed.plugin.registry import MODELS
from mpifed.local.steps import LocalSteps, make_steps


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TimedSteps(LocalSteps):
    """Local steps that record when each one has finished on the device."""

    def __init__(self, base: LocalSteps, device: torch.device) -> None:
        super().__init__(base.precision, base.graphs, print)
        self.device = device
        self.ends: list[float] = []

    def __call__(self, client, ctx, opt, batch):
        loss = super().__call__(client, ctx, opt, batch)
        sync(self.device)
        self.ends.append(time.perf_counter())
        return loss


def split_times(start: float, ends: list[float]) -> tuple[float, float]:
    """The first step's seconds and the median of the later steps' (NaN with one step)."""
    gaps = [b - a for a, b in zip([start] + ends[:-1], ends)]
    return gaps[0], statistics.median(gaps[1:]) if len(gaps) > 1 else float("nan")


def plain_times(args: argparse.Namespace, device: torch.device, inputs: dict,
                labels: torch.Tensor) -> tuple[float, float]:
    """First and median later step seconds of the same training in plain PyTorch + transformers."""
    import transformers
    torch.manual_seed(0)
    model = transformers.DistilBertForSequenceClassification(
        transformers.DistilBertConfig(num_labels=args.classes)).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16" else None)
    sync(device)
    start, ends = time.perf_counter(), []
    for i in range(args.steps):
        rows = slice(i * args.batch, (i + 1) * args.batch)
        ids, mask = inputs["input_ids"][rows].long(), inputs["attention_mask"][rows].long()
        if autocast is None:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels[rows]).loss
        else:
            with autocast:
                loss = model(input_ids=ids, attention_mask=mask, labels=labels[rows]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sync(device)
        ends.append(time.perf_counter())
    return split_times(start, ends)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--cuda-graphs", action="store_true", help="resources.cuda_graphs=on (a GPU only)")
    p.add_argument("--plain", action="store_true", help="also time plain PyTorch + transformers")
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
    labels = torch.randint(0, args.classes, (n,), device=device)
    runner = TimedSteps(make_steps(args.precision, "on" if args.cuda_graphs else "off", device), device)
    ctx = ClientContext(cid=0, round=0, lr=1e-5, flat=flat, global_weights=flat.floats.clone(),
                        data=ClientData(0, inputs, labels), transform=TokenTransform(device),
                        generator=torch.Generator(device).manual_seed(0), train_cfg=cfg, runner=runner)
    sync(device)
    start = time.perf_counter()
    Client(None, setup).train(ctx)
    first, later = split_times(start, runner.ends)
    print(f"DistilBERT-base: {flat.num_params:,} parameters; batch {args.batch}, length {args.length}, "
          f"{ctx.steps} Adam steps on {device} with {torch.get_num_threads()} threads, precision {args.precision}"
          f"{', CUDA graphs' if args.cuda_graphs else ''}")
    print(f"peak RSS {peak_rss_mb():.0f} MB (before the model was built: {before:.0f} MB); "
          f"the evaluation copy ({sum(t.numel() for t in eval_copy.net.parameters()):,} parameters) held as a worker "
          "holds it")
    if device.type == "cuda":
        print(f"peak GPU memory allocated {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MB")
    print(f"mpifed: first step {first:.3f} s, later steps {later * 1000:.1f} ms (median)")
    if args.plain:
        first, later = plain_times(args, device, inputs, labels)
        print(f"plain PyTorch: first step {first:.3f} s, later steps {later * 1000:.1f} ms (median)")


if __name__ == "__main__":
    main()
