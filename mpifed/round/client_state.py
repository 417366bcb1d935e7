"""Per-client state that persists across rounds (SCAFFOLD's control variate, MOON's previous model).

A method declares its per-client state (``Messages.client_state``); each client's state is
one packed buffer. A worker keeps the states of the clients it trained in memory, within
``resources.client_state_mb``; what does not fit is written to the run directory
(``client_state/<cid>/r<round>.bin``, the round the client last trained in). When a client
is next trained by another worker, the round protocol moves its state there (point to
point), so with enough memory a state is written to disk only at checkpoints:
:meth:`ClientStates.flush` writes every state changed since the last flush before the
server writes a checkpoint, which keeps resume exact.

Versions on disk that a resume from any checkpoint still on disk could need are kept, older
ones deleted; a resume discards the versions written after its checkpoint.

A state file is ``MPIFEDCS``, the SHA-256 of the state, then the state: a damaged file is refused,
not used. The server says in each round's plan the round each client last trained in, so a
state that should be there and is not (a deleted file) is an error, never a client trained from
zeros or from an older state. (A file of exactly the state's size without the header was written
by an earlier mpifed and is read as it is.)
"""
from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mpifed.files.nofollow import LinkRefused, read_bytes
from mpifed.round.protocol import Layout
from mpifed.run.rundir import write_then_rename

_VERSION = re.compile(r"^r(\d+)\.bin$")
_MAGIC = b"MPIFEDCS"
_HEADER = len(_MAGIC) + 32


class ClientStateError(RuntimeError):
    """A stored client state is unreadable or has the wrong size."""


@dataclass
class _Entry:
    round: int          # the round the client last trained in
    buf: np.ndarray     # the packed state (uint8)
    dirty: bool         # not yet written to disk


class ClientStates:
    """One worker's client states: memory (least recently used beyond the budget spills to disk) and disk."""

    def __init__(self, root: Path, layout: Layout, budget_mb: int) -> None:
        self.root = root
        self.layout = layout
        self.budget = budget_mb * 2**20
        self._memory: OrderedDict[int, _Entry] = OrderedDict()

    # ------------------------------------------------------------ one client
    def get(self, cid: int, last: int | None) -> dict[str, torch.Tensor] | None:
        """The client's state after round ``last``, the round it last trained in (copies); None when it
        has not trained yet (``last`` None)."""
        if last is None:
            return None
        return {k: v.clone() for k, v in self.layout.views(self._entry(cid, last).buf).items()}

    def put(self, cid: int, rnd: int, state: dict[str, torch.Tensor], keep_from: int) -> None:
        """Keep the client's state after round ``rnd``; spill the least recently used beyond the budget."""
        self._memory[cid] = _Entry(rnd, self.layout.pack(state), dirty=True)
        self._memory.move_to_end(cid)
        while self._memory and self._bytes() > self.budget:
            old_cid, old = self._memory.popitem(last=False)
            if old.dirty:
                self._write(old_cid, old, keep_from)

    def export(self, cid: int, last: int) -> np.ndarray:
        """The client's state after round ``last`` as one buffer to send to another worker (the round
        first, as int64), dropped from this worker's memory."""
        entry = self._entry(cid, last)
        self._memory.pop(cid, None)
        head = np.array([entry.round, int(entry.dirty)], dtype=np.int64).view(np.uint8)
        return np.concatenate([head, entry.buf])

    def adopt(self, cid: int, message: np.ndarray) -> None:
        """Take a state that :meth:`export` produced on another worker."""
        rnd, dirty = message[:16].view(np.int64)
        self._memory[cid] = _Entry(int(rnd), message[16:].copy(), bool(dirty))
        self._memory.move_to_end(cid)

    @property
    def message_bytes(self) -> int:
        return 16 + self.layout.nbytes

    # ------------------------------------------------------------ all clients
    def flush(self, keep_from: int) -> None:
        """Write every state changed since the last flush (before a checkpoint)."""
        for cid, entry in self._memory.items():
            if entry.dirty:
                self._write(cid, entry, keep_from)

    # ------------------------------------------------------------ disk
    def _bytes(self) -> int:
        return sum(e.buf.nbytes for e in self._memory.values())

    def _versions(self, cid: int) -> list[int]:
        folder = self.root / str(cid)
        if not folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _VERSION.match(p.name)))

    def _entry(self, cid: int, last: int) -> _Entry:
        """The client's state after round ``last``: in memory, else its file (checked)."""
        entry = self._memory.get(cid)
        if entry is not None and entry.round == last:
            return entry
        path = self.root / str(cid) / f"r{last}.bin"
        try:
            raw = read_bytes(path)
        except FileNotFoundError:
            raise ClientStateError(f"client {cid}'s state after round {last + 1} is missing ({path}): the run's "
                                   f"client_state/ has lost a file the method needs, and training the client from "
                                   f"another state would change the results. Put the file back, or start the run "
                                   f"again with --overwrite") from None
        except (LinkRefused, OSError) as exc:
            raise ClientStateError(f"client {cid}'s state {path} cannot be read ({exc})") from None
        return _Entry(last, self._payload(path, raw), dirty=False)

    def _payload(self, path: Path, raw: bytes) -> np.ndarray:
        if raw[:len(_MAGIC)] == _MAGIC:
            payload = raw[_HEADER:]
            if hashlib.sha256(payload).digest() != raw[len(_MAGIC):_HEADER]:
                raise ClientStateError(f"{path} is damaged (its content does not match its SHA-256), so the client's "
                                       f"state is unknown. Put back an intact copy, or start the run again with "
                                       f"--overwrite")
        elif len(raw) == self.layout.nbytes:   # written before the header existed
            payload = raw
        else:
            raise ClientStateError(f"{path} is not a client state of this run (no mpifed header, {len(raw)} bytes): "
                                   f"put back the run's own file, or start the run again with --overwrite")
        if len(payload) != self.layout.nbytes:
            raise ClientStateError(f"{path} holds {len(payload)} bytes of state, the method's client state has "
                                   f"{self.layout.nbytes}: the file is from another run; put back the run's own "
                                   f"file, or start the run again with --overwrite")
        return np.frombuffer(payload, dtype=np.uint8).copy()

    def _write(self, cid: int, entry: _Entry, keep_from: int) -> None:
        folder = self.root / str(cid)
        folder.mkdir(parents=True, exist_ok=True)
        payload = entry.buf.tobytes()
        write_then_rename(folder / f"r{entry.round}.bin", folder / f".r{entry.round}.bin.tmp{os.getpid()}",
                          _MAGIC + hashlib.sha256(payload).digest() + payload)
        entry.dirty = False
        needed = [v for v in self._versions(cid) if v < keep_from]
        oldest_needed = needed[-1] if needed else 0
        for v in self._versions(cid):
            if v < oldest_needed:
                (folder / f"r{v}.bin").unlink(missing_ok=True)


def discard_from(root: Path, rnd: int) -> None:
    """Delete every stored version written in round ``rnd`` or later, and leftovers of interrupted
    writes (on resume from the checkpoint after ``rnd`` rounds)."""
    if not root.is_dir():
        return
    for folder in root.iterdir():
        for p in folder.iterdir():
            m = _VERSION.match(p.name)
            if (m and int(m.group(1)) >= rnd) or p.name.startswith("."):
                p.unlink(missing_ok=True)
