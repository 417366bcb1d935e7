"""Checkpoints: written atomically, verified before they are loaded.

A checkpoint file is a 12-byte magic, the SHA-256 of the payload, the payload's length,
then the payload (``torch.save`` of a dict). A truncated or altered file fails the
check and is reported, never loaded. ``checkpoints/round_000010.ckpt`` holds the state
after 10 completed rounds; older files are deleted only once a newer one is complete.
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from mpifed.files.nofollow import LinkRefused, read_bytes
from mpifed.run.rundir import write_then_rename

MAGIC = b"MPIFEDCKPT1\n"
RUN_STATE = ("rounds_done", "global_floats", "global_ints", "algorithm", "metrics", "config", "config_math")
_NAME = re.compile(r"^round_(\d{6})\.ckpt$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated or corrupt."""


def path_for(folder: Path, rounds_done: int) -> Path:
    return folder / f"round_{rounds_done:06d}.ckpt"


def save(folder: Path, rounds_done: int, payload: dict[str, Any], keep: int) -> Path:
    """Write the checkpoint after ``rounds_done`` rounds; keep the newest ``keep`` files."""
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    path = path_for(folder, rounds_done)
    write_then_rename(path, path.with_name(path.name + f".tmp{os.getpid()}"),
                      MAGIC + hashlib.sha256(data).digest() + len(data).to_bytes(8, "little") + data)
    for old in all_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load(path: Path, trusted: bool = False) -> dict[str, Any]:
    """Read and verify a checkpoint. Its payload is read without running code (tensors, numbers,
    strings, lists and dicts only: all an mpifed checkpoint holds); one that holds other Python
    objects is refused unless ``trusted`` (``--trust-checkpoint``), since unpickling them runs code
    from the file, and its checksum proves only that it was not altered since it was written, not
    who wrote it."""
    try:
        raw = read_bytes(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except LinkRefused as exc:
        raise CheckpointError(str(exc)) from None
    head = len(MAGIC) + 32 + 8
    if len(raw) < head or not raw.startswith(MAGIC):
        raise CheckpointError(f"{path} is not an mpifed checkpoint (bad header); delete it to resume from the one "
                              "before")
    digest = raw[len(MAGIC): len(MAGIC) + 32]
    length = int.from_bytes(raw[len(MAGIC) + 32: head], "little")
    data = raw[head:]
    if len(data) != length:
        raise CheckpointError(f"{path} is truncated ({len(data)} of {length} bytes); delete it to resume from the one "
                              "before")
    if hashlib.sha256(data).digest() != digest:
        raise CheckpointError(f"{path} is corrupt (checksum mismatch); delete it to resume from the one before")
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=not trusted)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        raise CheckpointError(f"{path} holds a Python object{what} beyond the tensors and plain values of an mpifed "
                              f"checkpoint, and loading it would run code from the file, so it was not loaded. If it "
                              f"comes from someone you trust (a checkpoint of an older mpifed, or of your own plugin "
                              f"that keeps such state), resume with --trust-checkpoint") from None
    return payload


def load_run_state(path: Path, trusted: bool = False) -> dict[str, Any]:
    """A run's checkpoint (:func:`load`) with every entry a resume reads, its ``rounds_done`` the
    round its name says, else a CheckpointError."""
    payload = load(path, trusted)
    missing = [k for k in RUN_STATE if k not in payload] if isinstance(payload, dict) else list(RUN_STATE)
    if missing:
        raise CheckpointError(f"{path} is not a checkpoint of an mpifed run (it lacks {', '.join(missing)}); delete "
                              f"it to resume from the one before")
    named = _NAME.match(path.name)
    done = payload["rounds_done"]
    if named and (type(done) is not int or done != int(named.group(1))):
        raise CheckpointError(f"{path} records another number of finished rounds than the {int(named.group(1))} "
                              f"its name says: it was renamed or edited; delete it to resume from the one before")
    return payload


def rounds_done(path: Path) -> int:
    """The number of completed rounds a checkpoint file holds, from its name."""
    return int(_NAME.match(path.name).group(1))


def all_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoint files, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.match(p.name))


def latest(folder: Path) -> Path | None:
    found = all_checkpoints(folder)
    return found[-1] if found else None
