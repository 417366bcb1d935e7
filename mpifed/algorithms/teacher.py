"""A frozen copy of the network that distillation methods query for soft labels."""
from __future__ import annotations

import torch

from mpifed.algorithms.base import Setup


class Teacher:
    """Loaded once per round; ``logits`` runs without gradients, in eval mode unless told otherwise."""

    def __init__(self, setup: Setup, train_mode: bool = False) -> None:
        self.flat = setup.new_model()
        for p in self.flat.model.parameters():
            p.requires_grad_(False)
        self.train_mode = train_mode

    def load(self, floats: torch.Tensor, ints: torch.Tensor | None = None) -> None:
        self.flat.load(floats, ints)

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.flat.model.train(self.train_mode)(x)
