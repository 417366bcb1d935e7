"""SCAFFOLD (Karimireddy et al., 2020), option II control variates."""
from __future__ import annotations

from typing import Any

import torch

from mpifed.algorithms.base import Algorithm


class Scaffold(Algorithm):
    """Local steps follow g(w) - c_i + c; after K steps c_i+ = c_i - c + (w_global - w) / (K * lr).

    With local SGD momentum beta, K is replaced by the number of plain steps that would
    move as far under a constant gradient, (K - beta (1 - beta^K) / (1 - beta)) / (1 - beta),
    as FedNTD's SCAFFOLD does ("adaptive division"); without it the control variates are
    about 1/(1-beta) times too large and training diverges.

    The correction enters as the loss term <c - c_i, w>, whose gradient is exactly c - c_i.
    The server averages the models as FedAvg does (global learning rate 1) and updates
    c <- c + sum_k (c_i+ - c_i) / K_total over all K_total clients. Each client's c_i lives in
    its persistent client state, so it follows the client from worker to worker.
    """

    name = "scaffold"
    has_client_state = True

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.control = torch.zeros(setup.num_params, device=setup.device)

    def downlink_spec(self):
        return {"control": (self.setup.num_params,)}

    def uplink_spec(self):
        return {**super().uplink_spec(), "delta_control": (self.setup.num_params,)}

    def downlink(self, rnd, global_floats):
        return {"control": self.control}

    def aggregate(self, rnd, global_floats, totals):
        self.control = self.control + (totals["delta_control"] / self.setup.num_clients).to(torch.float32)
        return super().aggregate(rnd, global_floats, totals)

    def state_dict(self) -> dict[str, Any]:
        return {"control": self.control.cpu()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.control = state["control"].to(self.setup.device)

    # worker side
    def round_start(self, rnd, down):
        self.server_control = down["control"]

    def init_client_state(self) -> dict[str, Any]:
        return {"control": torch.zeros(self.setup.num_params, device=self.setup.device)}

    def loss(self, ctx, x, y, logits):
        correction = self.server_control - ctx.state["control"]
        views = ctx.flat.param_views(correction)
        linear = sum((p * c).sum() for p, c in zip(ctx.model.parameters(), views))
        return super().loss(ctx, x, y, logits) + linear

    def client_uplink(self, ctx):
        n = self.setup.num_params
        drift = (ctx.global_floats[:n] - ctx.flat.floats[:n]) / (effective_steps(ctx.steps, self.setup.train.momentum) * ctx.lr)
        new_control = ctx.state["control"] - self.server_control + drift
        delta = new_control - ctx.state["control"]
        ctx.state = {"control": new_control}
        return {**super().client_uplink(ctx), "delta_control": delta.double()}


def effective_steps(steps: int, momentum: float) -> float:
    """Plain-SGD steps equivalent to ``steps`` momentum steps under a constant gradient."""
    if momentum == 0 or steps == 0:
        return float(max(steps, 1))
    return (steps - momentum * (1 - momentum ** steps) / (1 - momentum)) / (1 - momentum)
