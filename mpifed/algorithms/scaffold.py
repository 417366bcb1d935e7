"""SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates."""
from __future__ import annotations

import torch

from mpifed.algorithms.base import Algorithm, Client, Inputs, Server, Switches, summed
from mpifed.plugin.registry import ALGORITHMS


def effective_steps(steps: int, momentum: float) -> float:
    """Plain-SGD steps equivalent to ``steps`` momentum-SGD steps under a constant gradient:
    sum_{t=1..K} (1 - beta^t) / (1 - beta) = (K - beta (1 - beta^K) / (1 - beta)) / (1 - beta)
    (FedNova's a_k for momentum SGD; FedNTD's SCAFFOLD "adaptive division")."""
    if momentum == 0 or steps == 0:
        return float(max(steps, 1))
    return (steps - momentum * (1 - momentum ** steps) / (1 - momentum)) / (1 - momentum)


class ScaffoldServer(Server):
    """Averages the models as FedAvg does (global learning rate 1) and updates the server control
    c <- c + sum_k (c_i+ - c_i) / N over the round's clients (N: all clients)."""

    state = ("control",)

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        self.control = torch.zeros(setup.num_params, device=setup.device)

    def downlink(self, server_round, weights):
        return {"control": self.control}

    def aggregate(self, server_round, weights, replies):
        self.control = self.control + (replies.sums.delta_control / self.setup.num_clients).to(torch.float32)
        return super().aggregate(server_round, weights, replies)


class ScaffoldClient(Client):
    """Local steps follow g(w) - c_i + c; after K steps c_i+ = c_i - c + (w_global - w) / (K lr).

    The correction enters as the loss term <c - c_i, w>, whose gradient is exactly c - c_i.
    With local momentum beta, K is replaced by :func:`effective_steps`; without it the
    control variates are about 1/(1-beta) times too large and training diverges.
    """

    def round_start(self, server_round, down):
        self.inputs.control = down.control

    def begin_client(self, ctx):
        self.inputs.correction = self.inputs.control - ctx.state.control

    def loss(self, ctx, batch, out):
        correction = ctx.flat.param_views(self.inputs.correction)
        linear = sum((p * c).sum() for p, c in zip(ctx.model.parameters(), correction))
        return super().loss(ctx, batch, out) + linear

    def end_client(self, ctx):
        n = self.setup.num_params
        steps = effective_steps(ctx.steps, self.setup.train.momentum)
        drift = (ctx.global_weights[:n] - ctx.flat.floats[:n]) / (steps * ctx.lr)
        return {"control": ctx.state.control - self.inputs.control + drift}

    def uplink(self, ctx):
        delta = ctx.new_state.control - ctx.state.control
        return {**super().uplink(ctx), "delta_control": delta.double()}


@ALGORITHMS.register("scaffold")
class Scaffold(Algorithm):
    """SCAFFOLD (Karimireddy et al., ICML 2020), option II control variates, corrected for local momentum.

    Each client's c_i lives in its persistent client state, so it follows the client from worker to worker.
    The models are averaged with FedAvg's weights n_k (``train.client_weights``), as FedNTD's code
    does (``algorithms/BaseServer.py``, ``_aggregation`` over the client sizes), and with global
    learning rate 1; Algorithm 1 of the paper writes the uniform mean over the round's clients,
    which ``train.client_weights: uniform`` gives. The server control c moves by the plain sum
    of the round's control deltas over N (the paper's (1/N) sum, FedNTD's sample ratio times
    their mean).
    """

    Server = ScaffoldServer
    Client = ScaffoldClient
    switches = Switches(on=("train.participation=0.6",))   # no weight to switch off: test_scaffold_* cover it

    def messages(self):
        p = self.setup.num_params
        return super().messages().extend(down={"control": (p,)}, up={"delta_control": summed(p)},
                                         client_state={"control": (p,)})

    def inputs(self):
        p = (self.setup.num_params,)
        return Inputs(round={"control": p}, client={"correction": p})     # c, and c - c_i
