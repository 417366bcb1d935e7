"""A CPU stand-in for CUDA graph capture, and what proves a captured step right: its replay against an eager step.

A CUDA graph replays the kernels it recorded, with the addresses and the Python values (a
temperature passed as a float, a flag that chose a branch) that were in force when it was
captured. :class:`TracedStep` does the same on any device: it traces the whole local step once
with ``make_fx(..., tracing_mode="real")`` (the tensors it reads are held by reference, as a
graph holds addresses; every Python value it reads is baked into the graph, as capture bakes it)
and replays the traced graph for later steps, clients and rounds.

A step that reads a value the method did not declare replays it stale. The step runner
(:class:`~mpifed.local.steps.LocalSteps`, with either kind of capture) finds it by behaviour: from
one saved model, optimiser, BatchNorm and random state (:class:`Snapshot`) it runs the step
eagerly, then replays the graph, and :class:`StaleCapture` says where they part
(:func:`stale_message`). The line of the step that read the value is found from what the step's
operations were given (:class:`OpRecorder`): the first operation whose Python constant differs
between the step recorded before capture and the step recorded now (:func:`first_difference`).

A step that reads a tensor's value on the host (``.item()``, ``float(t)``, ``bool(t)``) cannot be
captured at all (a real capture fails; ``make_fx`` would bake the value silently):
:class:`OpRecorder` refuses it as a :class:`HostRead`, naming the line.
"""
from __future__ import annotations

import linecache
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# operations that hand a tensor's value to Python: in a captured step each one would be baked in (or fail)
_HOST_READS = frozenset({"aten::_local_scalar_dense", "aten::is_nonzero", "aten::item", "aten::equal"})
_TORCH = str(Path(torch.__file__).parent)
_RUNNERS = {str(Path(__file__).with_name("steps.py"))}    # the step runner: the frames above it are the round
# how far a replay's update may differ from the eager step's (relative norm): a traced step replays the same CPU
# kernels (it agrees to the bit); a CUDA graph may run kernels whose atomic adds sum in another order
RELATIVE_TOLERANCE = {"trace": 1e-5, "cuda": 1e-3}


class HostRead(RuntimeError):
    """A local step read a tensor's value on the host (``.item()``, ``float(t)``, ``bool(t)``)."""


class StaleCapture(RuntimeError):
    """A captured step's replay left the eager step: it read a value its method does not declare."""


@dataclass(frozen=True)
class Op:
    """One operation of a step: its name, the Python constants it was given, and the lines that called it."""

    name: str
    constants: tuple
    where: tuple[tuple[str, int, str], ...]


def _constants(args: tuple, kwargs: dict) -> tuple:
    flat, _ = tree_flatten((args, kwargs))
    return tuple(("tensor", tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in flat)


def _caller_frames() -> tuple[tuple[str, int, str], ...]:
    """The frames of the step that led to the operation being dispatched, outermost first, as (file, line,
    function): those below the step runner (:mod:`mpifed.local.steps`), outside torch and this module."""
    frames = []
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename not in _RUNNERS:
        name = frame.f_code.co_filename
        if not (name.startswith(_TORCH) or name == __file__):
            frames.append((name, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(reversed(frames))


def lines(frames: tuple[tuple[str, int, str], ...]) -> str:
    """Frames as ``file:line in function: code``, joined by ``->`` (outermost first)."""
    return " -> ".join(f"{name}:{line} in {function}: {linecache.getline(name, line).strip()}"
                       for name, line, function in frames) or "an unknown line"


class OpRecorder(TorchDispatchMode):
    """Inside ``with``: refuses a host read (:class:`HostRead`); with ``keep``, records every operation
    (:class:`Op`) for :func:`first_difference`."""

    def __init__(self, keep: bool = False) -> None:
        super().__init__()
        self.keep = keep
        self.ops: list[Op] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        if name in _HOST_READS:
            raise HostRead(f"the local step reads a tensor's value on the host ({name.split('::')[1]}) at "
                           f"{lines(_caller_frames())}: a captured step cannot (on a GPU capture "
                           f"fails; the value would be fixed at capture). Keep the value a tensor (torch.where instead "
                           f"of if, t * x instead of float(t) * x), or compute it in round_start or begin_client into "
                           f"a declared input")
        if self.keep:
            self.ops.append(Op(name, _constants(args, kwargs), _caller_frames()))
        return func(*args, **kwargs)


def first_difference(before: list[Op], now: list[Op]) -> Op | None:
    """The first operation of ``now`` whose constants differ from ``before``'s at the same place (or
    that is not there at all: the step took another branch); None when the two agree."""
    for old, new in zip(before, now):
        if old.name != new.name or old.constants != new.constants:
            return new
    return now[len(before)] if len(now) > len(before) else None


class TracedStep:
    """A local step traced once and replayed (the CPU stand-in for a CUDA graph): ``step(x, y, index)``
    runs one step and returns its loss. Tracing runs it once, then puts the tensors it ``changed`` back."""

    def __init__(self, step: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor], x: Any, y: torch.Tensor,
                 index: torch.Tensor, changed: list[torch.Tensor]) -> None:
        saved = Snapshot.of(changed)
        with OpRecorder():
            self.graph = make_fx(step, tracing_mode="real")(x, y, index)
        saved.restore()         # as a CUDA graph's capture, tracing leaves the model as it was

    def replay(self, x: Any, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """One step on this batch by the traced graph (the Python values it read are those of the trace)."""
        with torch.no_grad():      # the graph holds the backward pass; autograd would refuse its in-place updates
            return self.graph(x, y, index)


@dataclass
class Snapshot:
    """Copies of the tensors a step changes (model, BatchNorm, gradient, optimiser state) and the random state."""

    tensors: list[tuple[torch.Tensor, torch.Tensor]]
    rng: torch.Tensor
    cuda_rng: torch.Tensor | None

    @classmethod
    def of(cls, tensors: list[torch.Tensor]) -> "Snapshot":
        cuda = any(t.is_cuda for t in tensors)
        return cls([(t, t.clone()) for t in tensors], torch.get_rng_state(),
                   torch.cuda.get_rng_state() if cuda else None)

    def restore(self) -> None:
        for t, saved in self.tensors:
            t.copy_(saved)
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng)


def parted(eager: torch.Tensor, replayed: torch.Tensor, start: torch.Tensor) -> float:
    """How far a replayed step's update left the eager step's: the norm of their difference over the
    eager update's norm (0 when they agree)."""
    update = (eager - start).double()
    gap = (replayed - eager).double().norm().item()
    return gap / max(update.norm().item(), 1e-12) if gap else 0.0


def stale_message(method: str, server_round: int, captured_round: int, gap: float, diff: Op | None) -> str:
    """What :class:`StaleCapture` says: the method, the round the replay left eager, the line that read the
    value (the first operation whose constant changed since capture), and what to do."""
    if diff is None:
        line = ("the step's operations were given the same Python values as at capture, so the replay read a "
                "tensor that moved (a tensor made anew outside __init__ and read by the step)")
    else:
        line = (f"it reads a value that changed since capture, at {lines(diff.where)} "
                f"({diff.name.split('::')[-1]} is given {_shown(diff.constants)} now)")
    return (f"{method}'s captured step left the eager step in round {server_round} (captured in round "
            f"{captured_round}; relative difference {gap:.3g} in the update): {line}. A captured step replays the "
            f"values it read when captured. Declare what the step reads per round or per client in the method's "
            f"inputs() (Inputs(round={{'tau': ()}}), set as self.inputs.tau in round_start or begin_client and read "
            f"there by the loss), or give the client role eager = \"<why>\" to run its steps eagerly")


def _shown(constants: tuple) -> str:
    shown = [repr(c) for c in constants if not (isinstance(c, tuple) and c[:1] == ("tensor",))]
    return ", ".join(shown) if shown else "other tensors"
