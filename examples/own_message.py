"""A method with messages of its own: clients report their label counts, the server sends back the
round's label prior, and each client trains with the logit adjustment of balanced softmax
(Menon et al., ICLR 2021) against it.

Two of messages()' parts carry them: ``down`` (the server's prior, from the counts reported so
far) and ``up`` (each client's counts, summed over the round in the same Reduce as the model).
The server keeps the counts it has seen as its state (``state``), so a checkpoint holds them and
a resume continues exactly.

    mpifed run --plugin examples/own_message.py --set algorithm.name=prior_adjust
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm, Client, Inputs, Server, summed
from mpifed.options import opt
from mpifed.registry import ALGORITHMS


class PriorServer(Server):
    state = ("counts",)

    def __init__(self, options, setup, tools):
        super().__init__(options, setup, tools)
        self.counts = torch.ones(setup.num_classes, dtype=torch.float64)   # a uniform prior before any report

    def downlink(self, server_round, weights):
        return {"log_prior": (self.counts / self.counts.sum()).log().float()}

    def aggregate(self, server_round, weights, replies):
        self.counts = self.counts + replies.sums.label_counts.cpu()
        return super().aggregate(server_round, weights, replies)


class PriorClient(Client):
    def round_start(self, server_round, down):
        self.inputs.log_prior = down.log_prior

    def begin_client(self, ctx):
        counts = torch.bincount(ctx.data.labels, minlength=self.setup.num_classes).float()
        self.inputs.local_log_prior = (counts + 1).log() - (counts + 1).sum().log()

    def loss(self, ctx, batch, out):
        shift = self.options.tau * (self.inputs.local_log_prior - self.inputs.log_prior)
        return F.cross_entropy(out.logits + shift, batch.y)

    def uplink(self, ctx):
        counts = torch.bincount(ctx.data.labels, minlength=self.setup.num_classes).double()
        return {**super().uplink(ctx), "label_counts": counts}


@ALGORITHMS.register("prior_adjust")
class PriorAdjust(Algorithm):
    """FedAvg whose clients adjust their logits by tau (log p_local - log p_global), with the global
    label prior the server sends."""

    @dataclass
    class Options:
        tau: float = opt(1.0, "strength of the logit adjustment", min=0)

    Server = PriorServer
    Client = PriorClient

    def messages(self):
        c = self.setup.num_classes
        return super().messages().extend(down={"log_prior": (c,)}, up={"label_counts": summed(c)})

    def inputs(self):
        c = (self.setup.num_classes,)
        return Inputs(round={"log_prior": c}, client={"local_log_prior": c})
