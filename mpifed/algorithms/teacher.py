"""A frozen copy of the network that methods query for soft labels or representations."""
from __future__ import annotations

import torch

from mpifed.algorithms.base import Batch, ClientContext, Setup
from mpifed.data.store import ClientData, rows
from mpifed.data.transforms import BatchTransform
from mpifed.local.inference import InferenceCopy


class Teacher:
    """Loaded with a model state (once per round, or per client) and run without gradients (an
    :class:`InferenceCopy`), in eval mode unless told otherwise.

    When training inputs are not augmented and the teacher runs in eval mode, a sample's
    teacher outputs are fixed until the teacher is loaded again: :meth:`batch_logits` and
    :meth:`batch_features` then compute each client's outputs once (in evaluation-sized
    batches) and reuse them for every epoch, instead of running the teacher on every
    training batch. The values equal per-batch computation up to floating-point rounding.
    Captured steps (``resources.cuda_graphs``) run the teacher per batch inside the graph
    instead: a per-client cache would move between clients.
    """

    def __init__(self, setup: Setup, train_mode: bool = False) -> None:
        self.flat = setup.new_model()
        self.net = InferenceCopy(self.flat)
        self.train_mode = train_mode
        self.chunk = setup.train.eval_batch_size
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def load(self, floats: torch.Tensor, ints: torch.Tensor | None = None) -> None:
        self.flat.load(floats, ints)
        self.net.load_from(self.flat)
        self._cache.clear()

    def logits(self, x) -> torch.Tensor:
        return self.net(x, self.train_mode)

    def outputs(self, x) -> tuple[torch.Tensor, torch.Tensor]:
        """(features, logits) of the teacher on inputs ``x``."""
        return self.net.outputs(x, self.train_mode)

    def client_outputs(self, data: ClientData, transform: BatchTransform) -> tuple[torch.Tensor, torch.Tensor]:
        """(features, logits) of every sample of a client (unaugmented), cached while allowed."""
        if data.cid in self._cache:
            return self._cache[data.cid]
        parts = [self.outputs(transform.eval(rows(data.inputs, i, i + self.chunk)))
                 for i in range(0, data.num_samples, self.chunk)]
        out = torch.cat([z for z, _ in parts]), torch.cat([logit for _, logit in parts])
        if not self.train_mode:
            self._cache[data.cid] = out
        return out

    def client_logits(self, data: ClientData, transform: BatchTransform) -> torch.Tensor:
        return self.client_outputs(data, transform)[1]

    def _cached(self, ctx: ClientContext) -> bool:
        return not (ctx.transform.augments or self.train_mode or ctx.runner.graphs)

    def batch_logits(self, ctx: ClientContext, batch: Batch) -> torch.Tensor:
        """The teacher's logits for the batch being trained on."""
        if not self._cached(ctx):
            return self.logits(batch.x)
        return self.client_logits(ctx.data, ctx.transform)[batch.index]

    def batch_features(self, ctx: ClientContext, batch: Batch) -> torch.Tensor:
        """The teacher's features for the batch being trained on."""
        if not self._cached(ctx):
            return self.outputs(batch.x)[0]
        return self.client_outputs(ctx.data, ctx.transform)[0][batch.index]
