"""What a run writes about itself as it goes, from rank 0: a row per round in metrics.jsonl (and
in TensorBoard, MLflow and W&B, when the run asks for them), the clients of each round in
clients.jsonl, each client's accuracy on its held-out rows in client_acc.jsonl (with
``data.client_holdout``), status.json, and at the end summary.json and its line in the log."""
from __future__ import annotations

import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mpifed.run import results
from mpifed.algorithms.base import ClientReport
from mpifed.settings.config import Config
from mpifed.data.prepared import Manifest
from mpifed.local.evaluation import TEST_COLUMNS
from mpifed.run.progress import count
from mpifed.run.rundir import CLIENT_ACC, CLIENTS, METRICS, STATUS, SUMMARY, RunDir
from mpifed.run.state import RunState




class RunRecords:
    """One run's records. A new run starts metrics.jsonl and clients.jsonl empty; a resumed one
    (``metrics``: the rows of its checkpoint) keeps the rows of the rounds done and drops the rest."""

    def __init__(self, cfg: Config, cfg_dict: dict[str, Any], manifest: Manifest, run: RunDir,
                 metrics: list[dict[str, Any]] | None, rounds_done: int) -> None:
        self.cfg = cfg
        self.manifest = manifest
        self.run = run
        self.metrics: list[dict[str, Any]] = list(metrics or [])
        logs = (CLIENTS, CLIENT_ACC) if cfg.data.client_holdout else (CLIENTS,)
        if metrics is None:
            for log in (METRICS, *logs):
                run.write_rows(log, [])
        else:
            run.write_rows(METRICS, self.metrics)
            for log in logs:
                run.keep_rounds(log, rounds_done)
        self.tensorboard = None
        if cfg.run.tensorboard:
            from mpifed.run.tensorboard_log import TensorBoardLog
            self.tensorboard = TensorBoardLog(run.path / "tensorboard", rounds_done, cfg_dict)
        self.mlflow = None
        if cfg.run.mlflow:
            from mpifed.run.mlflow_log import MlflowLog
            self.mlflow = MlflowLog(run.path, cfg_dict)
        self.wandb = None
        if cfg.run.wandb:
            from mpifed.run.wandb_log import WandbLog
            self.wandb = WandbLog(run.path, cfg_dict)

    def tracked(self) -> list[str]:
        """Where the run is tracked beyond its directory (MLflow, W&B), in words."""
        return [t.describe() for t in (self.mlflow, self.wandb) if t is not None]

    def add_round(self, row: dict[str, Any], clients: list[ClientReport]) -> None:
        """A round's metrics row, to metrics.jsonl and every tracker, and its clients to clients.jsonl
        (and each client's held-out accuracy, the row's ``per_client_acc``, to client_acc.jsonl)."""
        per_client = row.pop("per_client_acc", None)
        if per_client is not None:
            self.run.append_row(CLIENT_ACC, {"round": row["round"], "acc": per_client})
        self.metrics.append(row)
        self.run.append_row(METRICS, row)
        if self.tensorboard is not None:
            self.tensorboard.add_row(row)
        for tracker in (self.mlflow, self.wandb):
            if tracker is not None:
                tracker.add_row(row)
        self.run.append_row(CLIENTS, {"round": row["round"], "clients": [asdict(r) for r in clients]})

    def status(self, state: RunState, rounds_done: int, last_checkpoint: Path | None,
               sim_clock: float | None = None) -> None:
        """status.json: the run's state, rounds done, last checkpoint and (on the virtual clock) its simulated time."""
        status = {"state": state, "rounds_done": rounds_done,
                  "checkpoint": str(last_checkpoint) if last_checkpoint else None}
        if sim_clock is not None:
            status["sim_clock"] = sim_clock
        self.run.write_json(STATUS, status)

    def finish(self, status: RunState, rounds_done: int, last_checkpoint: Path | None, wall_time_s: float,
               first_round_at: float, usage: list[tuple[float, float]], sim_clock: float | None = None) -> None:
        """The run ended (``finished`` or ``stopped``): summary.json, status.json and the log's last line;
        the trackers closed."""
        summary = self._summary(status, rounds_done, last_checkpoint, wall_time_s, first_round_at, usage)
        self.run.write_json(SUMMARY, summary)
        self.status(status, rounds_done, last_checkpoint, sim_clock)
        self._tell(status, rounds_done, summary)
        self._close(status, self.run.path / SUMMARY)

    def abandon(self) -> None:
        """The run failed: end what tracks it (its MLflow and W&B runs are marked failed)."""
        self._close(RunState.FAILED, None)

    def _close(self, status: RunState, summary: Path | None) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        for tracker in (self.mlflow, self.wandb):
            if tracker is not None:
                tracker.finish(status, summary)
        self.mlflow = self.wandb = None

    def _rows(self) -> list[dict[str, Any]]:
        # a run resumed with run.eval_test false reports no test figure, not the earlier segment's
        if self.cfg.run.eval_test:
            return self.metrics
        return [{k: v for k, v in r.items() if k not in TEST_COLUMNS} for r in self.metrics]

    def _summary(self, status: RunState, rounds_done: int, last_checkpoint: Path | None, wall_time_s: float,
                 first_round_at: float, usage: list[tuple[float, float]]) -> dict[str, Any]:
        rows = self._rows()
        best_acc, best_round = results.best(rows)
        summary = {
            "status": status,
            "rounds_done": rounds_done,
            "rounds": self.cfg.train.rounds,
            "algorithm": self.cfg.algorithm.name,
            "dataset": self.cfg.data.dataset.name,
            "final_test_acc": results.final(rows),
            "final_test_loss": results.final(rows, "test_loss"),
            "best_test_acc": best_acc,
            "best_round": best_round,
            "forgetting": results.forgetting(rows),
            "wall_time_s": round(wall_time_s, 2),
            "round_time_median_s": (round(statistics.median(r["time"]["round"] for r in self.metrics), 4)
                                    if self.metrics else None),
            "checkpoint": str(last_checkpoint) if last_checkpoint else None,
            "first_round_started_at": first_round_at,
            "peak_rss_mb_per_rank": [round(rss, 1) for rss, _ in usage],
            "cpu_s_per_rank": [round(cpu, 2) for _, cpu in usage],
        }
        if self.cfg.run.rounds_to:
            summary["rounds_to"] = {results.target_key(t): results.rounds_to(rows, t) for t in self.cfg.run.rounds_to}
        if self.manifest.val_size:
            best_val, best_val_round = results.best(rows, "val_acc")
            summary["best_val_acc"] = best_val
            summary["best_val_round"] = best_val_round
            summary["test_acc_at_best_val"] = next((r.get("test_acc") for r in rows if r["round"] == best_val_round),
                                                   None)
        if self.cfg.data.test_subset:
            summary["test_subset"] = self.manifest.test_size
        evaluated = [r["client_acc"] for r in rows if "client_acc" in r]
        if evaluated:
            summary["final_client_acc"] = evaluated[-1]
        return summary

    def _tell(self, status: RunState, rounds_done: int, summary: dict[str, Any]) -> None:
        where = f"wall time {summary['wall_time_s']:.1f} s; results in {self.run.path}"
        last = "final" if status == RunState.FINISHED else "latest"      # a stopped run has no final accuracy yet
        if summary["final_test_acc"] is not None:
            chosen = (f"; best validation accuracy {summary['best_val_acc']:.4f} at round {summary['best_val_round']}, "
                      f"test accuracy there {summary['test_acc_at_best_val']:.4f}"
                      if summary.get("test_acc_at_best_val") is not None else "")
            self.run.log(f"[mpifed] {status}: {count(rounds_done, 'round')}, {last} test accuracy "
                         f"{summary['final_test_acc']:.4f} "
                         f"(best {summary['best_test_acc']:.4f} at round {summary['best_round']}){chosen}, {where}")
        elif summary.get("best_val_acc") is not None:
            self.run.log(f"[mpifed] {status}: {count(rounds_done, 'round')}, {last} validation accuracy "
                         f"{results.final(self._rows(), 'val_acc'):.4f} (best {summary['best_val_acc']:.4f} at round "
                         f"{summary['best_val_round']}; the test set not evaluated: run.eval_test is false), {where}")
