"""A network's whole state as two flat tensors.

:class:`FlatModel` rebinds every floating-point parameter and buffer of a network as a
view into one contiguous float32 tensor, and every integer buffer (BatchNorm's
``num_batches_tracked``) into one int64 tensor: loading a global model is one copy, and
the local model is sent up without copying it out first.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn


class FlatModel:
    """``model`` with its state living in ``self.floats`` (float32) and ``self.ints`` (int64)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        params = list(model.named_parameters())
        buffers = list(model.named_buffers())
        float_bufs = [(n, b) for n, b in buffers if b.is_floating_point()]
        int_bufs = [(n, b) for n, b in buffers if not b.is_floating_point()]
        for name, t in params + float_bufs:
            if t.dtype != torch.float32:
                raise TypeError(f"{name} is {t.dtype}; mpifed models keep float32 state")
        device = params[0][1].device if params else torch.device("cpu")
        self.num_params = sum(p.numel() for _, p in params)
        self.floats = torch.empty(self.num_params + sum(b.numel() for _, b in float_bufs), dtype=torch.float32,
                                  device=device)
        self.ints = torch.empty(sum(b.numel() for _, b in int_bufs), dtype=torch.int64, device=device)
        self.shapes: list[torch.Size] = [p.shape for _, p in params]
        self._params = [p for _, p in params]
        self.grad = torch.zeros(self.num_params, dtype=torch.float32, device=device)
        self._grad_views = self.param_views(self.grad)
        offset = 0
        for _, p in params:
            view = self.floats[offset: offset + p.numel()].view_as(p)
            view.copy_(p.data)
            p.data = view
            offset += p.numel()
        offset = self._rebind(float_bufs, self.floats, offset)
        self._rebind(int_bufs, self.ints, 0)

    def _rebind(self, buffers: list[tuple[str, torch.Tensor]], flat: torch.Tensor, offset: int) -> int:
        for name, b in buffers:
            owner_path, _, leaf = name.rpartition(".")
            owner = self.model.get_submodule(owner_path) if owner_path else self.model
            view = flat[offset: offset + b.numel()].view_as(b)
            view.copy_(b.to(flat.dtype))
            owner._buffers[leaf] = view
            offset += b.numel()
        return offset

    @property
    def num_floats(self) -> int:
        return self.floats.numel()

    def load(self, floats: torch.Tensor, ints: torch.Tensor | None = None) -> None:
        """Copy a flat state in (the int part is left alone when ``ints`` is None)."""
        self.floats.copy_(floats)
        if ints is not None and self.ints.numel():
            self.ints.copy_(ints)

    def zero_grad(self) -> None:
        """Zero the flat gradient and (re)attach every parameter's ``.grad`` to its slice of it."""
        self.grad.zero_()
        for p, g in zip(self._params, self._grad_views):
            p.grad = g

    def param_views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``flat``'s parameter part shaped like the network's parameters (in order)."""
        out, offset = [], 0
        for shape in self.shapes:
            n = int(np.prod(shape)) if len(shape) else 1
            out.append(flat[offset: offset + n].view(shape))
            offset += n
        return out
