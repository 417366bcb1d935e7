"""Decoded data held by a rank: its clients' shards (cached), its share of the test and validation sets.

A worker reads only the rows of the clients it trains (from the blocks that hold them), keeps them decoded (as stored:
uint8 images, integer token ids, on its device) within a memory budget, and evicts the
least recently used. Model inputs are a tensor (images) or a dict of named tensors (text:
``input_ids``, ``attention_mask``); everything below handles both alike.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mpifed.data.shards import Inputs, read_client, read_rows

if TYPE_CHECKING:
    from mpifed.run.prepared import Manifest


def take(inputs: Any, idx: torch.Tensor) -> Any:
    """Rows ``idx`` of model inputs: a tensor, or a dict of tensors (e.g. token ids and a mask)."""
    if isinstance(inputs, dict):
        return {k: v[idx] for k, v in inputs.items()}
    return inputs[idx]


def rows(inputs: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of model inputs (views, no copy)."""
    if isinstance(inputs, dict):
        return {k: v[start:stop] for k, v in inputs.items()}
    return inputs[start:stop]


def _nbytes(inputs: Any) -> int:
    tensors = inputs.values() if isinstance(inputs, dict) else [inputs]
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class ClientData:
    cid: int
    inputs: Any            # model inputs, e.g. uint8 images N x C x H x W, on the rank's device
    labels: torch.Tensor   # int64, N

    @property
    def num_samples(self) -> int:
        return int(self.labels.numel())

    @property
    def nbytes(self) -> int:
        return _nbytes(self.inputs) + 8 * self.labels.numel()


def to_device(inputs: Inputs, labels: np.ndarray, device: torch.device | str) -> tuple[Any, torch.Tensor]:
    """Model inputs and labels as tensors on ``device``: the ``images`` tensor when that is the
    only input, else a dict of tensors by name."""
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in inputs.items()}
    x = tensors["images"] if list(tensors) == ["images"] else tensors
    return x, torch.from_numpy(np.ascontiguousarray(labels)).to(device)


class ClientStore:
    """LRU cache of decoded client shards within ``budget_mb``."""

    def __init__(self, manifest: Manifest, device: torch.device | str, budget_mb: int) -> None:
        self.manifest = manifest
        self.device = device
        self.budget = budget_mb * 2**20
        self._cache: OrderedDict[int, ClientData] = OrderedDict()

    def get(self, cid: int) -> ClientData:
        if cid in self._cache:
            self._cache.move_to_end(cid)
            return self._cache[cid]
        shard = read_client(self.manifest.client_block(cid), cid, verify=True)
        data = ClientData(cid, *to_device(shard.inputs, shard.labels, self.device))
        self._cache[cid] = data
        while len(self._cache) > 1 and sum(d.nbytes for d in self._cache.values()) > self.budget:
            self._cache.popitem(last=False)
        return data


@dataclass
class EvalBatch:
    index: int             # the batch's place in its set
    inputs: Any
    labels: torch.Tensor
    groups: torch.Tensor | None
    val: bool = False      # a batch of the validation set (else of the test set)


def eval_batch_ids(sizes: list[int], batch_size: int, worker: int, workers: int) -> list[tuple[int, int]]:
    """The evaluation batches worker ``worker`` of ``workers`` evaluates, as (set, batch within the
    set), for sets of ``sizes`` samples: the batches of all sets in order, the b-th going to worker
    b % workers."""
    every = [(s, b) for s, n in enumerate(sizes) for b in range(-(-n // batch_size))]
    return every[worker::workers]


def load_eval_batches(manifest: Manifest, batch_size: int, worker: int, workers: int,
                      device: torch.device | str, test: bool = True) -> list[EvalBatch]:
    """This worker's share of the test set (unless ``test`` is false) and of the validation set
    (when there is one), read row range by row range and kept on the device."""
    sets = [(manifest.test_path,
             manifest.test_size if test else 0)] + ([(manifest.val_path,
                                                      manifest.val_size)] if manifest.val_size else [])
    out = []
    for s, b in eval_batch_ids([size for _, size in sets], batch_size, worker, workers):
        path, size = sets[s]
        x, y, g = read_rows(path, b * batch_size, min((b + 1) * batch_size, size))
        inputs, labels = to_device(x, y, device)
        groups = torch.from_numpy(g).to(device) if g is not None and s == 0 else None
        out.append(EvalBatch(b, inputs, labels, groups, val=s == 1))
    return out
