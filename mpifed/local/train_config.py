"""The settings a client's local training reads: the config's ``train:`` section.

It lives with the local computation that reads it (the optimisers, the learning-rate schedule,
the local steps), below the method roles and the config that build it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mpifed.plugin.options import opt


@dataclass
class TrainConfig:
    rounds: int = opt(30, "communication rounds", min=1, math=False)
    participation: float = opt(1.0, "fraction of clients sampled each round", min=0, max=1, exclusive_min=True)
    local_epochs: int = opt(2, "local epochs per client per round (unused with train.local_steps)", min=1)
    local_steps: int = opt(0, "local steps (mini-batches) per client per round instead of epochs, the same for every "
                              "client: it passes over its data, reshuffled each pass, until it has taken them. The "
                              "papers state their local work as E x n_k / B steps; 0: train.local_epochs epochs",
                           min=0)
    batch_size: int = opt(32, "local mini-batch size", min=1)
    optimizer: Literal["sgd", "adam", "adamw"] = opt("sgd", "local optimiser, rebuilt for every client every round: "
                                                            "SGD (with momentum), Adam (L2 weight decay) or AdamW "
                                                            "(decoupled weight decay)")
    lr: float = opt(0.05, "local learning rate in round 1", min=0, exclusive_min=True)
    lr_schedule: Literal["exponential", "step", "cosine"] = opt(
        "exponential", "learning rate per round: lr * lr_decay^r (exponential), lr * lr_step_factor^(r // "
                       "lr_step_rounds) (step), or cosine from lr down to lr_min over train.rounds")
    lr_decay: float = opt(1.0, "exponential schedule: learning rate multiplied by this once per round (FedNTD: 0.99)",
                          min=0, max=1, exclusive_min=True)
    lr_step_rounds: int = opt(50, "step schedule: rounds between learning-rate drops", min=1)
    lr_step_factor: float = opt(0.1, "step schedule: factor of each drop", min=0, max=1, exclusive_min=True)
    lr_min: float = opt(0.0, "cosine schedule: the learning rate after the last round", min=0)
    momentum: float = opt(0.9, "SGD momentum (local; reset for every client every round)", min=0, max=1)
    adam_beta1: float = opt(0.9, "Adam/AdamW beta1", min=0, max=1)
    adam_beta2: float = opt(0.999, "Adam/AdamW beta2", min=0, max=1)
    adam_eps: float = opt(1e-8, "Adam/AdamW epsilon", min=0, exclusive_min=True)
    weight_decay: float = opt(0.0, "weight decay (SGD and Adam: L2 term in the gradient; AdamW: decoupled)", min=0)
    grad_clip: float = opt(0.0, "clip the local gradient to this norm (0: off; FedGKD clips at 10)", min=0)
    client_weights: Literal["samples", "uniform"] = opt("samples", "weight of each client in the server's average: its "
                                                                   "sample count n_k (the papers' n_k/n) or uniform "
                                                                   "(FedGKD's official code)")
    eval_batch_size: int = opt(500, "batch size of test-set evaluation", min=1, math=False)

    def check(self) -> list[str]:
        if self.lr_schedule == "cosine" and self.lr_min > self.lr:
            return [f"lr_min ({self.lr_min}) must not exceed lr ({self.lr})"]
        return []
