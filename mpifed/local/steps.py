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

What a step reads besides the batch and the model is declared: a method's per-round and
per-client values are its declared inputs (:class:`~mpifed.algorithms.inputs.Inputs`), tensors
written in place into buffers that never move, and its Python-valued inputs (a flag, a count)
select one graph per value. That the step reads nothing else is proved by behaviour: the first
replay of each graph in every round after the one it was captured in is compared with an eager
step from the same saved model, optimiser and BatchNorm state, and a replay that leaves it stops
the run (:class:`~mpifed.local.trace.StaleCapture`, naming the line that read the value); one
extra step a graph a round. ``mpifed check-method`` does the same on the CPU for every replay
(:mod:`mpifed.local.trace`). A role that collects per-batch sums, makes its own step, optimiser
or training loop, or sets ``eager`` runs eagerly
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
from mpifed.local.trace import (RELATIVE_TOLERANCE, Op, OpRecorder, Snapshot, StaleCapture, TracedStep,
                                first_difference, parted, stale_message)
from mpifed.local.train_config import TrainConfig
from mpifed.plugin.options import ConfigError

WARMUP_STEPS = 3   # eager steps (on a side stream) before a graph is captured, as CUDA graph capture requires
BACKENDS = ("cuda", "trace", "eager")
CHECKS = ("rounds", "every")



def batches_per_epoch(n: Any, batch_size: int) -> Any:
    """The mini-batches of one epoch over ``n`` samples (an int, or an array of them): a trailing single
    sample is dropped where the batch size is larger (BatchNorm cannot train on it)."""
    return -(-n // batch_size) - ((n > 1) & (batch_size > 1) & (n % batch_size == 1))


@dataclasses.dataclass
class Batch:
    """One mini-batch: model inputs (augmented, normalised), labels, and the samples' indices."""

    x: Any
    y: torch.Tensor
    index: torch.Tensor


class SteppedClient(Protocol):
    """What :class:`LocalSteps` needs of a method's client role (:class:`~mpifed.algorithms.base.Client`):
    its step, its training settings (``setup.train``), the key of its declared inputs' values
    (``inputs.key()``) and why it runs eagerly, if it does. Of ``ctx`` (the client's
    :class:`~mpifed.algorithms.base.ClientContext`) it reads the round (``server_round``) and the model
    (``flat``), to check a replay against an eager step."""

    setup: Any
    inputs: Any

    def step(self, ctx: Any, opt: FlatOptimizer, batch: Batch) -> torch.Tensor: ...

    @classmethod
    def eager_reason(cls) -> str: ...

class LocalSteps:
    """One worker's way of running local steps (``resources.precision`` and ``resources.cuda_graphs``);
    the default runs them eagerly in float32.

    ``graphs`` lays the step out for capture (the worker's capturable optimiser, downlink tensors in
    fixed buffers, teachers run per batch); ``backend`` says how a step is captured: ``cuda`` (CUDA
    graphs), ``trace`` (:class:`~mpifed.local.trace.TracedStep`, the CPU stand-in) or ``eager`` (never:
    the eager twin a captured run is compared with). ``check`` says which replays are compared with
    an eager step from the same state (:class:`~mpifed.local.trace.StaleCapture` where they part):
    ``rounds``, the first replay of each graph in each round after the one it was captured in (the
    first replay after capture reads the values capture read, so it would prove nothing); ``every``,
    every replay (``mpifed check-method``).
    """

    def __init__(self, precision: str = "fp32", graphs: bool = False, log: Callable[[str], None] | None = None,
                 backend: str = "cuda", check: str = "rounds") -> None:
        if backend not in BACKENDS or check not in CHECKS:
            raise ValueError(f"LocalSteps: backend {backend!r}, check {check!r}; backend is one of {BACKENDS}, check "
                             f"one of {CHECKS}")
        self.precision = precision
        self.graphs = graphs
        self.log = log
        self.backend = backend
        self.check = check
        self._captured: dict[Hashable, _Graph] = {}
        self._warm: Counter = Counter()
        self._records: dict[Hashable, list[Op]] = {}
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
        if not self.graphs or self.backend == "eager" or len(batch.y) != client.setup.train.batch_size:
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
                return self._warm_up(key, lambda: client.step(ctx, opt, batch))
            graph = self._captured[key] = self._capture(client, ctx, opt, batch)
            graph.record = self._records.pop(key)
            self._tell(f"captured {type(client).__name__} {key[0]}",
                       f"[mpifed] resources.cuda_graphs: {type(client).__name__}'s local step captured "
                       f"(state {key[0]}, batch {key[1]}); replayed from now on")
        if self.check == "every" or ctx.server_round not in (graph.captured, graph.checked):
            return self._checked_replay(graph, client, ctx, opt, batch)
        return graph.replay(batch)

    def _tell(self, topic: str, text: str) -> None:
        """Log ``text`` the first time ``topic`` comes up."""
        if topic not in self._told:
            self._told.add(topic)
            if self.log is not None:
                self.log(text)

    def _warm_up(self, key: Hashable, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        """An eager step before capture; the last one's operations are recorded (what capture will read)."""
        last = self._warm[key] == WARMUP_STEPS
        with OpRecorder(keep=last) as recorder:
            out = run() if self.backend == "trace" else self._on_side_stream(run)
        if last:
            self._records[key] = recorder.ops
        return out

    def _on_side_stream(self, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self._side is None:
            self._side = torch.cuda.Stream()
        self._side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._side):
            out = run()
        torch.cuda.current_stream().wait_stream(self._side)
        return out

    def _capture(self, client: SteppedClient, ctx: Any, opt: FlatOptimizer, batch: Batch) -> "_Graph":
        if self.backend == "trace":
            def step(x: Any, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
                return client.step(ctx, opt, dataclasses.replace(batch, x=x, y=y, index=index))
            traced = TracedStep(step, batch.x, batch.y, batch.index, _changed_by_step(ctx, opt))
            held = _static(batch)
            return _Graph(lambda: traced.replay(held.x, held.y, held.index), held, ctx.server_round)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        static = _static(batch)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            loss = client.step(ctx, opt, static)
        return _Graph(lambda: (graph.replay(), loss)[1], static, ctx.server_round)

    def _checked_replay(self, graph: "_Graph", client: SteppedClient, ctx: Any, opt: FlatOptimizer,
                        batch: Batch) -> torch.Tensor:
        """Replay ``graph`` on ``batch`` after an eager step from the same state (then put back); a replay that
        leaves the eager step is a :class:`StaleCapture` naming the line that read the changed value."""
        saved = Snapshot.of(_changed_by_step(ctx, opt))
        start = ctx.flat.floats.clone()
        with OpRecorder(keep=True) as recorder:
            client.step(ctx, opt, batch)
        eager = ctx.flat.floats.clone()
        saved.restore()
        loss = graph.replay(batch)
        gap = parted(eager, ctx.flat.floats, start)
        if gap > RELATIVE_TOLERANCE[self.backend]:
            raise StaleCapture(stale_message(type(client).__name__, ctx.server_round, graph.captured, gap,
                                             first_difference(graph.record, recorder.ops)))
        graph.checked = ctx.server_round
        return loss


class _Graph:
    """A captured step: its input batch at fixed addresses, how to replay it (returning its loss), the round
    it was captured in, the last round a replay of it was checked, and the operations of the step before it."""

    def __init__(self, run: Callable[[], torch.Tensor], batch: Batch, captured: int) -> None:
        self.run = run
        self.batch = batch
        self.captured = captured
        self.checked = captured
        self.record: list[Op] = []

    def replay(self, batch: Batch) -> torch.Tensor:
        _copy(self.batch.x, batch.x)
        self.batch.y.copy_(batch.y)
        self.batch.index.copy_(batch.index)
        return self.run()


def _static(batch: Batch) -> Batch:
    return dataclasses.replace(batch, x=_clone(batch.x), y=batch.y.clone(), index=batch.index.clone())


def _changed_by_step(ctx: Any, opt: FlatOptimizer) -> list[torch.Tensor]:
    """What a step may change: the model's state (BatchNorm's statistics and counters included), its
    gradient and the optimiser's tensors."""
    flat = ctx.flat
    return [flat.floats, flat.ints, flat.grad, *(v for v in vars(opt).values() if isinstance(v, torch.Tensor))]


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
