"""FedAvgM (Hsu et al., 2019): server momentum on the averaged update."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mpifed.algorithms.base import Algorithm, Server
from mpifed.options import opt
from mpifed.registry import ALGORITHMS


class FedAvgMServer(Server):
    """v <- beta * v + (w - avg_k w_k);  w <- w - server_lr * v  (on parameters and float buffers)."""

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        self.velocity: torch.Tensor | None = None

    def aggregate(self, rnd, weights, replies):
        pseudo_grad = weights - super().aggregate(rnd, weights, replies)
        self.velocity = pseudo_grad if self.velocity is None else self.options.beta * self.velocity + pseudo_grad
        return weights - self.options.server_lr * self.velocity

    def state_dict(self) -> dict[str, Any]:
        return {"velocity": None if self.velocity is None else self.velocity.cpu()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        v = state["velocity"]
        self.velocity = None if v is None else v.to(self.setup.device)


@ALGORITHMS.register("fedavgm")
class FedAvgM(Algorithm):
    """FedAvgM (Hsu et al., 2019): FedAvg with server momentum ``beta`` on the averaged update and a
    server learning rate."""

    @dataclass
    class Options:
        beta: float = opt(0.9, "server momentum (FedNTD's code uses 0.7)", min=0, max=1)
        server_lr: float = opt(1.0, "server learning rate", min=0, exclusive_min=True)

    Server = FedAvgMServer
