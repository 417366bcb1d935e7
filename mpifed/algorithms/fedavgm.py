"""FedAvgM (Hsu et al., 2019): server momentum on the averaged update."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mpifed.algorithms.base import Algorithm, Server, Switches
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


class FedAvgMServer(Server):
    """v <- beta v + d (w - avg_k w_k), d = 1 or (dampened) 1 - beta;  w <- w - server_lr v; the
    float buffers (BatchNorm statistics) go through the momentum too, or take the clients' average."""

    state = ("velocity",)

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        self.velocity: torch.Tensor | None = None

    def aggregate(self, server_round, weights, replies):
        average = super().aggregate(server_round, weights, replies)
        n = self.setup.num_params if self.options.buffers == "average" else len(weights)
        step = weights[:n] - average[:n]
        if self.options.dampening:
            step = (1 - self.options.beta) * step
        self.velocity = step if self.velocity is None else self.options.beta * self.velocity + step
        new = average.clone()
        new[:n] = weights[:n] - self.options.server_lr * self.velocity
        return new


@ALGORITHMS.register("fedavgm")
class FedAvgM(Algorithm):
    """FedAvgM (Hsu et al., 2019): FedAvg with server momentum ``beta`` on the averaged update and a
    server learning rate.

    The pseudo-gradient is Delta = w - avg_k w_k (the FedAvg average of the round's models) and
    the server steps w <- w - server_lr v with, by default, Hsu et al.'s undampened momentum
    v <- beta v + Delta (v = Delta in round 1). ``dampening: true`` uses
    v <- beta v + (1 - beta) Delta from v = 0, as MOON's code does for FedAvg with
    ``--server_momentum`` (QinbinLi/MOON ``main.py``, the ``args.server_momentum`` branches of its
    round loops; server lr 1), the code whose structure FedCSD's ``train_ours.py`` follows: its
    first step is (1 - beta) Delta, a tenth of FedAvg's at beta = 0.9, and in a steady state the
    step is Delta's size instead of 1 / (1 - beta) times it. ``buffers`` says what happens to the
    float buffers (BatchNorm's running mean and variance): ``momentum`` (default, as MOON's code,
    which loops over every state-dict entry) puts them through the same momentum as the
    parameters, ``average`` gives them the clients' plain average, as FedAvg. Integer buffers
    (BatchNorm's counters) are always averaged.
    """

    @dataclass
    class Options:
        beta: float = opt(0.9, "server momentum (FedNTD's code uses 0.7)", min=0, max=1)
        server_lr: float = opt(1.0, "server learning rate", min=0, exclusive_min=True)
        dampening: bool = opt(False, "v <- beta v + (1 - beta) Delta from v = 0 (MOON's code) instead of v <- beta v + "
                                     "Delta")
        buffers: Literal["momentum", "average"] = opt(
            "momentum", "float buffers (BatchNorm statistics): through the momentum as the parameters (MOON's code), "
                        "or the clients' plain average")

    Server = FedAvgMServer
    own_server_step = "server momentum beta with server_lr"
    switches = Switches(on=("algorithm.beta=0.9",), off=("algorithm.beta=0", "algorithm.server_lr=1"))
