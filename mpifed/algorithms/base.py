"""The algorithm interface: one class per method, plugged into the round through a few hooks.

The round (server.py / worker.py) calls, in this order::

    server: downlink(rnd, w)            -> extra tensors sent with the global weights w
    worker: round_start(rnd, down)      once per round, e.g. load the teacher
    worker: client_statistics(data, tf) summed over all clients of all workers (MPI
            use_statistics(totals)      Allreduce) before local training, e.g. prototypes
    worker: local_train(ctx)            per client; the default loop calls loss(...)
    worker: client_uplink(ctx)          per client, summed over clients and workers
    server: aggregate(rnd, w, totals)   -> the new global weights
    server: after_round(rnd, w)         e.g. update a moving-average teacher

The base class *is* FedAvg: uplink n_k * w_k and n_k, aggregate their ratio. What
travels is declared by ``downlink_spec``/``statistics_spec``/``uplink_spec`` (name ->
shape), the same on every rank, so buffers can be allocated before anything arrives.
Server state that must survive a restart goes in ``state_dict``; per-client state that
persists across rounds (whichever worker trains the client) goes in ``ctx.state``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mpifed.config import NoOptions, TrainConfig
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.flat import FlatModel
from mpifed.optim import FlatSGD

Shapes = dict[str, tuple[int, ...]]


class NonFiniteLoss(FloatingPointError):
    """The local loss became NaN or infinite."""


@dataclass
class Setup:
    """What every rank knows about the run when the algorithm is built."""

    num_classes: int
    num_clients: int
    num_floats: int            # length of the flat float32 state (parameters, then float buffers)
    num_params: int            # of which parameters
    train: TrainConfig
    device: torch.device
    new_model: Callable[[], FlatModel]   # a fresh network on this rank's device


@dataclass
class ClientContext:
    """One client's local training in one round."""

    cid: int
    round: int
    lr: float
    flat: FlatModel                 # the local model, loaded with the global weights
    global_floats: torch.Tensor     # the round's global weights (flat, on the device)
    data: ClientData
    transform: BatchTransform
    generator: torch.Generator      # seeded by (seed, round, client): batches and augmentation
    state: dict[str, Any] | None = None   # persistent per-client state (has_client_state)
    batch: torch.Tensor | None = None     # indices (into data) of the batch being trained on
    steps: int = 0
    loss_sum: float = 0.0
    seen: int = 0
    extra: dict[str, float] = field(default_factory=dict)   # per-client figures for the log

    @property
    def model(self) -> nn.Module:
        return self.flat.model

    @property
    def num_samples(self) -> int:
        return self.data.num_samples


@dataclass
class ServerTools:
    """What the server gives an algorithm: a scratch model and the server-held data (if any)."""

    flat: FlatModel
    transform: BatchTransform
    data: ClientData | None
    eval_batch_size: int

    @torch.no_grad()
    def logits(self, floats: torch.Tensor, ints: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the model with state ``floats`` on the server-held data (eval mode)."""
        if self.data is None:
            raise RuntimeError("this run has no server-held data (data.server_holdout_per_class is 0)")
        self.flat.load(floats.to(self.flat.floats.device), ints)
        model = self.flat.model.eval()
        out = [model(self.transform.eval(self.data.images[i:i + self.eval_batch_size]))
               for i in range(0, self.data.num_samples, self.eval_batch_size)]
        return torch.cat(out)


class Algorithm:
    """FedAvg (McMahan et al., 2017), and the hooks every other method overrides."""

    name: ClassVar[str] = "fedavg"
    Options: ClassVar[type] = NoOptions
    needs_server_data: ClassVar[str] = ""   # why the method needs server-held data; "" if it does not
    has_client_state: ClassVar[bool] = False

    def __init__(self, options: Any, setup: Setup) -> None:
        self.options = options
        self.setup = setup

    # ---------------------------------------------------------------- what travels
    def downlink_spec(self) -> Shapes:
        """Extra tensors sent down each round, besides the global weights."""
        return {}

    def statistics_spec(self) -> Shapes:
        """Sums all-reduced between workers before local training (empty: no such step)."""
        return {}

    def uplink_spec(self) -> Shapes:
        """Sums reduced to the server after local training."""
        return {"model": (self.setup.num_floats,), "weight": (1,)}

    # ---------------------------------------------------------------- server side
    def server_start(self, global_floats: torch.Tensor, tools: ServerTools) -> None:
        """Called once on the server before its first round; on resume ``load_state_dict`` follows."""

    def downlink(self, rnd: int, global_floats: torch.Tensor) -> dict[str, torch.Tensor]:
        """The extra tensors of ``downlink_spec`` for round ``rnd``."""
        return {}

    def aggregate(self, rnd: int, global_floats: torch.Tensor, totals: dict[str, torch.Tensor]) -> torch.Tensor:
        """The new global weights from the summed uplink (FedAvg: sum n_k w_k / sum n_k)."""
        return (totals["model"] / totals["weight"]).to(torch.float32)

    def after_round(self, rnd: int, global_floats: torch.Tensor) -> None:
        """Called on the server with the new global weights after aggregation."""

    def round_log(self) -> dict[str, Any]:
        """Figures of this round for metrics.jsonl (e.g. FedCAD's class weights)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Server state needed to resume exactly."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""

    # ---------------------------------------------------------------- worker side
    def round_start(self, rnd: int, down: dict[str, torch.Tensor]) -> None:
        """Called once per round on each worker with the downlink tensors (on its device)."""

    def client_statistics(self, data: ClientData, transform: BatchTransform) -> dict[str, torch.Tensor]:
        """One client's contribution to the ``statistics_spec`` sums."""
        return {}

    def use_statistics(self, totals: dict[str, torch.Tensor]) -> None:
        """Receive the sums of ``client_statistics`` over all sampled clients."""

    def init_client_state(self) -> dict[str, Any]:
        """A client's state before it first trains (has_client_state)."""
        return {}

    def loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The local objective on one batch (default: cross-entropy)."""
        return F.cross_entropy(logits, y)

    def local_train(self, ctx: ClientContext) -> None:
        """E epochs of SGD over the client's data, minimising ``loss``; fills ctx.steps/loss_sum/seen.

        A fresh optimiser (and momentum) for every client in every round. A last batch of
        a single sample is skipped (BatchNorm cannot train on it).
        """
        cfg = self.setup.train
        model = ctx.model.train()
        opt = FlatSGD(ctx.flat, ctx.lr, cfg.momentum, cfg.weight_decay)
        n = ctx.num_samples
        for epoch in range(cfg.local_epochs):
            epoch_loss = torch.zeros((), device=ctx.data.images.device)
            for idx in batch_indices(n, cfg.batch_size, ctx.generator, ctx.data.images.device):
                ctx.batch = idx
                x = ctx.transform.train(ctx.data.images[idx], ctx.generator)
                y = ctx.data.labels[idx]
                loss = self.loss(ctx, x, y, model(x))
                opt.zero_grad()
                loss.backward()
                if cfg.grad_clip > 0:
                    opt.clip_grad_norm(cfg.grad_clip)
                opt.step()
                epoch_loss += loss.detach() * len(y)
                ctx.steps += 1
                ctx.seen += len(y)
            value = float(epoch_loss)
            if not np.isfinite(value):
                raise NonFiniteLoss(
                    f"client {ctx.cid}, round {ctx.round}, epoch {epoch}: the local loss is {value} "
                    f"(learning rate {ctx.lr:g}). Lower train.lr, set train.grad_clip, or check the data")
            ctx.loss_sum += value

    def client_uplink(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """One client's contribution to the ``uplink_spec`` sums (FedAvg: n_k w_k and n_k)."""
        n = float(ctx.num_samples)
        return {"model": ctx.flat.floats.double() * n, "weight": torch.tensor([n], dtype=torch.float64)}


def batch_indices(n: int, batch_size: int, gen: torch.Generator, device: torch.device):
    """Shuffled mini-batch index tensors covering 0..n-1 once (a trailing single sample is dropped)."""
    perm = torch.randperm(n, generator=gen).to(device)
    for start in range(0, n, batch_size):
        idx = perm[start: start + batch_size]
        if len(idx) == 1 and n > 1:
            return
        yield idx
