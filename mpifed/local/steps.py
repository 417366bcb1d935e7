"""How a worker runs its clients' local steps: eagerly, in another precision, or as replayed CUDA graphs.

``resources.precision`` sets the arithmetic of the forward pass and the loss:

* ``fp32`` (default): PyTorch's defaults, the numbers of every earlier mpifed run. Matmuls
  are float32; on GPUs that have TF32 (Ampere and later), cuDNN convolutions use it, as
  PyTorch allows by default.
* ``tf32``: CUDA matmuls in TF32 as well (10-bit mantissa inputs, float32 accumulation);
  process-wide on the worker's rank, so its evaluation too. No effect on the CPU.
* ``bf16``: forward pass and loss under bfloat16 autocast (softmax, losses and norms stay
  float32, as autocast decides); weights, gradients and the optimiser stay float32.
  Evaluation stays float32.

``resources.cuda_graphs`` captures a worker's full-batch step (forward, loss, backward,
clipping, update: :meth:`~mpifed.algorithms.base.Client.step`) as a CUDA graph once per
method state and batch shape, after a few eager warm-up steps, and replays it for every
later full batch: one launch instead of hundreds. The last, smaller batch of an epoch runs
eagerly. A graph reads and writes fixed addresses, so in this mode the optimiser's state
(learning rate, momentum, Adam's moments and step count) lives in tensors allocated once
per worker and reset for each client (:func:`~mpifed.local.optim.make_optimizer`'s
``capturable``), the round's downlink tensors are copied into fixed buffers, and teachers
compute their outputs batch by batch inside the graph instead of caching them per client.

What a step reads besides the batch and the model is declared, so capture is correct by
construction: a method's per-round and per-client values are its declared inputs
(:class:`~mpifed.algorithms.inputs.Inputs`), tensors written in place into buffers that never
move, and its Python-valued inputs (a flag, a count) select one graph per value. The step of a
capturable role sees the client's context through a
:class:`~mpifed.algorithms.inputs.StepView`, which refuses per-client fields in every mode, and
a built role refuses new attributes. A role that collects per-batch sums, makes its own step,
optimiser or training loop, or sets ``eager`` runs eagerly
(:meth:`~mpifed.algorithms.base.Client.eager_reason`), and says so once.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from typing import Any, Callable, ContextManager, Hashable, Protocol

import torch

from mpifed.local.flat import FlatModel
from mpifed.local.optim import FlatOptimizer, make_optimizer
from mpifed.local.train_config import TrainConfig
from mpifed.plugin.options import ConfigError

WARMUP_STEPS = 3   # eager steps (on a side stream) before a graph is captured, as CUDA graph capture requires


@dataclasses.dataclass
class Batch:
    """One mini-batch: model inputs (augmented, normalised), labels, and the samples' indices."""

    x: Any
    y: torch.Tensor
    index: torch.Tensor


class SteppedClient(Protocol):
    """What :class:`LocalSteps` needs of a method's client role (:class:`~mpifed.algorithms.base.Client`):
    its step, its training settings (``setup.train``), the key of its declared inputs' values
    (``inputs.key()``) and why it runs eagerly, if it does. ``ctx`` (the client's
    :class:`~mpifed.algorithms.base.ClientContext`) is passed through to the step unread."""

    setup: Any
    inputs: Any

    def step(self, ctx: Any, opt: FlatOptimizer, batch: Batch) -> torch.Tensor: ...

    @classmethod
    def eager_reason(cls) -> str: ...


class LocalSteps:
    """One worker's way of running local steps (``resources.precision`` and ``resources.cuda_graphs``);
    the default runs them eagerly in float32."""

    def __init__(self, precision: str = "fp32", graphs: bool = False, log: Callable[[str], None] | None = None) -> None:
        self.precision = precision
        self.graphs = graphs
        self.log = log
        self._captured: dict[Hashable, _Graph] = {}
        self._warm: Counter = Counter()
        self._told: set[str] = set()
        self._optimizer: FlatOptimizer | None = None
        self._pool: Any = None
        self._side: torch.cuda.Stream | None = None

    def autocast(self, device: torch.device) -> ContextManager:
        """Where the forward pass and the loss run: under bfloat16 autocast with ``bf16``."""
        if self.precision != "bf16":
            return contextlib.nullcontext()
        # autocast's cache of cast weights must be off while graphs are captured
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=not self.graphs)

    def optimizer(self, flat: FlatModel, lr: float, cfg: TrainConfig) -> FlatOptimizer:
        """A client's local optimiser: a fresh one, or with graphs the worker's own, reset."""
        if not self.graphs:
            return make_optimizer(flat, lr, cfg)
        if self._optimizer is None or self._optimizer.flat is not flat:
            self._optimizer = make_optimizer(flat, lr, cfg, capturable=True)
        self._optimizer.reset(lr)
        return self._optimizer

    def __call__(self, client: SteppedClient, ctx: Any, opt: FlatOptimizer, batch: Batch) -> torch.Tensor:
        """Run ``client.step`` on ``batch`` (or replay its graph); the batch's loss."""
        if not self.graphs or len(batch.y) != client.setup.train.batch_size:
            return client.step(ctx, opt, batch)
        reason = type(client).eager_reason()
        if reason:
            self._tell(type(client).__name__, f"[mpifed] resources.cuda_graphs: {type(client).__name__}'s local step "
                                              f"is not captured ({reason}); it runs eagerly")
            return client.step(ctx, opt, batch)
        key = (client.inputs.key(), _shapes(batch))
        graph = self._captured.get(key)
        if graph is None:
            if self._warm[key] < WARMUP_STEPS:
                self._warm[key] += 1
                return self._on_side_stream(lambda: client.step(ctx, opt, batch))
            graph = self._captured[key] = self._capture(client, ctx, opt, batch)
            self._tell(f"captured {type(client).__name__} {key[0]}",
                       f"[mpifed] resources.cuda_graphs: {type(client).__name__}'s local step captured "
                       f"(state {key[0]}, batch {key[1]}); replayed from now on")
        return graph.replay(batch)

    def _tell(self, topic: str, text: str) -> None:
        """Log ``text`` the first time ``topic`` comes up."""
        if topic not in self._told:
            self._told.add(topic)
            if self.log is not None:
                self.log(text)

    def _on_side_stream(self, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self._side is None:
            self._side = torch.cuda.Stream()
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            out = run()
        torch.cuda.current_stream().wait_stream(self._side)
        return out

    def _capture(self, client: SteppedClient, ctx: Any, opt: FlatOptimizer, batch: Batch) -> "_Graph":
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        static = dataclasses.replace(batch, x=_clone(batch.x), y=batch.y.clone(), index=batch.index.clone())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            loss = client.step(ctx, opt, static)
        return _Graph(graph, static, loss)


class _Graph:
    """A captured step: its input batch at fixed addresses, and its loss."""

    def __init__(self, graph: torch.cuda.CUDAGraph, batch: Batch, loss: torch.Tensor) -> None:
        self.graph = graph
        self.batch = batch
        self.loss = loss

    def replay(self, batch: Batch) -> torch.Tensor:
        _copy(self.batch.x, batch.x)
        self.batch.y.copy_(batch.y)
        self.batch.index.copy_(batch.index)
        self.graph.replay()
        return self.loss


def _clone(x: Any) -> Any:
    return {k: v.clone() for k, v in x.items()} if isinstance(x, dict) else x.clone()


def _copy(into: Any, x: Any) -> None:
    if isinstance(x, dict):
        for k, v in x.items():
            into[k].copy_(v)
    else:
        into.copy_(x)


def _shapes(batch: Batch) -> tuple:
    x = batch.x
    parts = (sorted((k, tuple(v.shape), v.dtype) for k, v in x.items()) if isinstance(x, dict)
             else [(tuple(x.shape), x.dtype)])
    return tuple(parts) + (tuple(batch.y.shape),)


def make_steps(precision: str, cuda_graphs: str, device: torch.device,
               log: Callable[[str], None] | None = None) -> LocalSteps:
    """A worker's :class:`LocalSteps` for ``resources.precision`` and ``resources.cuda_graphs`` on
    ``device``; sets this process's CUDA matmul precision."""
    if cuda_graphs == "on" and device.type != "cuda":
        raise ConfigError(f"resources.cuda_graphs=on needs the workers on a GPU, but this worker runs on {device}. "
                          f"Use resources.cuda_graphs=auto (graphs on GPUs, eager steps on the CPU) or off")
    if device.type == "cuda":
        torch.backends.cuda.matmul.fp32_precision = "tf32" if precision == "tf32" else "none"
    return LocalSteps(precision, graphs=cuda_graphs != "off" and device.type == "cuda", log=log)
