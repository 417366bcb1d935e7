"""A frozen copy of the network for inference (evaluation, distillation teachers).

On the CPU, convolutional networks run about twice as fast in the channels-last layout
(oneDNN's kernels), but the weights must be stored that way, which the flat training
state cannot do. A network that only infers for a whole round can be copied into that
layout once per round instead. Results equal the training model's up to floating-point
rounding; they are deterministic.
"""
from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from mpifed.local.flat import FlatModel


class InferenceCopy:
    """``load_from(flat)`` once per round, then call it like the network (no gradients)."""

    def __init__(self, flat: FlatModel) -> None:
        self.net = copy.deepcopy(flat.model)
        for p in self.net.parameters():
            p.requires_grad_(False)
        device = flat.floats.device
        self.channels_last = device.type == "cpu" and any(isinstance(m, nn.Conv2d) for m in self.net.modules())
        if self.channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self._targets = list(self.net.parameters()) + list(self.net.buffers())

    def load_from(self, flat: FlatModel) -> None:
        with torch.no_grad():
            for target, source in zip(self._targets, list(flat.model.parameters()) + list(flat.model.buffers())):
                target.copy_(source)

    def _layout(self, x: Any) -> Any:
        if self.channels_last and isinstance(x, torch.Tensor) and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def __call__(self, x: Any, train_mode: bool = False) -> torch.Tensor:
        """The logits for inputs ``x``."""
        # inference mode skips autograd's bookkeeping; the clone makes the result an ordinary
        # tensor that a loss may use
        with torch.inference_mode():
            out = self.net.train(train_mode)(self._layout(x))
        return out.clone()

    def outputs(self, x: Any, train_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(features, logits) for inputs ``x``."""
        with torch.inference_mode():
            net = self.net.train(train_mode)
            z = net.features(self._layout(x))
            logits = net.head(z)
        return z.clone(), logits.clone()
