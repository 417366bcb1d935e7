"""Per-client state that persists across rounds (SCAFFOLD's control variate, MOON's previous model).

A method declares its per-client state (``Messages.client_state``); each client's state is one
packed buffer, the same size for every client. A worker keeps the states of the clients it trained
in memory, within ``resources.client_state_mb``; what does not fit is written to the run's store.
When a client is next trained by another worker, the round protocol moves its state there (point to
point), so with enough memory a state is written to disk only at checkpoints:
:meth:`ClientStates.flush` writes every state changed since the last flush before the server writes
a checkpoint, which keeps resume exact.

The store, ``client_state/`` in the run directory, packs clients many to a file (a million clients
are a few hundred files, not a million)::

    store.json           the state's size, the versions kept per client, the clients per file
    block_00000.bin ...  clients 0..4095, each with ``versions`` fixed-size slots

A slot is ``MPIFEDCS``, the client id and the round the client last trained in (int64), the SHA-256
of the state, then the state; a slot never written (a hole of the sparse file) is empty. A client's
slots are found from its id alone, so nothing reads the store at start-up, whatever the number of
clients. A new version goes into a slot no resume can need: the slot of a version from the same
round or later (left by an attempt a resume abandoned), else an empty one, else the oldest version
that no checkpoint on disk needs. So a write cut short by a crash damages nothing a resume reads, and
a resume discards nothing. ``versions`` is ``run.keep_checkpoints + 1``: one for each checkpoint a
resume could start from, one for the version being written.

Only the worker training a client writes its slots; workers write disjoint slots of a file, a slot
page-aligned when a state is a page or more.

A damaged slot is refused, not used. The server says in each round's plan the round each client
last trained in, so a state that should be there and is not is an error, never a client trained
from zeros or from an older state.

store.json is checked before anything is read or allocated by it: its ``format`` must be 1 (the
only one there has been), ``state_bytes`` the method's, ``slot_bytes`` what they make,
``clients_per_file`` 1 to 4,096 (every mpifed wrote 4,096), and ``versions`` 2 to the larger of
this run's ``run.keep_checkpoints + 1`` and ``train.rounds + 1`` (a run has no more checkpoints
than rounds; a resume that lowered ``keep_checkpoints`` below the store's is told the value to
set). Block files without store.json are refused, never read with a layout guessed from the
config: a wrong guess reads and writes other clients' slots.

A run of an earlier mpifed kept a file per client and version (``client_state/<cid>/r<round>.bin``);
a version the store lacks is read from there when the file carries ``MPIFEDCS`` and the SHA-256 of
its state (checked, as a slot is; its client and round are those of its path). Files of the
earliest layout, the state alone, are refused, naming that layout: nothing in them can be checked.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mpifed.files.nofollow import LinkRefused, open_at, read_bytes
from mpifed.round.protocol import Layout
from mpifed.run.rundir import write_then_rename

CLIENTS_PER_FILE = 4096
FORMAT = 1
PAGE = 4096
_MAGIC = b"MPIFEDCS"
_HEADER = len(_MAGIC) + 16 + 32     # magic, (client, round) as int64, SHA-256
_LEGACY_HEADER = len(_MAGIC) + 32


class ClientStateError(RuntimeError):
    """A stored client state is unreadable or has the wrong size."""


@dataclass
class _Entry:
    round: int          # the round the client last trained in
    buf: np.ndarray     # the packed state (uint8)
    dirty: bool         # not yet written to disk


@dataclass(frozen=True)
class _Shape:
    """How the store lays out its slots (kept in store.json: a resume uses the store's own)."""

    state_bytes: int
    versions: int
    clients_per_file: int = CLIENTS_PER_FILE

    @property
    def slot_bytes(self) -> int:
        size = _HEADER + self.state_bytes
        align = PAGE if self.state_bytes >= PAGE else 64
        return -(-size // align) * align

    def place(self, cid: int) -> tuple[str, int]:
        """The file of client ``cid`` and the offset of its first slot."""
        block, j = divmod(cid, self.clients_per_file)
        return f"block_{block:05d}.bin", j * self.versions * self.slot_bytes


class ClientStates:
    """One worker's client states: memory (least recently used beyond the budget spills to disk) and disk."""

    def __init__(self, root: Path, layout: Layout, budget_mb: int, versions: int, rounds: int = 0) -> None:
        """``versions``: the versions per client a new store keeps (``run.keep_checkpoints + 1``);
        ``rounds``: the run's ``train.rounds``, with ``versions`` the bound on an existing store's."""
        self.root = root
        self.layout = layout
        self.budget = budget_mb * 2**20
        self._wanted = _Shape(layout.nbytes, max(2, versions))
        self._most_versions = max(self._wanted.versions, rounds + 1)
        self._shape: _Shape | None = None
        self._memory: OrderedDict[int, _Entry] = OrderedDict()
        self._held = 0                 # bytes in memory
        self._unsynced: set[Path] = set()

    # ------------------------------------------------------------ one client
    def get(self, cid: int, last: int | None) -> dict[str, torch.Tensor] | None:
        """The client's state after round ``last``, the round it last trained in (copies); None when it
        has not trained yet (``last`` None)."""
        if last is None:
            return None
        return {k: v.clone() for k, v in self.layout.views(self._entry(cid, last).buf).items()}

    def put(self, cid: int, rnd: int, state: dict[str, torch.Tensor], resume_rounds: tuple[int, ...]) -> None:
        """Keep the client's state after round ``rnd``; spill the least recently used beyond the budget
        (``resume_rounds``: the rounds a resume could start at, whose versions stay on disk)."""
        self._keep(cid, _Entry(rnd, self.layout.pack(state), dirty=True))
        while self._memory and self._held > self.budget:
            old_cid, old = self._memory.popitem(last=False)
            self._held -= old.buf.nbytes
            if old.dirty:
                self._write(old_cid, old, resume_rounds)

    def export(self, cid: int, last: int) -> np.ndarray:
        """The client's state after round ``last`` as one buffer to send to another worker (the round
        first, as int64), dropped from this worker's memory."""
        entry = self._entry(cid, last)
        if self._memory.pop(cid, None) is not None:
            self._held -= entry.buf.nbytes
        head = np.array([entry.round, int(entry.dirty)], dtype=np.int64).view(np.uint8)
        return np.concatenate([head, entry.buf])

    def adopt(self, cid: int, message: np.ndarray) -> None:
        """Take a state that :meth:`export` produced on another worker."""
        rnd, dirty = message[:16].view(np.int64)
        self._keep(cid, _Entry(int(rnd), message[16:].copy(), bool(dirty)))

    @property
    def message_bytes(self) -> int:
        return 16 + self.layout.nbytes

    # ------------------------------------------------------------ all clients
    def flush(self, resume_rounds: tuple[int, ...]) -> None:
        """Write every state changed since the last flush, and make the store's writes durable
        (before a checkpoint)."""
        for cid, entry in self._memory.items():
            if entry.dirty:
                self._write(cid, entry, resume_rounds)
        for path in sorted(self._unsynced):
            fd = self._open_written(path, write=False)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._unsynced.clear()

    def locate(self, cid: int, last: int) -> tuple[Path, int] | None:
        """The file and offset of the slot holding client ``cid``'s state after round ``last``; None
        when the store has none."""
        shape = self._store_shape()
        name, base = shape.place(cid)
        path = self.root / name
        if not path.is_file():
            return None
        fd = open_at(path, write=False)
        try:
            for v, (owner, rnd) in enumerate(self._headers(fd, shape, base)):
                if owner == cid and rnd == last:
                    return path, base + v * shape.slot_bytes
        finally:
            os.close(fd)
        return None

    # ------------------------------------------------------------ memory
    def _keep(self, cid: int, entry: _Entry) -> None:
        old = self._memory.pop(cid, None)
        if old is not None:
            self._held -= old.buf.nbytes
        self._memory[cid] = entry
        self._held += entry.buf.nbytes

    def _entry(self, cid: int, last: int) -> _Entry:
        """The client's state after round ``last``: in memory, else in the store (checked), else in a
        file of an earlier mpifed's layout."""
        entry = self._memory.get(cid)
        if entry is not None and entry.round == last:
            return entry
        try:
            found = self.locate(cid, last)
            if found is not None:
                return _Entry(last, self._read_slot(cid, last, *found), dirty=False)
            legacy = self.root / str(cid) / f"r{last}.bin"
            if legacy.is_file():
                return _Entry(last, self._legacy_payload(legacy, read_bytes(legacy)), dirty=False)
        except (LinkRefused, OSError) as exc:
            raise ClientStateError(f"client {cid}'s state cannot be read from {self.root} ({exc})") from None
        if not self.root.is_dir():
            raise ClientStateError(f"{self.root} is missing: it held the clients' states (client {cid}'s after round "
                                   f"{last + 1}, among others) that the method needs, and training the clients from "
                                   f"other states would change the results. Put the folder back as it was, or start "
                                   f"the run again with --overwrite")
        raise ClientStateError(f"client {cid}'s state after round {last + 1} is missing from {self.root}: the "
                               f"run's client_state/ has lost what the method needs, and training the client from "
                               f"another state would change the results. Put the folder back as it was, or start "
                               f"the run again with --overwrite")

    # ------------------------------------------------------------ disk
    def _store_shape(self) -> _Shape:
        """The store's layout: its store.json's (checked), else this run's (written with the first state)."""
        if self._shape is None:
            path = self.root / "store.json"
            if not path.is_file():
                blocks = self._blocks()
                if not blocks:
                    return self._wanted
                if not path.is_file():   # looked again: another worker writes store.json before its first block
                    raise ClientStateError(
                        f"{self.root} holds client-state blocks ({blocks[0]}) but no store.json, which says how "
                        f"they are laid out, so they cannot be read safely. Put back the run's store.json, or start "
                        f"the run again with --overwrite")
            self._shape = self._read_shape(path)
        return self._shape

    def _blocks(self) -> list[str]:
        """The names of up to one block file of the store (none where the folder is absent)."""
        try:
            with os.scandir(self.root) as entries:
                return next(([e.name] for e in entries if e.name.startswith("block_") and e.name.endswith(".bin")),
                            [])
        except FileNotFoundError:
            return []

    def _read_shape(self, path: Path) -> _Shape:
        """The layout store.json records, each count checked against what a run like this one writes."""
        def damaged(problem: str) -> ClientStateError:
            return ClientStateError(f"{path} is damaged ({problem}): put back the run's own file, or start the run "
                                    f"again with --overwrite")
        try:
            if path.stat().st_size > 4096:
                raise damaged(f"{path.stat().st_size} bytes, where mpifed writes about 100")
            meta = json.loads(read_bytes(path))
        except (OSError, ValueError) as exc:
            raise damaged(str(exc)) from None
        if not isinstance(meta, dict):
            raise damaged("not a JSON object")
        if meta.get("format") != FORMAT:
            has = f"format {json.dumps(meta['format'])[:40]}" if "format" in meta else "no format"
            raise ClientStateError(f"{path} says the client states are in {has}; this mpifed reads format {FORMAT} "
                                   f"only, so it cannot tell how they are laid out. Resume the run with the mpifed "
                                   f"that wrote them, or start it again with --overwrite")
        counts = {k: meta.get(k) for k in ("state_bytes", "versions", "clients_per_file")}
        for key, value in counts.items():
            if type(value) is not int:
                raise damaged(f"{key} is {json.dumps(value)[:40]}, not a whole number")
        shape = _Shape(**counts)
        if shape.state_bytes != self.layout.nbytes:
            raise ClientStateError(f"{self.root} holds client states of {shape.state_bytes} bytes, and this "
                                   f"method's have {self.layout.nbytes}: the folder is another run's; put back "
                                   f"the run's own, or start the run again with --overwrite")
        if not 1 <= shape.clients_per_file <= CLIENTS_PER_FILE:
            raise damaged(f"clients_per_file is {shape.clients_per_file}, where mpifed writes 1 to "
                          f"{CLIENTS_PER_FILE:,}")
        if not 2 <= shape.versions <= self._most_versions:
            more = (f" (if the run kept more checkpoints when it started, resume it with --set "
                    f"run.keep_checkpoints={shape.versions - 1})" if shape.versions > self._most_versions else "")
            raise ClientStateError(f"{path} gives each client {shape.versions} versions, where this run keeps 2 to "
                                   f"{self._most_versions} (run.keep_checkpoints + 1, or train.rounds + 1): the file "
                                   f"was edited or is another run's. Put back the run's own file, or start the run "
                                   f"again with --overwrite{more}")
        if meta.get("slot_bytes", shape.slot_bytes) != shape.slot_bytes:
            raise damaged(f"slot_bytes is {json.dumps(meta['slot_bytes'])[:40]}, and its states of "
                          f"{shape.state_bytes} bytes make slots of {shape.slot_bytes}")
        return shape

    def _create_store(self) -> _Shape:
        shape = self._store_shape()
        if self._shape is None:
            self.root.mkdir(parents=True, exist_ok=True)
            meta = {"format": FORMAT, "state_bytes": shape.state_bytes, "versions": shape.versions,
                    "clients_per_file": shape.clients_per_file, "slot_bytes": shape.slot_bytes}
            write_then_rename(self.root / "store.json", self.root / f".store.json.tmp{os.getpid()}",
                              json.dumps(meta, indent=1).encode())
            self._shape = shape
        return shape

    @staticmethod
    def _headers(fd: int, shape: _Shape, base: int) -> list[tuple[int, int]]:
        """(client, round) of each of a client's slots; (-1, -1) for an empty one."""
        out = []
        for v in range(shape.versions):
            head = os.pread(fd, _HEADER, base + v * shape.slot_bytes)
            if len(head) == _HEADER and head[:len(_MAGIC)] == _MAGIC:
                owner, rnd = np.frombuffer(head, dtype=np.int64, count=2, offset=len(_MAGIC))
                out.append((int(owner), int(rnd)))
            else:
                out.append((-1, -1))
        return out

    def _read_slot(self, cid: int, last: int, path: Path, offset: int) -> np.ndarray:
        fd = open_at(path, write=False)
        try:
            raw = os.pread(fd, _HEADER + self.layout.nbytes, offset)
        finally:
            os.close(fd)
        payload = raw[_HEADER:]
        if len(payload) != self.layout.nbytes or hashlib.sha256(payload).digest() != raw[_HEADER - 32:_HEADER]:
            raise ClientStateError(f"client {cid}'s state after round {last + 1} in {path} is damaged (its content "
                                   f"does not match its SHA-256), so the client's state is unknown. Put back an "
                                   f"intact copy of the folder, or start the run again with --overwrite")
        return np.frombuffer(payload, dtype=np.uint8).copy()

    def _write(self, cid: int, entry: _Entry, resume_rounds: tuple[int, ...]) -> None:
        shape = self._create_store()
        name, base = shape.place(cid)
        path = self.root / name
        payload = entry.buf.tobytes()
        head = _MAGIC + np.array([cid, entry.round], dtype=np.int64).tobytes() + hashlib.sha256(payload).digest()
        fd = self._open_written(path, write=True)
        try:
            slot = _free_slot(self._headers(fd, shape, base), cid, entry.round, resume_rounds)
            os.pwrite(fd, head + payload, base + slot * shape.slot_bytes)
        finally:
            os.close(fd)
        self._unsynced.add(path)
        entry.dirty = False

    def _open_written(self, path: Path, write: bool) -> int:
        """A descriptor of a block file of the store this worker writes, or a ClientStateError when the
        store was deleted while the run used it."""
        try:
            return open_at(path, write=write)
        except FileNotFoundError:
            raise ClientStateError(f"{self.root} (or its {path.name}) was deleted while the run was using it: it "
                                   f"held the clients' states that the run and its checkpoints need, so the run "
                                   f"cannot go on exactly. Put the folder back as it was, or start the run again "
                                   f"with --overwrite") from None

    def _legacy_payload(self, path: Path, raw: bytes) -> np.ndarray:
        """A state file of an earlier mpifed: ``MPIFEDCS``, the SHA-256, the state. (Earlier still, a
        file held the state alone: refused, since nothing in it can be checked.)"""
        if raw[:len(_MAGIC)] != _MAGIC:
            raise ClientStateError(f"{path} is not a client state mpifed can check: it lacks the MPIFEDCS header "
                                   f"and SHA-256 of one ({len(raw)} bytes; the earliest per-client layout held the "
                                   f"state alone, which nothing can tell from a damaged or foreign file). This "
                                   f"mpifed needs a store "
                                   f"(client_state/store.json, format {FORMAT}) or per-client files with the header; "
                                   f"put back the run's own file, or start the run again with --overwrite")
        payload = raw[_LEGACY_HEADER:]
        if hashlib.sha256(payload).digest() != raw[len(_MAGIC):_LEGACY_HEADER]:
            raise ClientStateError(f"{path} is damaged (its content does not match its SHA-256), so the client's "
                                   f"state is unknown. Put back an intact copy, or start the run again with "
                                   f"--overwrite")
        if len(payload) != self.layout.nbytes:
            raise ClientStateError(f"{path} holds {len(payload)} bytes of state, the method's client state has "
                                   f"{self.layout.nbytes}: the file is from another run; put back the run's own "
                                   f"file, or start the run again with --overwrite")
        return np.frombuffer(payload, dtype=np.uint8).copy()


def _free_slot(slots: list[tuple[int, int]], cid: int, rnd: int, resume_rounds: tuple[int, ...]) -> int:
    """The slot for client ``cid``'s version of round ``rnd``, given its slots' (client, round).

    In order: the slot already holding round ``rnd``; one holding a later round (from an attempt a
    resume abandoned: within an attempt a client's versions only grow); an empty one; the oldest
    version no resume round needs (a resume at round R needs the newest version before R); last,
    the version only the oldest resume round needs.
    """
    rounds = [r if owner == cid else -1 for owner, r in slots]
    for want in (lambda r: r == rnd, lambda r: r > rnd, lambda r: r < 0):
        for v, r in enumerate(rounds):
            if want(r):
                return v
    needed: dict[int, int] = {}     # slot -> the oldest resume round that needs it
    for start in sorted(resume_rounds, reverse=True):
        before = [(r, v) for v, r in enumerate(rounds) if r < start]
        if before:
            needed[max(before)[1]] = start
    free = [(r, v) for v, r in enumerate(rounds) if v not in needed]
    if free:
        return min(free)[1]
    return min(needed, key=lambda v: needed[v])
