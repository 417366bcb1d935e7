"""SGD on a :class:`~mpifed.flat.FlatModel`: the whole update as three vector operations.

The arithmetic is ``torch.optim.SGD``'s (dampening 0, no Nesterov): d = g + wd * w;
b = d on the first step, else b = momentum * b + d; w -= lr * b. One kernel per
operation for the whole model instead of one per parameter, and no optimiser import
cost (torch.optim loads torch._dynamo on first use, over a second per process).
"""
from __future__ import annotations

import torch

from mpifed.flat import FlatModel


class FlatSGD:
    def __init__(self, flat: FlatModel, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        self.flat = flat
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.buf: torch.Tensor | None = None

    def zero_grad(self) -> None:
        self.flat.zero_grad()

    def clip_grad_norm(self, max_norm: float) -> None:
        """Scale the gradient to norm at most ``max_norm`` (``nn.utils.clip_grad_norm_``'s rule)."""
        total = torch.linalg.vector_norm(self.flat.grad)
        self.flat.grad.mul_(torch.clamp(max_norm / (total + 1e-6), max=1.0))

    @torch.no_grad()
    def step(self) -> None:
        w = self.flat.floats[: self.flat.num_params]
        d = self.flat.grad
        if self.weight_decay:
            d = d.add(w, alpha=self.weight_decay)
        if self.momentum:
            if self.buf is None:
                self.buf = d.clone()
            else:
                self.buf.mul_(self.momentum).add_(d)
            d = self.buf
        w.add_(d, alpha=-self.lr)
