"""TensorBoard event files from rank 0 (``run.tensorboard: true``): the resolved config as
hyperparameters (the HParams dashboard, to filter and compare runs by ``train.lr`` or
``algorithm.name``) and as text, and the numbers of each metrics.jsonl row as scalars at step =
round. Needs the ``[tensorboard]`` extra; nothing else in mpifed imports it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

METRICS = ("test_acc", "test_loss", "val_acc", "val_loss", "train_loss")   # the HParams dashboard's columns


class TensorBoardLog:
    """Writes ``runs/<name>/tensorboard/``; a resumed run first drops the events after its checkpoint."""

    def __init__(self, folder: Path, first_round: int, config: dict[str, Any]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams
        except ImportError:
            raise RuntimeError("run.tensorboard needs the tensorboard package: pip install "
                               "'mpifed[tensorboard]'") from None
        self.writer = SummaryWriter(str(folder), purge_step=first_round + 1)
        if first_round == 0:     # a resumed run's events already hold them
            for summary in hparams(hyperparameters(config), dict.fromkeys(METRICS, 0.0)):
                self.writer.file_writer.add_summary(summary)
            text = yaml.safe_dump(config, sort_keys=False)
            self.writer.add_text("config", "".join(f"    {line}\n" for line in text.splitlines()), 0)
            self.writer.flush()

    def add_row(self, row: dict[str, Any]) -> None:
        step = row["round"]
        for tag, value in scalars(row):
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def leaves(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys and their values (an empty mapping is a value)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def hyperparameters(config: dict[str, Any]) -> dict[str, bool | int | float | str]:
    """A nested config as dotted keys and the values TensorBoard's HParams take (others as text)."""
    return {k: v if isinstance(v, (bool, int, float, str))
            else yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()
            for k, v in leaves(config).items()}


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
