"""A client role's declared inputs: what its hooks leave for its loss, in buffers fixed for the run.

A method declares, in :meth:`Algorithm.inputs`, everything its client role keeps between hooks
besides what it builds once in ``__init__``, per round or per client, as it declares its
messages::

    def inputs(self) -> Inputs:
        return Inputs(round={"tau": ()},                      # a 0-d float32 tensor, filled in place
                      client={"correction": (p,),             # a float32 tensor of shape (p,)
                              "counts": Buffer((c,), torch.float64),
                              "active": bool})                # a Python value: part of the capture key

``round_start`` (and ``use_statistics``) set the ``round`` entries, ``begin_client`` the
``client`` ones, as attributes of ``self.inputs``; the loss reads them back there. Setting one
copies into its buffer (a number fills it), so its address never changes: a captured step
(``resources.cuda_graphs``) reads this round's temperature, not the one in force when it was
captured. The Python-valued entries (``bool``, ``int``, ``float``) select the step's graph (one
per value). Before each round the ``round`` entries are zeroed (``False``, ``0``); before each
client, the ``client`` ones.

Whether a step reads anything else is checked by behaviour, not by syntax: ``mpifed check-method``
(:mod:`mpifed.round.capture_check`) replays the captured step against an eager one, and a run with
``resources.cuda_graphs`` checks the first replay of each graph in each round.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Union

import torch

Shape = tuple[int, ...]
SCOPES = ("round", "client")
_VALUES: dict[type, Any] = {bool: False, int: 0, float: 0.0}


class UndeclaredInput(AttributeError):
    """A client role read or set an input its method's inputs() do not declare."""


@dataclass(frozen=True)
class Buffer:
    """A tensor input of a dtype other than float32 (float64 sums, a boolean mask)."""

    shape: Shape
    dtype: torch.dtype = torch.float32


Spec = Union[Shape, Buffer, type]


def _buffer(spec: Spec) -> Buffer | None:
    """The tensor ``spec`` declares, or None for a Python value (bool, int, float)."""
    if isinstance(spec, Buffer):
        return spec
    if isinstance(spec, tuple) and all(isinstance(n, int) and n >= 0 for n in spec):
        return Buffer(spec)
    return None


@dataclass(frozen=True)
class Inputs:
    """What a client role's loss reads besides the batch and the model, by name, in two scopes:
    ``round`` (set by round_start or use_statistics) and ``client`` (set by begin_client). A value
    is a shape (a float32 tensor; ``()`` a scalar), a :class:`Buffer`, or one of ``bool``, ``int``,
    ``float`` (a Python value, for control flow: each value gets its own captured step)."""

    round: Mapping[str, Spec] = field(default_factory=dict)
    client: Mapping[str, Spec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for scope in SCOPES:
            for name, spec in getattr(self, scope).items():
                if not (isinstance(name, str) and name.isidentifier() and not name.startswith("_")):
                    raise ValueError(f"Inputs.{scope}: {name!r} is not a Python identifier without a leading _; the "
                                     f"role reads each input as an attribute (self.inputs.<name>)")
                if _buffer(spec) is None and spec not in _VALUES:
                    raise ValueError(f"Inputs.{scope}[{name!r}] is {spec!r}; declare a shape (a tuple of ints, () for "
                                     f"a scalar), a Buffer(shape, dtype), or one of bool, int, float")
        clash = sorted(set(self.round) & set(self.client))
        if clash:
            raise ValueError(f"Inputs: {clash} declared both per round and per client")

    def extend(self, **more: Mapping[str, Spec]) -> "Inputs":
        """These inputs plus ``more`` (``round={...}``, ``client={...}``); a name declared twice is an error."""
        return Inputs(**merged_parts(self, SCOPES, more))


def merged_parts(declared: Any, parts: tuple[str, ...], more: dict[str, Mapping]) -> dict[str, dict]:
    """Each of ``parts`` of a declaration (:class:`Inputs`, ``Messages``) with the entries of ``more``
    added: a name declared twice, or a part it does not have, is an error naming it."""
    what = type(declared).__name__
    merged = {}
    for part in parts:
        mine, extra = getattr(declared, part), more.pop(part, {})
        clash = set(mine) & set(extra)
        if clash:
            raise ValueError(f"{what}.{part}: {sorted(clash)} declared twice")
        merged[part] = {**mine, **extra}
    if more:
        raise TypeError(f"{what} has no part {sorted(more)}; its parts are {list(parts)}")
    return merged


class InputBuffers:
    """A client role's declared inputs (``self.inputs``): each tensor in a buffer allocated once on
    the run's device and written in place, each Python value type-checked."""

    __slots__ = ("_InputBuffers__scope", "_InputBuffers__values")

    def __init__(self, inputs: Inputs, device: torch.device | str = "cpu") -> None:
        scope, values = {}, {}
        for which in SCOPES:
            for name, spec in getattr(inputs, which).items():
                buf = _buffer(spec)
                scope[name] = which
                values[name] = (torch.zeros(buf.shape, dtype=buf.dtype, device=device) if buf is not None
                                else _VALUES[spec])
        object.__setattr__(self, "_InputBuffers__scope", scope)
        object.__setattr__(self, "_InputBuffers__values", values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_InputBuffers__"):
            raise AttributeError(name)
        try:
            return self.__values[name]
        except KeyError:
            raise UndeclaredInput(self._undeclared(name)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.__values:
            raise UndeclaredInput(self._undeclared(name))
        now = self.__values[name]
        if isinstance(now, torch.Tensor):
            _copy_into(name, now, value)
            return
        kind = type(now)
        if kind is float and type(value) is int:
            value = float(value)
        if type(value) is not kind:
            raise TypeError(f"inputs.{name} is declared {kind.__name__}; got {type(value).__name__} ({value!r})")
        self.__values[name] = value

    def _undeclared(self, name: str) -> str:
        declared = ", ".join(f"{n} ({s})" for n, s in self.__scope.items()) or "none"
        return (f"inputs.{name} is not declared; the method's inputs() declare {declared}. Declare it there, e.g. "
                f"Inputs(round={{{name!r}: ()}}) for a scalar set per round")

    def reset(self, scope: str) -> None:
        """Zero the tensors of ``scope`` (``round`` or ``client``) and set its Python values to False/0."""
        for name, which in self.__scope.items():
            if which == scope:
                now = self.__values[name]
                if isinstance(now, torch.Tensor):
                    now.zero_()
                else:
                    self.__values[name] = _VALUES[type(now)]

    def key(self) -> tuple:
        """The Python-valued inputs, by name: what selects a captured step."""
        return tuple((n, v) for n, v in self.__values.items() if not isinstance(v, torch.Tensor))

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.__values.items())

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={tuple(v.shape) if isinstance(v, torch.Tensor) else v!r}"
                          for n, v in self.__values.items())
        return f"InputBuffers({shown})"


def _copy_into(name: str, buf: torch.Tensor, value: Any) -> None:
    if value is buf:
        return     # an in-place update (self.inputs.sums += s) assigns the buffer back to itself
    if isinstance(value, (bool, int, float)):
        buf.fill_(value)
        return
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"inputs.{name} is a tensor of shape {tuple(buf.shape)}; got {type(value).__name__}")
    if tuple(value.shape) != tuple(buf.shape) and not (buf.dim() == 0 and value.numel() == 1):
        raise ValueError(f"inputs.{name} is declared with shape {tuple(buf.shape)}; got a tensor of shape "
                         f"{tuple(value.shape)}")
    buf.copy_(value.reshape(buf.shape))
