"""A loss-only method: FedAvg with label smoothing whose strength decays over the rounds.

The client role changes the local objective and nothing else: the server averages as FedAvg
does. What the loss reads per round (the smoothing) is a declared input, set in round_start.

    mpifed run --plugin examples/loss_only.py --set algorithm.name=smooth_decay
    mpifed check-method examples/loss_only.py
"""
from dataclasses import dataclass

import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm, Client, Inputs
from mpifed.options import opt
from mpifed.registry import ALGORITHMS


class SmoothDecayClient(Client):
    def round_start(self, server_round, down):
        self.inputs.smoothing = self.options.smoothing * self.options.decay ** (server_round - 1)

    def loss(self, ctx, batch, out):
        return F.cross_entropy(out.logits, batch.y, label_smoothing=self.inputs.smoothing)


@ALGORITHMS.register("smooth_decay")
class SmoothDecay(Algorithm):
    """FedAvg with label smoothing s * decay^(round - 1)."""

    @dataclass
    class Options:
        smoothing: float = opt(0.2, "label smoothing in round 1", min=0, max=1)
        decay: float = opt(0.9, "factor per round", min=0, max=1)

    Client = SmoothDecayClient

    def inputs(self):
        return Inputs(round={"smoothing": float})     # a Python float: F.cross_entropy takes a number
