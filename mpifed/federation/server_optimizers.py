"""Server optimisers (``server_optimizer:``): the step the server takes from the global model x_t
towards the round's aggregate, the FedOpt family of Reddi et al., "Adaptive Federated
Optimization" (ICLR 2021), Algorithm 2.

With Delta_t = aggregate - x_t (the round's mean client update, as the method's aggregation
weighs it), over the model's parameters:

* ``sgd``: x_{t+1} = x_t + lr Delta_t; at lr 1 the aggregate itself (FedAvg, bit for bit);
* ``sgdm``: v_t = beta v_{t-1} + (x_t - aggregate) (v_0 = the first pseudo-gradient),
  x_{t+1} = x_t - lr v_t: FedAvgM (Hsu et al., 2019) with its undampened momentum, the same
  arithmetic as ``fedavgm`` with ``buffers: average`` (bit for bit);
* ``adagrad``, ``adam``, ``yogi``: m_t = beta1 m_{t-1} + (1 - beta1) Delta_t, and
  v_t = v_{t-1} + Delta_t^2 (Adagrad), beta2 v_{t-1} + (1 - beta2) Delta_t^2 (Adam),
  v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2) (Yogi);
  x_{t+1} = x_t + lr m_t / (sqrt(v_t) + tau), from m_{-1} = 0 and v_{-1} = tau^2 (the paper's
  "v_{-1} >= tau^2"). No bias correction, as Algorithm 2 writes it.

Defaults and where frameworks disagree: beta1 0.9 and beta2 0.99 are the paper's. tau is 1e-3,
the paper's default; Flower's FedAdam takes 1e-9 in one of its APIs and 1e-3 in another, and its
newer FedAdam adds Adam's bias correction, which Algorithm 2 has not. Flower starts v at 0, the
paper at tau^2 or more. FedAvgM's momentum is 0 in Flower's default and 0.9 in FL-bench's; here
0.9, as Hsu et al. (and FedNTD's code uses 0.7 for its own FedAvgM). The server learning rate has
no common default: 1.0 for sgd and sgdm, 0.01 for the adaptive ones (tune it, as the paper did).

BatchNorm's statistics and the integer buffers take the aggregate (they are not parameters);
the optimiser's state (momentum, moments) is part of a checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from mpifed.plugin.options import NoOptions, opt
from mpifed.plugin.registry import SERVER_OPTIMIZERS


class ServerOptimizer:
    """Steps the parameters ``x[:num_params]`` of the global model with the round's aggregate; the
    float buffers after them take the aggregate. ``state``: the attributes a checkpoint keeps;
    ``steps``: the steps taken by this object (the round checks that a method's aggregation took one)."""

    Options: ClassVar[type] = NoOptions
    state: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: Any, num_params: int) -> None:
        self.options = options
        self.num_params = num_params
        self.steps = 0

    @classmethod
    def returns_aggregate(cls, options: Any) -> bool:
        """Whether, with ``options``, every step returns the aggregate itself (then nothing is computed)."""
        return False

    @property
    def identity(self) -> bool:
        """Whether every step returns the aggregate itself (then nothing is computed)."""
        return self.returns_aggregate(self.options)

    def step(self, x: torch.Tensor, aggregate: torch.Tensor) -> torch.Tensor:
        """The new global float state from the current one ``x`` and the round's ``aggregate``."""
        self.steps += 1
        if self.identity:
            return aggregate
        new = aggregate.clone()
        n = self.num_params
        new[:n] = self.update(x[:n], aggregate[:n])
        return new

    def update(self, x: torch.Tensor, aggregate: torch.Tensor) -> torch.Tensor:
        """The new parameters from ``x`` and the aggregate's."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The ``state`` attributes (tensors on the CPU, or None before the first step)."""
        return {name: None if getattr(self, name) is None else getattr(self, name).cpu() for name in self.state}

    def load_state_dict(self, saved: dict[str, Any], device: torch.device | str = "cpu") -> None:
        """Restore what :meth:`state_dict` returned, its tensors on ``device``."""
        for name in self.state:
            setattr(self, name, None if saved[name] is None else saved[name].to(device))


@SERVER_OPTIMIZERS.register("sgd")
class SGD(ServerOptimizer):
    """x <- x + lr (aggregate - x); lr 1: the aggregate itself, today's FedAvg."""

    @dataclass
    class Options:
        lr: float = opt(1.0, "server learning rate (1: the aggregate itself)", min=0, exclusive_min=True)

    @classmethod
    def returns_aggregate(cls, options: Any) -> bool:
        return options.lr == 1.0

    def update(self, x: torch.Tensor, aggregate: torch.Tensor) -> torch.Tensor:
        return x - self.options.lr * (x - aggregate)


@SERVER_OPTIMIZERS.register("sgdm")
class SGDM(ServerOptimizer):
    """FedAvgM's server momentum: v <- beta v + (x - aggregate), x <- x - lr v."""

    @dataclass
    class Options:
        lr: float = opt(1.0, "server learning rate", min=0, exclusive_min=True)
        momentum: float = opt(0.9, "server momentum beta (Hsu et al.'s 0.9, as FL-bench; frameworks disagree: Flower's "
                                   "FedAvgM defaults to 0, FedNTD's code uses 0.7)", min=0, max=1)

    state = ("velocity",)

    def __init__(self, options: Any, num_params: int) -> None:
        super().__init__(options, num_params)
        self.velocity: torch.Tensor | None = None

    def update(self, x: torch.Tensor, aggregate: torch.Tensor) -> torch.Tensor:
        step = x - aggregate
        self.velocity = step if self.velocity is None else self.options.momentum * self.velocity + step
        return x - self.options.lr * self.velocity


@dataclass
class AdaptiveOptions:
    lr: float = opt(0.01, "server learning rate eta (the paper tunes it per task)", min=0, exclusive_min=True)
    beta1: float = opt(0.9, "first-moment decay (the paper's 0.9)", min=0, max=1)
    beta2: float = opt(0.99, "second-moment decay (the paper's 0.99; unused by adagrad)", min=0, max=1)
    tau: float = opt(1e-3, "adaptivity tau: added to sqrt(v), and v starts at tau^2 (the paper's 1e-3; frameworks "
                           "disagree: Flower's FedAdam takes 1e-9 in one API and 1e-3 in another)", min=0,
                     exclusive_min=True)


class Adaptive(ServerOptimizer):
    """Reddi et al.'s Algorithm 2: x <- x + lr m / (sqrt(v) + tau), each variant its own v."""

    Options = AdaptiveOptions
    state = ("m", "v")

    def __init__(self, options: Any, num_params: int) -> None:
        super().__init__(options, num_params)
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, x: torch.Tensor, aggregate: torch.Tensor) -> torch.Tensor:
        o = self.options
        delta = aggregate - x
        if self.m is None:
            self.m = torch.zeros_like(delta)
            self.v = torch.full_like(delta, o.tau ** 2)
        self.m = o.beta1 * self.m + (1 - o.beta1) * delta
        self.v = self.second_moment(self.v, delta * delta)
        return x + o.lr * self.m / (self.v.sqrt() + o.tau)

    def second_moment(self, v: torch.Tensor, squared: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@SERVER_OPTIMIZERS.register("adagrad")
class Adagrad(Adaptive):
    """FedAdagrad: v <- v + Delta^2."""

    def second_moment(self, v: torch.Tensor, squared: torch.Tensor) -> torch.Tensor:
        return v + squared


@SERVER_OPTIMIZERS.register("adam")
class Adam(Adaptive):
    """FedAdam: v <- beta2 v + (1 - beta2) Delta^2."""

    def second_moment(self, v: torch.Tensor, squared: torch.Tensor) -> torch.Tensor:
        return self.options.beta2 * v + (1 - self.options.beta2) * squared


@SERVER_OPTIMIZERS.register("yogi")
class Yogi(Adaptive):
    """FedYogi: v <- v - (1 - beta2) Delta^2 sign(v - Delta^2)."""

    def second_moment(self, v: torch.Tensor, squared: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.options.beta2) * squared * torch.sign(v - squared)
