"""Test- and validation-set evaluation split over workers, with a result that does not depend on the split.

The test set and the validation set are cut into fixed batches; the b-th batch of the two
(the test set's first) is evaluated by worker b % W, all in one pass and one buffer. Each
worker fills its batches' slots of a float64 vector (loss sum per batch; correct predictions
per class and per group of the test set, and in all of the validation set) and leaves the
others at zero, so the MPI sum reproduces exactly the numbers one process would compute.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from mpifed.data.store import ClientData, EvalBatch, take
from mpifed.data.transforms import BatchTransform


@torch.no_grad()
def evaluate_share(model: Callable[[Any], torch.Tensor], transform: BatchTransform, batches: list[EvalBatch],
                   layout: Any) -> np.ndarray:
    """This rank's contribution to the evaluation sums (``model`` in eval mode, e.g. an InferenceCopy),
    in the protocol's evaluation layout (test set: per-batch ``loss``, per-class ``correct``,
    ``group_correct``; validation set: per-batch ``val_loss``, ``val_correct``; the clients'
    held-out rows: per-client ``client_loss`` and ``client_correct``)."""
    buf = layout.empty()
    out = layout.views(buf)
    for b in batches:
        logits = model(transform.eval(b.inputs))
        loss = float(F.cross_entropy(logits.float(), b.labels, reduction="sum"))
        hit = (logits.argmax(1) == b.labels).cpu()
        if b.client is not None:
            out["client_loss"][b.client] += loss
            out["client_correct"][b.client] += float(hit.sum())
            continue
        if b.val:
            out["val_loss"][b.index] = loss
            out["val_correct"] += float(hit.sum())
            continue
        out["loss"][b.index] = loss
        labels = b.labels.cpu()
        out["correct"] += torch.bincount(labels[hit], minlength=out["correct"].numel()).double()
        if b.groups is not None and out["group_correct"].numel():
            out["group_correct"] += torch.bincount(b.groups.cpu()[hit], minlength=out["group_correct"].numel()).double()
    return buf


@torch.no_grad()
def client_loss(model: Callable[[Any], torch.Tensor], transform: BatchTransform, data: ClientData,
                batch_size: int) -> float:
    """A client's mean cross-entropy on its training samples under ``model`` (eval mode, no augmentation),
    in batches of ``batch_size`` taken in order: what a probing selector asks a candidate for."""
    total = 0.0
    for start in range(0, data.num_samples, batch_size):
        idx = torch.arange(start, min(start + batch_size, data.num_samples), device=data.labels.device)
        logits = model(transform.eval(take(data.inputs, idx)))
        total += float(F.cross_entropy(logits.float(), data.labels[idx], reduction="sum"))
    return total / max(data.num_samples, 1)


# the figures evaluation_figures returns
TEST_COLUMNS = ("test_acc", "test_loss", "per_class_acc", "per_group_acc", "group_mean_acc")


def evaluation_figures(totals: dict[str, torch.Tensor], class_counts: np.ndarray, group_counts: np.ndarray,
                       group_names: list[str]) -> dict[str, Any]:
    """Accuracy, mean loss, per-class (and per-group) accuracy from the summed evaluation."""
    n = int(class_counts.sum())
    correct = totals["correct"].numpy()
    per_class = np.where(class_counts > 0, correct / np.maximum(class_counts, 1), np.nan)
    result: dict[str, Any] = {
        "test_acc": float(correct.sum() / n),
        "test_loss": float(np.sum(totals["loss"].numpy()) / n),
        "per_class_acc": [None if np.isnan(a) else round(float(a), 6) for a in per_class],
    }
    if len(group_names):
        accs = totals["group_correct"].numpy() / np.maximum(group_counts, 1)
        result["per_group_acc"] = {name: round(float(a), 6) for name, a in zip(group_names, accs)}
        result["group_mean_acc"] = float(np.mean(accs))
    return result


def validation(totals: dict[str, torch.Tensor], val_size: int) -> dict[str, float]:
    """Accuracy and mean loss on the validation set from the summed evaluation."""
    return {"val_acc": float(totals["val_correct"].numpy().sum() / val_size),
            "val_loss": float(np.sum(totals["val_loss"].numpy()) / val_size)}


def client_figures(totals: dict[str, torch.Tensor], held: np.ndarray) -> dict[str, Any]:
    """The global model on each client's own held-out rows (``held``: how many each client has):
    ``client_acc`` (mean, std, median, min, and ``worst10``: the mean of the worst 10% of clients,
    at least one) over the clients that hold some out, and ``per_client_acc`` (None for a client
    without held-out rows); nothing when no client holds rows out (every client has fewer than two)."""
    has = held > 0
    if not has.any():
        return {}
    accs = totals["client_correct"].numpy()[has] / held[has]
    ordered = np.sort(accs)
    worst = ordered[:max(1, int(np.ceil(0.1 * len(ordered))))]
    per_client = np.full(len(held), np.nan)
    per_client[has] = accs
    return {"client_acc": {"mean": float(accs.mean()), "std": float(accs.std()), "median": float(np.median(accs)),
                           "min": float(ordered[0]), "worst10": float(worst.mean())},
            "client_loss": float(totals["client_loss"].numpy().sum() / held.sum()),
            "per_client_acc": [None if np.isnan(a) else round(float(a), 6) for a in per_client]}


def forgetting(history: list[list[float | None]]) -> float | None:
    """FedNTD Eq. 5 (backward transfer): mean over classes of (best accuracy before the last
    evaluation - last accuracy); a class that ends at a new best contributes a negative term. A class
    without an accuracy before the last evaluation or at it (none of its samples in the test set)
    counts for nothing."""
    if len(history) < 2:
        return None
    acc = np.array([[np.nan if a is None else a for a in row] for row in history], dtype=np.float64)
    known = ~np.isnan(acc[:-1]).all(axis=0) & ~np.isnan(acc[-1])
    if not known.any():
        return None
    return float((np.nanmax(acc[:-1, known], axis=0) - acc[-1, known]).mean())
