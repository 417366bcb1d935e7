"""FedProx (Li et al., 2020): local loss + mu/2 * ||w - w_global||^2."""
from __future__ import annotations

from dataclasses import dataclass

from mpifed.algorithms.base import Algorithm
from mpifed.config import opt


class FedProx(Algorithm):
    """The proximal term keeps each local model near the round's global model."""

    name = "fedprox"

    @dataclass
    class Options:
        mu: float = opt(0.01, "weight of the proximal term (FedGKD's tables: 0.01 on CIFAR-10, 0.001 otherwise)", min=0)

    def loss(self, ctx, x, y, logits):
        anchors = ctx.flat.param_views(ctx.global_floats)
        prox = sum((p - g).pow(2).sum() for p, g in zip(ctx.model.parameters(), anchors))
        return super().loss(ctx, x, y, logits) + self.options.mu / 2 * prox
