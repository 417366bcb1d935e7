"""The run directory ``runs/<name>/`` and atomic writes of everything in it.

    config.yaml      the resolved configuration
    metrics.jsonl    one line per round (appended; cut back to the checkpoint on resume)
    clients.jsonl    per round: each sampled client's worker, samples, loss, time (likewise)
    summary.json     final and best accuracy, forgetting, timing, status
    status.json      running | stopped (resumable) | finished | failed
    model.pt         the final global model (state_dict)
    log.txt          what rank 0 printed, plus each rank's host and device
    checkpoints/     see checkpoint.py
    client_state/    see client_state.py
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import yaml


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside ``path``, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.checkpoints = path / "checkpoints"
        self.client_state = path / "client_state"
        self.console: Callable[[str], None] = lambda message: print(message, flush=True)
        self._log = None

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        self._log = open(self.path / "log.txt", "a", buffering=1)

    def holds_run(self) -> bool:
        return (self.path / "config.yaml").exists()

    def log(self, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.console(message)
        if self._log is not None:
            self._log.write(f"{stamp} {message}\n")

    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False))

    def read_config(self) -> dict[str, Any]:
        return yaml.safe_load((self.path / "config.yaml").read_text())

    def append_row(self, name: str, row: dict[str, Any]) -> None:
        """Append one complete line to a .jsonl log (one write, then flushed to disk)."""
        with open(self.path / name, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_rows(self, name: str, rows: list[dict[str, Any]]) -> None:
        """Replace a .jsonl log (atomically) with ``rows``."""
        atomic_write(self.path / name, "".join(json.dumps(r) + "\n" for r in rows))

    def keep_rounds(self, name: str, rounds_done: int) -> None:
        """Rewrite a .jsonl log (atomically) without the lines of rounds after ``rounds_done``."""
        path = self.path / name
        lines = path.read_text().splitlines() if path.exists() else []
        kept = [line for line in lines if (r := _round_of(line)) is not None and r <= rounds_done]
        atomic_write(path, "".join(line + "\n" for line in kept))

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        atomic_write(self.path / name, json.dumps(data, indent=1) + "\n")

    def read_json(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.path / name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _round_of(line: str) -> int | None:
    """The round of a .jsonl line; None for a blank line or one cut short by a crash mid-append."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row.get("round", 0) if isinstance(row, dict) else None
