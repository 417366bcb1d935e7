"""FedDyn (Acar et al., ICLR 2021): federated learning with dynamic regularization."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mpifed.algorithms.base import Algorithm, Client, Inputs, Server, Switches
from mpifed.local.optim import FlatSGD
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


class FedDynClient(Client):
    """Minimises L_k(theta) - <g_k, theta> + alpha/2 ||theta - w||^2 (w the server model; parameters
    only), then updates its gradient state g_k <- g_k - alpha (theta_k - w). With the official
    optimiser, alpha theta is the optimiser's weight decay and the loss keeps -alpha <w, theta>."""

    def begin_client(self, ctx):
        self.inputs.grad = ctx.state.grad

    def optimizer(self, ctx):
        if self.options.optimizer == "train":
            return super().optimizer(ctx)
        return FlatSGD(ctx.flat, ctx.lr, momentum=0.0, weight_decay=self.options.alpha + self.setup.train.weight_decay)

    def loss(self, ctx, batch, out):
        params = list(ctx.model.parameters())
        anchors = ctx.flat.param_views(ctx.global_weights)
        linear = sum((w * g).sum() for w, g in zip(params, ctx.flat.param_views(self.inputs.grad)))
        if self.options.optimizer == "official":
            anchor = sum((w * s).sum() for w, s in zip(params, anchors))
            return super().loss(ctx, batch, out) - linear - self.options.alpha * anchor
        prox = sum((w - s).pow(2).sum() for w, s in zip(params, anchors))
        return super().loss(ctx, batch, out) - linear + self.options.alpha / 2 * prox


    def end_client(self, ctx):
        p = self.setup.num_params
        drift = ctx.flat.floats[:p] - ctx.global_weights[:p]
        return {"grad": ctx.state.grad - self.options.alpha * drift}

    def uplink(self, ctx):
        return {"model": ctx.flat.floats.double(), "weight": torch.ones(1, dtype=torch.float64)}


class FedDynServer(Server):
    """h <- h - alpha/m sum_{k in P_t} (theta_k - w);  w <- mean_{k in P_t} theta_k - h / alpha
    (parameters; float buffers are the plain mean). Reports w, or mean_{k in P_t} theta_k."""

    state = ("h",)

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        self.h = torch.zeros(setup.num_params, dtype=torch.float64, device=setup.device)
        self.clients_mean: torch.Tensor | None = None
        if options.evaluate == "clients_mean":
            self.state = ("h", "clients_mean")     # the model it reports, too

    def aggregate(self, server_round, weights, replies):
        s, p, alpha = replies.sums, self.setup.num_params, self.options.alpha
        count = s.weight
        drift_sum = s.model[:p] - count * weights[:p].double()
        self.h = self.h - alpha / self.setup.num_clients * drift_sum
        new = s.model / count
        if self.options.evaluate == "clients_mean":
            self.clients_mean = new.to(torch.float32)
        new[:p] -= self.h / alpha
        return new.to(torch.float32)

    def reported(self, weights):
        if self.options.evaluate == "clients_mean":
            return self.clients_mean
        return weights


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
    L_k, as in the official code. The penalty covers parameters only; float buffers
    (BatchNorm statistics) are averaged. alpha = 0.01 by default, from the paper's sweep
    {0.1, 0.01, 0.001}. No alpha reduces FedDyn to FedAvg: h/alpha does not vanish as alpha -> 0.

    As the official code runs it (both options default to Algorithm 1 with ``train``'s optimiser):

    * ``evaluate: clients_mean`` evaluates (and saves as model.pt) the mean of the round's client
      models, (1/|P_t|) sum_{k in P_t} theta_k, which is what ``train_FedDyn`` in
      ``utils_methods.py`` reports (its ``avg_model``, lines 396-412, "Communication sel"; it also
      reports the mean of every client's latest model, which would keep all clients' models on
      the server and is not implemented). The server model mean - h/alpha is still what the
      clients receive and start from; only the evaluated model changes.
    * ``optimizer: official`` trains as ``train_feddyn_mdl`` in ``utils_general.py`` (lines 190
      and 224): plain SGD whose weight decay is alpha + ``train.weight_decay`` (so the
      quadratic's alpha theta is in the decay and the loss keeps the linear -alpha <w, theta>),
      and gradient clipping (``train.grad_clip``; the code clips at 10) acts on the gradient
      before the decay is added. The gradient without clipping is the same as Algorithm 1's;
      with clipping, alpha theta escapes it. It needs ``train.optimizer: sgd`` and
      ``train.momentum: 0``.
    """

    @dataclass
    class Options:
        alpha: float = opt(0.01, "weight of the dynamic regularizer (the paper sweeps 0.1, 0.01, 0.001)", min=0,
                           exclusive_min=True)
        evaluate: Literal["server", "clients_mean"] = opt(
            "server", "the model evaluated and saved: the server model sent to clients, or the mean of the round's "
                      "client models (the official code's reported model)")
        optimizer: Literal["train", "official"] = opt(
            "train", "train: train.optimizer with the quadratic in the loss; official: plain SGD with weight decay "
                     "alpha + train.weight_decay, train.grad_clip acting before the decay (the official code; "
                     "needs train.momentum: 0)")

    Client = FedDynClient
    Server = FedDynServer
    own_server_step = "the server model mean - h/alpha"
    # no alpha reduces it to FedAvg: test_feddyn_* cover it
    switches = Switches(on=("algorithm.alpha=0.1", "train.participation=0.6"))

    def messages(self):
        return super().messages().extend(client_state={"grad": (self.setup.num_params,)})

    def inputs(self):
        return Inputs(client={"grad": (self.setup.num_params,)})     # g_k, this client's gradient state

    @classmethod
    def check_config(cls, cfg) -> list[str]:
        if cfg.algorithm.options.optimizer != "official":
            return []
        problems = []
        if cfg.train.optimizer != "sgd":
            problems.append(f"algorithm feddyn with optimizer official trains with plain SGD; set train.optimizer=sgd "
                            f"(not {cfg.train.optimizer})")
        if cfg.train.momentum != 0:
            problems.append(f"algorithm feddyn with optimizer official trains without momentum, as the official code; "
                            f"set train.momentum=0 (not {cfg.train.momentum:g})")
        return problems
