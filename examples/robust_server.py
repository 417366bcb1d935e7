"""A server that aggregates differently: the coordinate-wise trimmed mean of the client models
(Yin et al., ICML 2018), robust to a few clients far from the rest.

FedAvg's clients send weighted sums (summed in one Reduce); a trimmed mean needs every client's
model, so this method declares its uplink per client (one row per client, gathered to the
server) and replaces the server's aggregate.

    mpifed run --plugin examples/robust_server.py --set algorithm.name=trimmed_mean
"""
import math
from dataclasses import dataclass

import torch

from mpifed.algorithms.base import Algorithm, Client, Messages, Server, per_client
from mpifed.options import opt
from mpifed.registry import ALGORITHMS


def trimmed_mean(rows: torch.Tensor, trim: float) -> torch.Tensor:
    """The mean over rows of each column after dropping its floor(trim * n) lowest and highest values."""
    cut = math.floor(trim * rows.shape[0])
    ordered = rows.sort(dim=0).values
    return ordered[cut:rows.shape[0] - cut].mean(dim=0)


class TrimmedMeanServer(Server):
    def aggregate(self, server_round, weights, replies):
        # the run's server_optimizer steps from the global model to this aggregate (sgd at lr 1: the aggregate)
        return self.server_step(weights, trimmed_mean(replies.rows.model.double(), self.options.trim).to(torch.float32))


class ModelRowClient(Client):
    def uplink(self, ctx):
        return {"model": ctx.flat.floats.clone()}


@ALGORITHMS.register("trimmed_mean")
class TrimmedMean(Algorithm):
    """The coordinate-wise trimmed mean of the round's client models (trim 0: their plain mean)."""

    @dataclass
    class Options:
        trim: float = opt(0.1, "share of clients dropped at each end, per coordinate", min=0, max=0.49)

    Server = TrimmedMeanServer
    Client = ModelRowClient

    def messages(self):
        return Messages(up={"model": per_client(self.setup.num_floats)})
