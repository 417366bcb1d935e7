"""FedNova (Wang et al., NeurIPS 2020): normalized averaging of local updates."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mpifed.algorithms.base import Algorithm, Client, Inputs, Messages, Server, Switches, summed
from mpifed.algorithms.scaffold import effective_steps
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


class FedNovaClient(Client):
    """Trains as FedAvg (with ``ccvr``, each gradient minus the client's last normalized update
    d_k); sends p_k d_k = p_k (w_global - w_k) / a_k, p_k a_k and p_k (up to the common 1 / sum p),
    with a_k the momentum-SGD normalizer of its tau_k local steps."""


    def begin_client(self, ctx):
        if self.options.ccvr:
            self.inputs.update = ctx.state.update

    def loss(self, ctx, batch, out):
        if not self.options.ccvr:
            return super().loss(ctx, batch, out)
        last = ctx.flat.param_views(self.inputs.update)
        linear = sum((p * d).sum() for p, d in zip(ctx.model.parameters(), last))
        return super().loss(ctx, batch, out) - linear

    def end_client(self, ctx):
        p, a = self.setup.num_params, effective_steps(ctx.steps, self.setup.train.momentum)
        ctx.extra["a_k"] = round(a, 4)
        if not self.options.ccvr:
            return {}
        return {"update": (ctx.global_weights[:p] - ctx.flat.floats[:p]) / (ctx.lr * a)}

    def uplink(self, ctx):
        p, weight = self.setup.num_params, ctx.weight
        a = effective_steps(ctx.steps, self.setup.train.momentum)
        move = ctx.global_weights[:p] - ctx.flat.floats[:p]
        return {"update": move.double() * (weight / a),
                "tau": torch.tensor([weight * a], dtype=torch.float64),
                "buffers": ctx.flat.floats[p:].double() * weight,
                "weight": torch.tensor([weight], dtype=torch.float64)}


class FedNovaServer(Server):
    """w <- w - tau_eff * sum_k p_k (w - w_k) / a_k, tau_eff = sum_k p_k a_k (parameters);
    float buffers (BatchNorm statistics) are averaged with the weights p_k. The run's server
    optimiser then steps from w to that model (sgd at lr 1: the model itself)."""

    def aggregate(self, server_round, weights, replies):
        s, p = replies.sums, self.setup.num_params
        total = s.weight
        self.tau_eff = float(s.tau / total)
        new = torch.empty_like(weights)
        new[:p] = weights[:p] - (self.tau_eff * s.update / total).to(weights.dtype)
        new[p:] = (s.buffers / total).to(weights.dtype)
        return self.server_step(weights, new)

    def log(self):
        return {"tau_eff": round(self.tau_eff, 4)}


@ALGORITHMS.register("fednova")
class FedNova(Algorithm):
    """FedNova (Wang et al., NeurIPS 2020): normalized averaging of the clients' updates by their
    effective number of local steps.

    Eq. 7 and Appendix (momentum SGD): the server applies
    the p_k-weighted average of each client's normalized update d_k = (w - w_k) / a_k, scaled by
    tau_eff = sum_k p_k a_k, so that clients taking more local steps do not pull the model
    towards their own objective. For SGD with momentum rho over tau_k steps,
    a_k = (tau_k - rho (1 - rho^tau_k) / (1 - rho)) / (1 - rho) (the official code's
    ``local_normalizing_vec``); plain SGD gives a_k = tau_k. Weight decay is folded into the
    gradient and does not enter a_k (as in the official code). p_k = n_k / sum n_k over the
    round's clients (``train.client_weights: uniform``: 1/m). With equal a_k this is FedAvg.

    ``ccvr: true`` is FedNova as FedNTD's code runs it (Lee-Gihun/FedNTD, ``config/fednova.json``:
    ``"nova_ccvr": true``; ``algorithms/fednova/ClientTrainer.py`` and ``Server.py`` at commit
    fd7e20c), a variance-reduced variant that is not in the FedNova paper: every local gradient
    becomes g + c_k (ClientTrainer.py, lines 70-71) with c_k = D - d_k (line 55), where
    d_k = (w - w_k) / (lr a_k) is the normalized update of the client's last round (lines 80-87,
    divided by a_k in the server's ``_clients_training``; lr the round's learning rate; 0 before
    the client first trains) and D a server-side average of the d_k that the code initialises
    to 0 and never updates (its ``_update_weighted_d`` is never called), so c_k = -d_k. The
    server is FedNova's, so with equal client sizes (sharding) the aggregation is still FedAvg's,
    but the local steps are not: this is why FedNTD's Table 1 has FedNova away from FedAvg under
    sharding. d_k lives in the client state. The logged train_loss is the loss the gradient is
    taken of, CE - <w_k, d_k>, so it can be negative.

    Choices: the official code never averages BatchNorm statistics (they stay on each worker)
    and FedNTD's code extrapolates them with the parameters; here they are averaged with p_k.
    FedNova needs SGD (a_k is defined for it).
    """

    @dataclass
    class Options:
        ccvr: bool = opt(False, "FedNTD's nova_ccvr: each local gradient minus the client's normalized update of the "
                                "last round it trained in, (w - w_k) / (lr a_k)")

    Client = FedNovaClient
    Server = FedNovaServer
    switches = Switches(on=("data.partition.beta=0.5",),
                        off=("data.partition=iid",),
                        reference=("algorithm.name=fedavg", "data.partition=iid"))

    def messages(self):
        p, f = self.setup.num_params, self.setup.num_floats
        messages = Messages(up={"update": summed(p), "tau": summed(1), "buffers": summed(f - p), "weight": summed(1)})
        return messages.extend(client_state={"update": (p,)}) if self.options.ccvr else messages

    def inputs(self):
        # with ccvr: d_k, the client's last normalized update, which its gradients are corrected by
        return Inputs(client={"update": (self.setup.num_params,)}) if self.options.ccvr else Inputs()

    @classmethod
    def check_config(cls, cfg) -> list[str]:
        if cfg.train.optimizer != "sgd":
            return [f"algorithm fednova normalizes SGD steps; set train.optimizer=sgd (not {cfg.train.optimizer})"]
        return []
