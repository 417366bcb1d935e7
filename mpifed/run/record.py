"""A run directory as its readers take it (tables, reports, the Python API): its configuration, state,
summary and per-round records, each read from the file :mod:`mpifed.run.rundir` names, never through a link."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpifed.run import results
from mpifed.run.rundir import CLIENT_ACC, CLIENTS, METRICS, MODEL, SUMMARY, RunDir
from mpifed.run.state import RunState


@dataclass(frozen=True)
class RunRecord:
    """The record of the run in ``path`` (finished or not); each read goes to the files anew."""

    path: Path

    @property
    def config(self) -> dict[str, Any]:
        """The resolved configuration (config.yaml); OSError where it is missing or a link, yaml.YAMLError
        where it is not readable YAML."""
        return RunDir(self.path).read_config()

    @property
    def state(self) -> RunState | None:
        """The run's state (:meth:`RunDir.state`: a run whose processes died reads as failed, one whose loss
        became NaN as diverged, a finished one with broken metrics as damaged); None without a status.json."""
        return RunDir(self.path).state()

    @property
    def status(self) -> dict[str, Any] | None:
        """status.json as a reader should believe it (:meth:`RunDir.status`); None without one."""
        return RunDir(self.path).status()

    @property
    def summary(self) -> dict[str, Any]:
        """summary.json: final and best accuracy, forgetting, timing; empty until the run stops or finishes."""
        return results.read_json(self.path / SUMMARY)

    def metrics(self) -> list[dict[str, Any]]:
        """One dict per round (metrics.jsonl): lr, train_loss, and test_acc, test_loss, per_class_acc ... where
        evaluated."""
        return results.read_rows(self.path, METRICS)

    def clients(self) -> list[dict[str, Any]]:
        """Per round, each sampled client's worker, samples, loss, steps and time (clients.jsonl)."""
        return results.read_rows(self.path, CLIENTS)

    def client_accuracy(self) -> list[dict[str, Any]]:
        """Per evaluation, each client's accuracy on its held-out rows (client_acc.jsonl, data.client_holdout)."""
        return results.read_rows(self.path, CLIENT_ACC)

    @property
    def model_file(self) -> Path:
        """Where the final global model's state_dict is (model.pt; present once the run finished)."""
        return self.path / MODEL
