"""FedDyn (Acar et al., ICLR 2021): federated learning with dynamic regularization."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mpifed.algorithms.base import Algorithm, Client, Server
from mpifed.options import opt
from mpifed.registry import ALGORITHMS


class FedDynClient(Client):
    """Minimises L_k(theta) - <g_k, theta> + alpha/2 ||theta - w||^2 (w the server model; parameters
    only), then updates its gradient state g_k <- g_k - alpha (theta_k - w)."""

    def train(self, ctx):
        self._grad = ctx.flat.param_views(ctx.state["grad"])
        self._anchor = ctx.flat.param_views(ctx.global_weights)
        super().train(ctx)

    def loss(self, ctx, batch, out):
        params = list(ctx.model.parameters())
        linear = sum((w * g).sum() for w, g in zip(params, self._grad))
        prox = sum((w - s).pow(2).sum() for w, s in zip(params, self._anchor))
        return super().loss(ctx, batch, out) - linear + self.options.alpha / 2 * prox

    def init_state(self, ctx):
        return {"grad": torch.zeros(self.setup.num_params, device=self.setup.device)}

    def uplink(self, ctx):
        p = self.setup.num_params
        drift = ctx.flat.floats[:p] - ctx.global_weights[:p]
        ctx.state = {"grad": ctx.state["grad"] - self.options.alpha * drift}
        return {"model": ctx.flat.floats.double(), "weight": torch.ones(1, dtype=torch.float64)}


class FedDynServer(Server):
    """h <- h - alpha/m sum_{k in P_t} (theta_k - w);  w <- mean_{k in P_t} theta_k - h / alpha
    (parameters; float buffers are the plain mean)."""

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        self.h = torch.zeros(setup.num_params, dtype=torch.float64, device=setup.device)

    def aggregate(self, rnd, weights, replies):
        s, p, alpha = replies.sums, self.setup.num_params, self.options.alpha
        count = s["weight"]
        drift_sum = s["model"][:p] - count * weights[:p].double()
        self.h = self.h - alpha / self.setup.num_clients * drift_sum
        new = s["model"] / count
        new[:p] -= self.h / alpha
        return new.to(torch.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"h": self.h.cpu()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.h = state["h"].to(self.setup.device)


@ALGORITHMS.register("feddyn")
class FedDyn(Algorithm):
    """FedDyn (Acar et al., ICLR 2021): each client's objective is corrected by a linear term from its
    own gradient state, so that the clients' stationary points agree with the global one.

    Algorithm 1, with w the round's server model, m the number of clients, P_t the round's clients:

    * client k: theta_k = argmin L_k(theta) - <g_k, theta> + alpha/2 ||theta - w||^2, by E epochs
      of the local optimiser from w; then g_k <- g_k - alpha (theta_k - w) (the paper's
      grad L_k(theta_k^t), kept in the client state, zero before the client first trains);
    * server: h <- h - alpha/m sum_{k in P_t} (theta_k - w), divided by the TOTAL number of
      clients m, not |P_t|; the new server model is (1/|P_t|) sum_{k in P_t} theta_k - h/alpha.
      h starts at 0 and is checkpointed.

    The clients send only their models: the server gets sum_k (theta_k - w) from the model sum.
    The average over P_t is uniform, as Algorithm 1 and the official code (github.com/alpemreacar/FedDyn)
    write it
    (``train.client_weights`` does not apply); with it FedDyn's fixed point is a stationary
    point of sum_k L_k. The official code instead scales alpha per client by (mean n) / n_k on
    unbalanced data, which is not implemented. Weight decay (``train.weight_decay``) is part of
    L_k, as in the official code (its SGD decay is alpha + weight decay, where alpha implements
    the quadratic term's alpha theta). The penalty covers parameters only; float buffers
    (BatchNorm statistics) are averaged. alpha = 0.01 by default, from the paper's sweep
    {0.1, 0.01, 0.001}. No alpha reduces FedDyn to FedAvg: h/alpha does not vanish as alpha -> 0.
    """

    @dataclass
    class Options:
        alpha: float = opt(0.01, "weight of the dynamic regularizer (the paper sweeps 0.1, 0.01, 0.001)", min=0,
                           exclusive_min=True)

    Client = FedDynClient
    Server = FedDynServer

    def messages(self):
        return super().messages().extend(client_state={"grad": (self.setup.num_params,)})
