"""Weights & Biases tracking from rank 0 (``run.wandb: true``): one W&B run per mpifed run, in
``run.wandb_project`` (and ``run.wandb_entity``), grouped by ``run.group`` (the table, the sweep
or the config file), named after the run directory, with the resolved config, each
metrics.jsonl row's numbers at step = round, and the summary at the end.

W&B's own settings apply: ``WANDB_MODE=offline`` writes the run under
``runs/<name>/wandb/`` for a later ``wandb sync`` (a cluster's nodes often have no internet),
``WANDB_API_KEY`` logs in. The W&B run's id is kept in ``runs/<name>/wandb.json`` with the last
round it was sent, so a resumed run continues the same W&B run from the round after it (W&B
refuses steps below the last one). Needs the ``[wandb]`` extra; nothing else in mpifed imports
wandb.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from mpifed.run.resume import RunError
from mpifed.run.rundir import atomic_write
from mpifed.run.tensorboard_log import scalars
from mpifed.run.state import RunState

RECORD = "wandb.json"
SUMMARY_KEYS = ("final_test_acc", "best_test_acc", "best_round", "forgetting", "best_val_acc",
                "test_acc_at_best_val", "rounds_done", "wall_time_s")


class WandbLog:
    """One mpifed run as one W&B run (created, or continued on resume)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise RuntimeError("run.wandb needs the wandb package: pip install 'mpifed[wandb]'") from None
        run = config["run"]
        self.record = run_dir / RECORD
        held = self._held()
        self.sent = held.get("round", 0)
        try:
            self.run = wandb.init(project=run.get("wandb_project") or "mpifed", entity=run.get("wandb_entity"),
                                  group=run.get("group"), name=run_dir.name, id=held.get("id"), resume="allow",
                                  config=config, dir=str(run_dir),
                                  tags=[config["algorithm"]["name"], config["data"]["dataset"]["name"]],
                                  settings=wandb.Settings(console="off", quiet=True, x_disable_stats=True))
        except Exception as exc:    # W&B's own errors (no login, no network) have no common base class
            raise RunError(f"run.wandb: W&B did not start the run ({type(exc).__name__}: {exc}). Log in (wandb login, "
                           f"or WANDB_API_KEY), or track offline (WANDB_MODE=offline, then wandb sync), or set "
                           f"run.wandb=false") from None
        self._write(self.sent)

    def _held(self) -> dict[str, Any]:
        try:
            held = json.loads(self.record.read_text())
            return held if isinstance(held, dict) else {}
        except (OSError, ValueError):
            return {}

    def _write(self, sent: int) -> None:
        atomic_write(self.record, json.dumps({"id": self.run.id, "project": self.run.project, "round": sent}) + "\n")

    def describe(self) -> str:
        where = f"offline, in {Path(self.run.dir).parent}" if self.run.settings.mode == "offline" else self.run.url
        return f"W&B run {self.run.id} (project {self.run.project!r}, group {self.run.group!r}): {where}"

    def add_row(self, row: dict[str, Any]) -> None:
        if row["round"] <= self.sent:       # sent before the checkpoint this run resumed from
            return
        self.run.log({k: v for k, v in scalars(row) if math.isfinite(v)}, step=row["round"])
        self.sent = row["round"]
        self._write(self.sent)

    def finish(self, status: RunState, summary: Path | None = None) -> None:
        """End the W&B run: ``status`` (finished, stopped or failed) and the summary's figures in its summary."""
        self.run.summary["status"] = str(status)
        if summary is not None and summary.exists():
            numbers = json.loads(summary.read_text())
            for key in SUMMARY_KEYS:
                if isinstance(numbers.get(key), (int, float)):
                    self.run.summary[key] = numbers[key]
        self.run.finish(exit_code=1 if status == RunState.FAILED else 0)
