"""Decoded data held by a rank: its clients' shards (cached), its share of the test and validation
sets, and (with ``data.client_holdout``) its share of the clients' own held-out samples.

A worker reads only the rows of the clients it trains (from the blocks that hold them), keeps them decoded (as stored:
uint8 images, integer token ids, on its device) within a memory budget, and evicts the
least recently used. Model inputs are a tensor (images) or a dict of named tensors (text:
``input_ids``, ``attention_mask``); everything below handles both alike.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mpifed.data.prepared import Manifest
from mpifed.data.shards import Inputs, ShardError, read_client, read_rows

_HOLDOUT_SEED = 0x686F6C64     # with the client's id: a client holds out the same samples in every run


def holdout_size(n: int, fraction: float) -> int:
    """How many of a client's ``n`` samples ``data.client_holdout = fraction`` holds out: at least
    one, and at least one left to train on (none of a client with fewer than two)."""
    if fraction <= 0 or n < 2:
        return 0
    return min(n - 1, max(1, int(n * fraction)))


def holdout_split(n: int, fraction: float, cid: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``cid``'s rows to train on and its held-out rows, each in their stored order: a random
    :func:`holdout_size` of them held out, the same whatever the run's seed."""
    held = np.sort(np.random.default_rng((_HOLDOUT_SEED, cid)).permutation(n)[:holdout_size(n, fraction)])
    return np.setdiff1d(np.arange(n), held, assume_unique=True), held


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
    """LRU cache of decoded client shards within ``budget_mb``: the rows each client trains on (all
    of them, or those ``holdout`` leaves it: :func:`holdout_split`)."""

    def __init__(self, manifest: Manifest, device: torch.device | str, budget_mb: int, holdout: float = 0.0) -> None:
        self.manifest = manifest
        self.device = device
        self.budget = budget_mb * 2**20
        self.holdout = holdout
        self._cache: OrderedDict[int, ClientData] = OrderedDict()

    def get(self, cid: int) -> ClientData:
        if cid in self._cache:
            self._cache.move_to_end(cid)
            return self._cache[cid]
        inputs, labels = client_rows(self.manifest, cid, self.holdout, held=False)
        data = ClientData(cid, *to_device(inputs, labels, self.device))
        self._cache[cid] = data
        while len(self._cache) > 1 and sum(d.nbytes for d in self._cache.values()) > self.budget:
            self._cache.popitem(last=False)
        return data


def client_rows(manifest: Manifest, cid: int, holdout: float, held: bool) -> tuple[Inputs, np.ndarray]:
    """Client ``cid``'s rows to train on (``held`` false) or its held-out rows, read from its block and
    checked against its checksum."""
    shard = read_client(manifest.client_block(cid), cid, verify=True)
    check_labels(manifest, shard.labels, f"client {cid}'s rows in {manifest.client_block(cid)}")
    if not holdout:
        return shard.inputs, shard.labels
    rows = holdout_split(len(shard.labels), holdout, cid)[1 if held else 0]
    return {k: v[rows] for k, v in shard.inputs.items()}, shard.labels[rows]


def check_labels(manifest: Manifest, labels: np.ndarray, where: str) -> None:
    """Raise a ShardError unless every label lies in [0, manifest.num_classes) (``where``: the rows)."""
    if len(labels) and (labels.min() < 0 or labels.max() >= manifest.num_classes):
        bad = labels.max() if labels.max() >= manifest.num_classes else labels.min()
        raise ShardError(f"{where} hold label {int(bad)}, outside the {manifest.num_classes} classes that "
                         f"{manifest.root / 'manifest.json'} gives: the manifest was edited or is another folder's. "
                         f"Delete {manifest.root} so that the next run prepares it again (or: python -m "
                         f"mpifed.prepare --config <config> --force)")


@dataclass
class EvalBatch:
    index: int             # the batch's place in its set
    inputs: Any
    labels: torch.Tensor
    groups: torch.Tensor | None
    val: bool = False      # a batch of the validation set (else of the test set)
    client: int | None = None   # a batch of this client's held-out rows


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
        check_labels(manifest, y, f"the rows of {path}")
        inputs, labels = to_device(x, y, device)
        groups = torch.from_numpy(g).to(device) if g is not None and s == 0 else None
        out.append(EvalBatch(b, inputs, labels, groups, val=s == 1))
    return out


def load_client_batches(manifest: Manifest, holdout: float, batch_size: int, worker: int, workers: int,
                        device: torch.device | str) -> list[EvalBatch]:
    """The held-out rows of the clients worker ``worker`` of ``workers`` evaluates (client k goes to
    worker k % workers), in batches, kept on the device."""
    out = []
    for cid in range(worker, manifest.num_clients, workers):
        if not holdout_size(int(manifest.client_sizes[cid]), holdout):
            continue
        x, y = client_rows(manifest, cid, holdout, held=True)
        for start in range(0, len(y), batch_size):
            inputs, labels = to_device({k: v[start:start + batch_size] for k, v in x.items()},
                                       y[start:start + batch_size], device)
            out.append(EvalBatch(start // batch_size, inputs, labels, None, client=cid))
    return out
