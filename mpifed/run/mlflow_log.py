"""MLflow tracking from rank 0 (``run.mlflow: true``): the resolved config as parameters, each
metrics.jsonl row's numbers as metrics at step = round, and at the end the summary (as an
artifact, and its accuracies as metrics) and the run's status. ``mpifed report --mlflow`` adds
the report's tables and figures to the runs it reports on (:func:`log_report`).

The store is ``run.mlflow_uri``, else ``$MLFLOW_TRACKING_URI``, else a file store in
``<run.root>/mlruns``: no server, safe for parallel runs on a shared file system, one store for
all the runs of a folder (MLflow 3 keeps file stores in maintenance mode; mpifed opts in with
``MLFLOW_ALLOW_FILE_STORE=true``). The experiment is ``run.mlflow_experiment``, else
``run.group`` (the table, the sweep or the config file). An experiment mpifed creates in a
SQLite store keeps its artifacts beside the database file (``mlartifacts/``), not in the
current folder; a server's or another database's experiments keep theirs where MLflow puts them.
The MLflow run's id is kept in ``runs/<name>/mlflow.json``, so a resumed run continues the same
MLflow run (the rounds after its checkpoint are logged again, at the same steps). Needs the
``[mlflow]`` extra; nothing else in mpifed imports mlflow.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from mpifed.run.rundir import atomic_write
from mpifed.run.tensorboard_log import leaves, scalars
from mpifed.run.state import RunState

RECORD = "mlflow.json"
_VALUE_LIMIT = 6000   # MLflow's longest parameter value
_BATCH = 100


def _client(uri: str) -> Any:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise RuntimeError("run.mlflow needs the mlflow package: pip install 'mpifed[mlflow]'") from None
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return MlflowClient(tracking_uri=uri)


DATABASES = ("sqlite", "postgresql", "mysql", "mssql")   # MLflow's database stores (SQLAlchemy URIs)


def missing_for(uri: str) -> list[str]:
    """The packages an MLflow store at ``uri`` needs and this environment lacks: a database store
    (``sqlite:///mlflow.db``, ``postgresql://...``) needs SQLAlchemy and Alembic, which
    ``mpifed[mlflow]`` installs and mlflow-skinny does not."""
    import importlib.util
    scheme = uri.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme not in DATABASES:
        return []
    return [name for name in ("sqlalchemy", "alembic") if importlib.util.find_spec(name) is None]


def default_uri(root: str | Path) -> str:
    """The default store: a file store in ``<run.root>/mlruns``."""
    return (Path(root) / "mlruns").resolve().as_uri()


def tracking_uri(run: dict[str, Any]) -> str:
    """The store a run's config asks for: ``run.mlflow_uri``, else ``$MLFLOW_TRACKING_URI``, else the default."""
    return run.get("mlflow_uri") or os.environ.get("MLFLOW_TRACKING_URI") or default_uri(run["root"])


def artifact_location(uri: str) -> str | None:
    """Where a new experiment in the store ``uri`` keeps its artifacts: beside a SQLite file; None
    (MLflow's choice: inside a file store, a server's own) otherwise."""
    match = re.fullmatch(r"sqlite:///(.+)", uri)
    if match is None or match.group(1) == ":memory:":
        return None
    return (Path(match.group(1)).resolve().parent / "mlartifacts").as_uri()


def flatten(d: dict[str, Any]) -> dict[str, str]:
    """A nested config as dotted keys and string values (MLflow parameters)."""
    return {k: str(v)[:_VALUE_LIMIT] for k, v in leaves(d).items()}


class MlflowLog:
    """One mpifed run as one MLflow run (created, or continued on resume)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        run = config["run"]
        self.uri = tracking_uri(run)
        self.client = _client(self.uri)
        from mlflow.entities import Param
        self.record = run_dir / RECORD
        self.run_id = self._continued()
        if self.run_id is None:
            experiment = run.get("mlflow_experiment") or run.get("group") or Path(run["root"]).resolve().name
            self.experiment = experiment
            created = self.client.create_run(self._experiment_id(experiment), run_name=run_dir.name,
                                             tags={"mpifed.run_dir": str(run_dir.resolve())})
            self.run_id = created.info.run_id
            params = [Param(k, v) for k, v in flatten(config).items()]
            for i in range(0, len(params), _BATCH):
                self.client.log_batch(self.run_id, params=params[i:i + _BATCH])
            atomic_write(self.record, json.dumps({"tracking_uri": self.uri, "run_id": self.run_id}) + "\n")

    def _continued(self) -> str | None:
        """The MLflow run this run directory already has in this store (marked running again), or None."""
        try:
            held = json.loads(self.record.read_text())
            if held["tracking_uri"] != self.uri:
                return None
            found = self.client.get_run(held["run_id"])
        except Exception:  # no record, an unreadable one, or a run the store no longer has
            return None
        self.experiment = self.client.get_experiment(found.info.experiment_id).name
        self.client.update_run(held["run_id"], status="RUNNING")
        return held["run_id"]

    def _experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifact_location(self.uri))
        except Exception:  # another run created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def describe(self) -> str:
        return f"MLflow run {self.run_id} (experiment {self.experiment!r}) in {self.uri}"

    def add_row(self, row: dict[str, Any]) -> None:
        self._metrics(scalars(row), step=row["round"])

    def finish(self, status: RunState, summary: Path | None = None) -> None:
        """End the MLflow run as ``status`` (finished, stopped or failed), first logging ``summary``."""
        if summary is not None and summary.exists():
            self.client.log_artifact(self.run_id, str(summary))
            numbers = json.loads(summary.read_text())
            self._metrics([(k, v) for k, v in numbers.items() if k in ("final_test_acc", "best_test_acc", "forgetting")
                           and isinstance(v, (int, float))], step=numbers.get("rounds_done", 0))
        ended = {RunState.FINISHED: "FINISHED", RunState.STOPPED: "KILLED"}.get(status, "FAILED")
        self.client.set_terminated(self.run_id, status=ended)

    def _metrics(self, values: list[tuple[str, float]], step: int) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        metrics = [Metric(re.sub(r"[^\w\-. /]", "_", k), float(v), now, step) for k, v in values if math.isfinite(v)]
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + _BATCH])


def log_report(runs: list[Path], files: list[Path]) -> list[str]:
    """Add ``files`` (a report's tables and figures) under ``report/`` to the MLflow run of each of
    ``runs`` that has one; returns the MLflow run ids."""
    done = []
    for run in runs:
        try:
            held = json.loads((run / RECORD).read_text())
        except (OSError, ValueError):
            continue
        client = _client(held["tracking_uri"])
        for f in files:
            client.log_artifact(held["run_id"], str(f), artifact_path="report")
        done.append(held["run_id"])
    return done
