"""Aggregation (``aggregation:``): synchronous rounds, or an asynchronous server's update rule on the
virtual clock (the event queue of :mod:`mpifed.federation.events`).

* ``sync``: today's rounds (the default, bit for bit);
* ``fedbuff``: FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous
  Aggregation", AISTATS 2022, Algorithm 1). ``concurrency`` clients train at once; each arriving
  update Delta_i = y_i - x_{tau_i} (the client's model less the version it started from) is
  weighted by the staleness function and added to a buffer in event order; once ``buffer`` (K)
  updates are in, the server takes the step from x_t with the buffered update
  Delta = (1/K) sum_i s(t - tau_i) Delta_i, through the server optimiser (sgd at lr 1:
  x_{t+1} = x_t + Delta, the paper's server learning rate eta_g = 1). The paper scales updates by
  1/sqrt(1 + staleness): ``polynomial`` with a = 0.5, the default here;
* ``fedasync``: FedAsync (Xie, Koyejo and Gupta, "Asynchronous Federated Optimization", 2019,
  Algorithm 1 and its Section 4): each arriving model x_new is mixed in at once,
  x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new with alpha_t = alpha s(t - tau), through the server
  optimiser (sgd at lr 1: that mixture itself). Its staleness functions (Section 4):
  constant s = 1; polynomial s_a(t - tau) = (t - tau + 1)^(-a); hinge s_{a,b}(t - tau) = 1 if
  t - tau <= b, else 1 / (a (t - tau - b) + 1). Defaults alpha 0.6, polynomial a 0.5, hinge a 10 and
  b 4 are those of the paper's experiments as remembered (no copy of either paper was at hand
  when this was written); FedAsync's proximal term on the client is FedProx's (``algorithm: fedprox``).

Both drop an update whose staleness (server versions since its client started) exceeds
``max_staleness``: FedBuff's paper drops none and FedAsync's bounds staleness in its simulation
(4 or 16); here the bound also caps the model versions the server keeps for the clients in flight
at ``max_staleness + 1``. Updates are equally weighted (FedBuff's Algorithm 1), not by samples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from mpifed.plugin.options import NoOptions, opt
from mpifed.plugin.registry import AGGREGATIONS

__all__ = ["AGGREGATIONS", "AsyncRule", "FedAsync", "FedBuff", "Sync", "staleness_weight"]

Staleness = Literal["constant", "polynomial", "hinge"]


def staleness_weight(function: str, staleness: int, a: float, b: float) -> float:
    """s(staleness) (Xie et al., Section 4): ``constant`` 1; ``polynomial`` (staleness + 1)^(-a);
    ``hinge`` 1 up to b, then 1 / (a (staleness - b) + 1)."""
    if staleness < 0:
        raise ValueError(f"staleness {staleness}: a client cannot start from a version newer than the server's")
    if function == "constant":
        return 1.0
    if function == "polynomial":
        return float((staleness + 1) ** (-a))
    if function == "hinge":
        return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)
    raise ValueError(f"unknown staleness function {function!r}; choose constant, polynomial or hinge")


class Aggregation:
    """How the server aggregates: synchronous rounds unless ``asynchronous``."""

    Options: ClassVar[type] = NoOptions
    asynchronous: ClassVar[bool] = False

    def __init__(self, options: Any) -> None:
        self.options = options


@AGGREGATIONS.register("sync")
class Sync(Aggregation):
    """Synchronous rounds: every round's clients start from the same global model (today's, bit for bit)."""


class AsyncRule(Aggregation):
    """An asynchronous server's update rule: ``take`` client updates per server step, and the aggregate
    the server optimiser steps towards."""

    asynchronous = True

    @property
    def take(self) -> int:
        """Client updates one server step takes."""
        return 1

    def aggregate(self, x: torch.Tensor, starts: list[torch.Tensor], models: list[torch.Tensor],
                  staleness: list[int]) -> torch.Tensor:
        """The aggregate from the current model ``x`` and the updates one server step takes, in event order:
        each client's model, the model it started from, and its staleness."""
        raise NotImplementedError

    @classmethod
    def check_config(cls, cfg: Any) -> list[str]:
        """What the rest of the configuration must be for an asynchronous server, each message naming the fix (the
        method's own declaration is checked with the other methods' in :mod:`mpifed.settings.validate`)."""
        name, errors = cfg.aggregation.name, []
        if not cfg.system.clock:
            errors.append(f"aggregation: {name} orders its events on the virtual clock, which is off; set "
                          f"system.clock=true")
        concurrency = cfg.aggregation.options.concurrency
        if concurrency > cfg.data.num_clients:
            errors.append(f"aggregation.concurrency: {concurrency} clients cannot train at once among "
                          f"data.num_clients={cfg.data.num_clients}; set it to at most {cfg.data.num_clients}")
        rounds = [f"{key} ({value})" for key, value, off in (
            ("system.deadline", cfg.system.deadline, 0.0), ("system.overcommit", cfg.system.overcommit, 1.0),
            ("system.local_work", cfg.system.local_work, "fixed"), ("selection", cfg.selection.name, "uniform"))
            if value != off]
        if rounds:
            errors.append(f"aggregation: {name} has no rounds, so {', '.join(rounds)} has no meaning (a free "
                          f"slot takes a uniform keyed draw of the available clients, each with its full local "
                          f"work); leave them at their defaults, or set aggregation=sync")
        return errors


@dataclass
class _Staleness:
    staleness: Staleness = opt("polynomial", "staleness function s: constant, polynomial (t - tau + 1)^-a, or hinge "
                                             "(1 up to b, then 1 / (a (t - tau - b) + 1))")
    a: float = opt(0.5, "polynomial: exponent a; hinge: slope a (polynomial 0.5 is FedBuff's 1/sqrt(1 + staleness); "
                        "Xie et al.'s hinge takes a = 10)", min=0)
    b: float = opt(4.0, "hinge: the staleness up to which s = 1 (Xie et al.'s 4)", min=0)
    idle_wait: float = opt(60.0, "simulated seconds the server waits before it looks again when no client is "
                                 "available and none is training", min=0, exclusive_min=True)


@AGGREGATIONS.register("fedbuff")
class FedBuff(AsyncRule):
    """FedBuff: a server step each time ``buffer`` updates have arrived (Nguyen et al., 2022)."""

    @dataclass
    class Options(_Staleness):
        buffer: int = opt(10, "K: client updates per server step (the paper's K = 10)", min=1)
        concurrency: int = opt(100, "clients training at once (the paper's experiments, as remembered: 100 and "
                                    "more); at most data.num_clients", min=1)
        max_staleness: int = opt(20, "drop an update that started more than this many server versions ago "
                                     "(mpifed's bound: the paper drops none)", min=0)


    @property
    def take(self) -> int:
        return int(self.options.buffer)

    def aggregate(self, x: torch.Tensor, starts: list[torch.Tensor], models: list[torch.Tensor],
                  staleness: list[int]) -> torch.Tensor:
        """x + (1/K) sum_i s(tau_i) (y_i - x_{tau_i}), summed in event order in float64."""
        o = self.options
        total = torch.zeros_like(x, dtype=torch.float64)
        for start, model, s in zip(starts, models, staleness):
            total += staleness_weight(o.staleness, s, o.a, o.b) * (model.double() - start.double())
        return (x.double() + total / len(models)).to(x.dtype)


@AGGREGATIONS.register("fedasync")
class FedAsync(AsyncRule):
    """FedAsync: each arriving model mixed in, x <- (1 - a_s) x + a_s x_new (Xie et al., 2019)."""

    @dataclass
    class Options(_Staleness):
        alpha: float = opt(0.6, "mixing weight alpha, a_s = alpha s(staleness) (the paper's experiments: 0.6)",
                           min=0, max=1, exclusive_min=True)
        concurrency: int = opt(10, "clients training at once; at most data.num_clients", min=1)
        max_staleness: int = opt(16, "drop a model that started more than this many server versions ago (the paper's "
                                     "simulations bound staleness by 4 or 16)", min=0)


    def aggregate(self, x: torch.Tensor, starts: list[torch.Tensor], models: list[torch.Tensor],
                  staleness: list[int]) -> torch.Tensor:
        """(1 - a_s) x + a_s x_new, a_s = alpha s(staleness), in float64."""
        o = self.options
        if len(models) != 1:
            raise ValueError(f"FedAsync mixes one model per server step, got {len(models)}")
        mix = o.alpha * staleness_weight(o.staleness, staleness[0], o.a, o.b)
        return ((1 - mix) * x.double() + mix * models[0].double()).to(x.dtype)
