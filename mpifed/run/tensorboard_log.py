"""TensorBoard event files from rank 0 (``run.tensorboard: true``): the numbers of each
metrics.jsonl row as scalars at step = round. Needs the ``[tensorboard]`` extra; nothing else in
mpifed imports it."""
from __future__ import annotations

from pathlib import Path
from typing import Any


class TensorBoardLog:
    """Writes ``runs/<name>/tensorboard/``; a resumed run first drops the events after its checkpoint."""

    def __init__(self, folder: Path, first_round: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise RuntimeError("run.tensorboard needs the tensorboard package: pip install "
                               "'mpifed[tensorboard]'") from None
        self.writer = SummaryWriter(str(folder), purge_step=first_round + 1)

    def add_row(self, row: dict[str, Any]) -> None:
        step = row["round"]
        for tag, value in scalars(row):
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def scalars(row: dict[str, Any], prefix: str = "") -> list[tuple[str, float]]:
    """(tag, value) for every number in a metrics row: nested dicts as tag paths, lists by index."""
    out: list[tuple[str, float]] = []
    for key, value in row.items():
        tag = f"{prefix}{key}"
        if key == "round" and not prefix:
            continue
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            out.append((tag, float(value)))
        elif isinstance(value, dict):
            out += scalars(value, f"{tag}/")
        elif isinstance(value, list):
            out += scalars({str(i): v for i, v in enumerate(value) if v is not None}, f"{tag}/")
    return out
