"""A method with client state: each client is pulled towards its own model of the last round it
trained in (a personal proximal term), which it keeps between rounds, wherever it trains next.

The state is declared in messages() (client_state) and starts as zeros; end_client returns the
new state, the only place it changes. What the loss reads of it for this client (the previous
model, and whether there is one) is copied into declared client inputs in begin_client.

    mpifed run --plugin examples/client_state.py --set algorithm.name=personal_prox
"""
from dataclasses import dataclass

import torch

from mpifed.algorithms.base import Algorithm, Client, Inputs
from mpifed.options import opt
from mpifed.registry import ALGORITHMS


class PersonalProxClient(Client):
    def begin_client(self, ctx):
        self.inputs.previous = ctx.state.previous
        self.inputs.has_previous = bool(ctx.state.trained.item())

    def loss(self, ctx, batch, out):
        ce = super().loss(ctx, batch, out)
        if not self.inputs.has_previous:
            return ce
        previous = ctx.flat.param_views(self.inputs.previous)
        drift = sum(((p - q) ** 2).sum() for p, q in zip(ctx.model.parameters(), previous))
        return ce + self.options.mu / 2 * drift

    def end_client(self, ctx):
        n = self.setup.num_params
        return {"previous": ctx.flat.floats[:n].clone(), "trained": torch.ones(1, device=ctx.flat.floats.device)}


@ALGORITHMS.register("personal_prox")
class PersonalProx(Algorithm):
    """FedAvg whose clients keep a proximal pull (mu / 2) ||w - w_k^prev||^2 to their own last model."""

    @dataclass
    class Options:
        mu: float = opt(0.01, "weight of the pull to the client's own last model", min=0)

    Client = PersonalProxClient

    def messages(self):
        return super().messages().extend(client_state={"previous": (self.setup.num_params,), "trained": (1,)})

    def inputs(self):
        return Inputs(client={"previous": (self.setup.num_params,), "has_previous": bool})
