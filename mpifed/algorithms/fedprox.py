"""FedProx (Li et al., MLSys 2020): local loss + mu/2 * ||w - w_global||^2."""
from __future__ import annotations

from dataclasses import dataclass

from mpifed.algorithms.base import Algorithm, Client, Switches
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


class FedProxClient(Client):
    """The proximal term keeps each local model near the round's global model (parameters only)."""

    def loss(self, ctx, batch, out):
        anchors = ctx.flat.param_views(ctx.global_weights)
        prox = sum((p - g).pow(2).sum() for p, g in zip(ctx.model.parameters(), anchors))
        return super().loss(ctx, batch, out) + self.options.mu / 2 * prox


@ALGORITHMS.register("fedprox")
class FedProx(Algorithm):
    """FedProx (Li et al., MLSys 2020): the local loss plus mu/2 ||w - w_global||^2 (parameters only)."""

    @dataclass
    class Options:
        mu: float = opt(0.01, "weight of the proximal term (FedGKD's tables: 0.01 on CIFAR-10, 0.001 otherwise)", min=0)

    Client = FedProxClient
    asynchronous = "its proximal term is to the model the client starts from"
    switches = Switches(on=("algorithm.mu=0.5",), off=("algorithm.mu=0",))
