"""Local optimisers on a :class:`~mpifed.local.flat.FlatModel`, and the per-round learning rate.

Each update is a few vector operations on the flat parameter vector: one kernel per
operation for the whole model instead of one per parameter, and no ``torch.optim``
import (it loads torch._dynamo on first use, over a second per process). The arithmetic
is ``torch.optim``'s:

* SGD (dampening 0, no Nesterov): d = g + wd * w; b = d on the first step, else
  b = momentum * b + d; w -= lr * b.
* Adam: g += wd * w (L2); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
  w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
* AdamW: as Adam without the L2 term, and w *= 1 - lr * wd before the step (decoupled).

The optimiser is built afresh for every client in every round (the papers reset local
optimiser state each round), so its state never crosses rounds or clients. With
``resources.cuda_graphs`` a worker keeps one *capturable* optimiser instead (:class:`GraphSGD`,
:class:`GraphAdam`): the same updates with every piece of state, the learning rate and Adam's
step count included, in tensors allocated once and reset for each client, so that one captured
graph serves every client and round. Its results equal the eager optimiser's up to float32
rounding (the learning rate multiplies as a tensor instead of scaling inside one kernel).
"""
from __future__ import annotations

import math
from typing import Protocol

import torch

from mpifed.local.flat import FlatModel
from mpifed.local.train_config import TrainConfig


class FlatOptimizer(Protocol):
    flat: FlatModel

    def zero_grad(self) -> None: ...
    def clip_grad_norm(self, max_norm: float) -> None: ...
    def step(self) -> None: ...


class _Flat:
    def __init__(self, flat: FlatModel, lr: float, weight_decay: float) -> None:
        self.flat = flat
        self.lr = lr
        self.weight_decay = weight_decay

    def zero_grad(self) -> None:
        self.flat.zero_grad()

    def clip_grad_norm(self, max_norm: float) -> None:
        """Scale the gradient to norm at most ``max_norm`` (``nn.utils.clip_grad_norm_``'s rule)."""
        total = torch.linalg.vector_norm(self.flat.grad)
        self.flat.grad.mul_(torch.clamp(max_norm / (total + 1e-6), max=1.0))

    @property
    def params(self) -> torch.Tensor:
        return self.flat.floats[: self.flat.num_params]


class FlatSGD(_Flat):
    def __init__(self, flat: FlatModel, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        super().__init__(flat, lr, weight_decay)
        self.momentum = momentum
        self.buf: torch.Tensor | None = None

    @torch.no_grad()
    def step(self) -> None:
        w = self.params
        d = self.flat.grad
        if self.weight_decay:
            d = d.add(w, alpha=self.weight_decay)
        if self.momentum:
            if self.buf is None:
                self.buf = d.clone()
            else:
                self.buf.mul_(self.momentum).add_(d)
            d = self.buf
        w.add_(d, alpha=-self.lr)


class FlatAdam(_Flat):
    """Adam (AdamW with ``decoupled``) on the flat model, its learning rate and step count Python numbers."""

    def __init__(self, flat: FlatModel, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 decoupled: bool) -> None:
        super().__init__(flat, lr, weight_decay)
        self.b1, self.b2 = betas
        self.eps = eps
        self.decoupled = decoupled
        self.t: int | torch.Tensor = 0
        self.m = torch.zeros_like(flat.grad)
        self.v = torch.zeros_like(flat.grad)

    @property
    def rate(self) -> float | torch.Tensor:
        """The learning rate the update reads."""
        return self.lr

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update, the same arithmetic whether the learning rate and t are Python numbers (eager) or
        0-d tensors (:class:`GraphAdam`: t in float64, as Python's arithmetic)."""
        w, g, lr = self.params, self.flat.grad, self.rate
        if self.weight_decay and self.decoupled:
            w.mul_(1 - lr * self.weight_decay)
        elif self.weight_decay:
            g = g.add(w, alpha=self.weight_decay)
        self.t += 1
        self.m.mul_(self.b1).add_(g, alpha=1 - self.b1)
        self.v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
        correction2 = 1 - self.b2 ** self.t
        denom = (self.v.sqrt() / (torch.sqrt(correction2).float() if isinstance(correction2, torch.Tensor)
                                  else math.sqrt(correction2))).add_(self.eps)
        size = lr / (1 - self.b1 ** self.t)
        if isinstance(size, torch.Tensor):
            w.sub_(self.m / denom * size.float())
        else:
            w.addcdiv_(self.m, denom, value=-size)


class GraphSGD(_Flat):
    """:class:`FlatSGD` with its state at fixed addresses (for a captured step); :meth:`reset` starts a
    client. The momentum buffer starts at zero, so the first step's b = momentum * 0 + d is FlatSGD's b = d."""

    def __init__(self, flat: FlatModel, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        super().__init__(flat, 0.0, weight_decay)
        self.momentum = momentum
        self.lr_t = torch.zeros((), device=flat.grad.device)
        self.buf = torch.zeros_like(flat.grad) if momentum else None

    def reset(self, lr: float) -> None:
        self.lr = lr
        self.lr_t.fill_(lr)
        if self.buf is not None:
            self.buf.zero_()

    @torch.no_grad()
    def step(self) -> None:
        w = self.params
        d = self.flat.grad
        if self.weight_decay:
            d = d.add(w, alpha=self.weight_decay)
        if self.buf is not None:
            self.buf.mul_(self.momentum).add_(d)
            d = self.buf
        w.sub_(d * self.lr_t)


class GraphAdam(FlatAdam):
    """:class:`FlatAdam` with its state, the learning rate and the step count t included, at fixed addresses
    (for a captured step); :meth:`reset` starts a client."""

    def __init__(self, flat: FlatModel, betas: tuple[float, float], eps: float, weight_decay: float,
                 decoupled: bool) -> None:
        super().__init__(flat, 0.0, betas, eps, weight_decay, decoupled)
        self.lr_t = torch.zeros((), device=flat.grad.device)
        self.t = torch.zeros((), dtype=torch.float64, device=flat.grad.device)   # float64, as FlatAdam's Python t

    @property
    def rate(self) -> torch.Tensor:
        return self.lr_t

    def reset(self, lr: float) -> None:
        self.lr = lr
        self.lr_t.fill_(lr)
        self.t.zero_()
        self.m.zero_()
        self.v.zero_()


def make_optimizer(flat: FlatModel, lr: float, cfg: TrainConfig, capturable: bool = False) -> FlatOptimizer:
    """A fresh local optimiser of kind ``cfg.optimizer`` at learning rate ``lr``; ``capturable``: its
    :class:`GraphSGD` or :class:`GraphAdam` form."""
    betas = (cfg.adam_beta1, cfg.adam_beta2)
    if capturable:
        opt: GraphSGD | GraphAdam = (GraphSGD(flat, cfg.momentum, cfg.weight_decay) if cfg.optimizer == "sgd" else
                                     GraphAdam(flat, betas, cfg.adam_eps, cfg.weight_decay, cfg.optimizer == "adamw"))
        opt.reset(lr)
        return opt
    if cfg.optimizer == "sgd":
        return FlatSGD(flat, lr, cfg.momentum, cfg.weight_decay)
    return FlatAdam(flat, lr, betas, cfg.adam_eps, cfg.weight_decay, decoupled=cfg.optimizer == "adamw")


def round_lr(cfg: TrainConfig, rnd: int) -> float:
    """The local learning rate in round ``rnd`` (0-based) under ``cfg.lr_schedule``."""
    if cfg.lr_schedule == "exponential":
        return cfg.lr * cfg.lr_decay ** rnd
    if cfg.lr_schedule == "step":
        return cfg.lr * cfg.lr_step_factor ** (rnd // cfg.lr_step_rounds)
    return cfg.lr_min + (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * rnd / cfg.rounds)) / 2
