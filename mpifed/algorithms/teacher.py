"""A frozen copy of the network that distillation methods query for soft labels."""
from __future__ import annotations

import torch

from mpifed.algorithms.base import ClientContext, Setup
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.inference import InferenceCopy


class Teacher:
    """Loaded once per round and run without gradients (an :class:`InferenceCopy`), in eval mode
    unless told otherwise.

    When training inputs are not augmented and the teacher runs in eval mode, a sample's
    teacher logits are fixed for the whole round: :meth:`batch_logits` then computes each
    client's logits once (in evaluation-sized batches) and reuses them for every epoch,
    instead of running the teacher on every training batch. The values equal per-batch
    computation up to floating-point rounding.
    """

    def __init__(self, setup: Setup, train_mode: bool = False) -> None:
        self.flat = setup.new_model()
        self.net = InferenceCopy(self.flat)
        self.train_mode = train_mode
        self.chunk = setup.train.eval_batch_size
        self._cache: dict[int, torch.Tensor] = {}

    def load(self, floats: torch.Tensor, ints: torch.Tensor | None = None) -> None:
        self.flat.load(floats, ints)
        self.net.load_from(self.flat)
        self._cache.clear()

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x, self.train_mode)

    def client_logits(self, data: ClientData, transform: BatchTransform) -> torch.Tensor:
        """Logits of every sample of a client (unaugmented), cached for the round when allowed."""
        if data.cid in self._cache:
            return self._cache[data.cid]
        out = torch.cat([self.logits(transform.eval(data.images[i:i + self.chunk]))
                         for i in range(0, data.num_samples, self.chunk)])
        if not self.train_mode:
            self._cache[data.cid] = out
        return out

    def batch_logits(self, ctx: ClientContext, x: torch.Tensor) -> torch.Tensor:
        """The teacher's logits for the batch being trained on (``x``, the samples ``ctx.batch``)."""
        if ctx.transform.augments or self.train_mode:
            return self.logits(x)
        return self.client_logits(ctx.data, ctx.transform)[ctx.batch]
