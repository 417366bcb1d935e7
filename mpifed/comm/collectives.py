"""Collectives between ranks: buffer-based MPI, or trivial in the single-process debug mode.

Every collective is named by the caller (``what``): the round protocol and the start-up
name their phases, and a collective that does not complete is reported under that name.

Collectives here never wait on their own. Wherever ranks may arrive at very different
times (a worker waiting for the next round while the server evaluates, the server
waiting for the slowest worker), the round code first calls :meth:`Comm.sync`: ranks
announce their arrival with small non-blocking messages and *sleep* between checks, so
that waiting ranks yield the CPU to the ranks still training (MPI's blocking calls
busy-poll). ``sync`` also names the ranks that do not arrive within the timeout and
ends the job.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np

from mpifed.comm.handoff import launched_by_mpi

_SYNC_TAG = 7301
_MOVE_TAG = 7401


def _summable(buf: np.ndarray) -> np.ndarray:
    if buf.dtype not in (np.float64, np.int64):
        raise TypeError(f"reductions sum float64 or int64 buffers, not {buf.dtype} (view a packed buffer as float64)")
    return buf


class Comm:
    """The single-process group: every collective returns its own input."""

    rank = 0
    size = 1

    def __init__(self, timeout_s: float = 3600.0, poll_ms: float = 2.0) -> None:
        self.timeout_s = timeout_s
        self.poll_s = poll_ms / 1000.0
        self.context: Callable[[], str] = lambda: ""
        self.hosts: dict[int, str] = {}   # world rank -> host name, for messages (rank 0 learns all at start-up)
        self.on_abort: Callable[[str], None] | None = None  # records why, before an abort ends the job

    def fail(self, message: str) -> None:
        """End the whole job because of ``message``: print it, let :attr:`on_abort` record it, abort."""
        sys.stderr.write(message)
        if self.on_abort is not None:
            try:
                self.on_abort(message.strip())
            except Exception as exc:  # recording is best effort; the abort must happen
                sys.stderr.write(f"[mpifed] could not record the failure: {exc}\n")
        self.abort(1)

    def world_rank(self, rank: int) -> int:
        return rank

    def where(self, world_rank: int) -> str:
        """``rank 2 on n3`` (``rank 2`` while its host is not known here), for messages."""
        host = self.hosts.get(world_rank)
        return f"rank {world_rank} on {host}" if host else f"rank {world_rank}"

    def sync(self, what: str) -> float:
        """Wait (yielding the CPU) until every rank has arrived here; returns the seconds waited."""
        return 0.0

    def bcast_object(self, obj: Any, *, what: str, root: int = 0) -> Any:
        """``root``'s small picklable ``obj`` on every rank."""
        return obj

    def bcast_buffer(self, buf: np.ndarray, *, what: str, root: int = 0) -> None:
        """Broadcast a contiguous numpy buffer in place."""

    def reduce_sum(self, buf: np.ndarray, *, what: str, root: int = 0) -> np.ndarray | None:
        """Element-wise sum of every rank's ``buf`` (float64 or int64) on ``root``; None elsewhere."""
        return _summable(buf)

    def allreduce_sum(self, buf: np.ndarray, *, what: str) -> np.ndarray:
        return _summable(buf)

    def gather_object(self, obj: Any, *, what: str, root: int = 0) -> list[Any] | None:
        """Every rank's small picklable ``obj``, in rank order, on ``root``; None elsewhere."""
        return [obj]

    def gatherv(self, buf: np.ndarray, counts: list[int], recv: np.ndarray | None, *, what: str,
                root: int = 0) -> np.ndarray | None:
        """Rank r's ``buf`` (``counts[r]`` bytes, uint8) concatenated in rank order into ``recv`` on ``root``."""
        return buf

    def workers(self) -> "Comm":
        """The group of the worker ranks (1..N-1), for their exchanges among themselves; every rank
        calls it. In the debug mode, and on the server rank, a single-process stand-in."""
        return Comm(self.timeout_s, self.poll_s * 1000.0)

    def exchange(self, sends: list[tuple[int, int, np.ndarray]], recvs: list[tuple[int, int, np.ndarray]]) -> None:
        """Point to point: each (peer, key, buffer) of ``sends`` goes to that peer, each of ``recvs`` is
        filled from it; between two ranks, sends and receives pair up in list order."""
        if sends or recvs:
            raise RuntimeError("a single process has no peer to exchange buffers with")

    def abort(self, code: int = 1) -> None:
        sys.stderr.flush()
        sys.stdout.flush()
        raise SystemExit(code)


class MpiComm(Comm):
    """A group of MPI ranks (``comm`` is an mpi4py communicator)."""

    def __init__(self, comm: Any, timeout_s: float = 3600.0, poll_ms: float = 2.0) -> None:
        super().__init__(timeout_s, poll_ms)
        from mpi4py import MPI
        self._mpi = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._world = MPI.COMM_WORLD.Get_group()
        self.hosts[self.world_rank(self.rank)] = socket.gethostname()
        self._token = np.zeros(max(1, self.size), dtype=np.int64)
        self._go = np.zeros(1, dtype=np.int64)

    def world_rank(self, rank: int) -> int:
        return self._mpi.Group.Translate_ranks(self.comm.Get_group(), [rank], self._world)[0]

    def _limit(self) -> float:
        # the group's rank 0 can name the missing ranks, so the others give it time to do so first
        return self.timeout_s if self.rank == 0 else self.timeout_s + max(30.0, 0.5 * self.timeout_s)

    def _poll(self, requests: list[Any], what: str, missing: Callable[[], list[int]]) -> float:
        start = time.perf_counter()
        pause = min(50e-6, self.poll_s)
        limit = self._limit()
        while not self._mpi.Request.Testall(requests):
            waited = time.perf_counter() - start
            # sleep at most 0.5% of the time waited so far (and at most poll_ms): long waits wake
            # rarely, short ones add little latency
            pause = min(pause * 2, max(50e-6, waited / 200), self.poll_s)
            if waited > limit:
                lost = ", ".join(self.where(self.world_rank(r)).removeprefix("rank ") for r in missing())
                extra = self.context()
                self.fail(
                    f"\n[mpifed] {self.where(self.world_rank(self.rank))}: rank(s) {lost} did not reach '{what}' "
                    f"within {limit:.0f} s (comm.timeout_s={self.timeout_s:g}): a rank hung or died. Ending the "
                    f"job.{extra}\n")
            time.sleep(pause)
        return time.perf_counter() - start

    def sync(self, what: str) -> float:
        """A handshake with rank 0: arrival, go, acknowledgement. A rank that stops before it has
        acted on the go (even if its arrival was already delivered) is named by rank 0."""
        if self.size == 1:
            return 0.0
        if self.rank == 0:
            peers = range(1, self.size)
            recvs = [self.comm.Irecv(self._token[i:i + 1], source=i, tag=_SYNC_TAG) for i in peers]
            waited = self._poll(recvs, what, lambda: [i for i, r in zip(peers, recvs) if not r.Test()])
            self._mpi.Request.Waitall([self.comm.Isend(self._go, dest=i, tag=_SYNC_TAG + 1) for i in peers])
            acks = [self.comm.Irecv(self._token[i:i + 1], source=i, tag=_SYNC_TAG + 2) for i in peers]
            self._poll(acks, what, lambda: [i for i, r in zip(peers, acks) if not r.Test()])
            return waited
        send = self.comm.Isend(self._token[:1], dest=0, tag=_SYNC_TAG)
        go = self.comm.Irecv(self._go, source=0, tag=_SYNC_TAG + 1)
        waited = self._poll([send, go], what, lambda: [0])
        self.comm.Isend(self._token[:1], dest=0, tag=_SYNC_TAG + 2).Wait()
        return waited

    @contextmanager
    def _watchdog(self, what: str):
        """End the job if a blocking collective does not complete (a rank hung or died inside it)."""
        limit = self._limit()

        def stuck() -> None:
            self.fail(f"\n[mpifed] {self.where(self.world_rank(self.rank))}: '{what}' has not completed after "
                      f"{limit:.0f} s (comm.timeout_s={self.timeout_s:g}): a rank hung or died during "
                      f"the transfer. Ending the job.{self.context()}\n")

        timer = threading.Timer(limit, stuck)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def bcast_object(self, obj: Any, *, what: str, root: int = 0) -> Any:
        with self._watchdog(what):
            return self.comm.bcast(obj, root=root)

    def bcast_buffer(self, buf: np.ndarray, *, what: str, root: int = 0) -> None:
        with self._watchdog(what):
            self.comm.Bcast(buf, root=root)

    def reduce_sum(self, buf: np.ndarray, *, what: str, root: int = 0) -> np.ndarray | None:
        _summable(buf)
        with self._watchdog(what):
            if self.rank == root:
                self.comm.Reduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM, root=root)
                return buf
            self.comm.Reduce(buf, None, op=self._mpi.SUM, root=root)
        return None

    def allreduce_sum(self, buf: np.ndarray, *, what: str) -> np.ndarray:
        _summable(buf)
        with self._watchdog(what):
            self.comm.Allreduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM)
        return buf

    def gather_object(self, obj: Any, *, what: str, root: int = 0) -> list[Any] | None:
        with self._watchdog(what):
            return self.comm.gather(obj, root=root)

    def gatherv(self, buf: np.ndarray, counts: list[int], recv: np.ndarray | None, *, what: str,
                root: int = 0) -> np.ndarray | None:
        if buf.nbytes != counts[self.rank]:
            raise RuntimeError(f"rank {self.rank} sends {buf.nbytes} bytes where the layout expects "
                               f"{counts[self.rank]}")
        with self._watchdog(what):
            if self.rank == root:
                total = sum(counts)
                displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
                self.comm.Gatherv(buf, [recv[:total], counts, displs, self._mpi.BYTE], root=root)
                return recv[:total]
            self.comm.Gatherv(buf, None, root=root)
        return None

    def exchange(self, sends: list[tuple[int, int, np.ndarray]], recvs: list[tuple[int, int, np.ndarray]]) -> None:
        # one tag for all: MPI delivers the messages between two ranks in the order they were posted,
        # and both sides post them in the order of the (same) list of moves
        requests = [self.comm.Isend(buf, dest=peer, tag=_MOVE_TAG) for peer, _, buf in sends]
        requests += [self.comm.Irecv(buf, source=peer, tag=_MOVE_TAG) for peer, _, buf in recvs]
        self._poll(requests, "moves of client state between workers", lambda: sorted({p for p, _, _ in sends + recvs}))

    def workers(self) -> Comm:
        sub = self.comm.Split(1 if self.rank > 0 else self._mpi.UNDEFINED, self.rank)
        if self.rank == 0:
            return Comm(self.timeout_s, self.poll_s * 1000.0)
        group = MpiComm(sub, self.timeout_s, self.poll_s * 1000.0)
        group.on_abort = self.on_abort
        return group

    def abort(self, code: int = 1) -> None:
        sys.stderr.flush()
        sys.stdout.flush()
        self._mpi.COMM_WORLD.Abort(code)


def world() -> tuple[Any, int, int]:
    """(mpi4py COMM_WORLD or None, rank, size). MPI is initialised only under an MPI launcher
    (mpirun, mpiexec, srun), or when MPIFED_MPI=1; MPIFED_MPI=0 forces the debug mode."""
    forced = os.environ.get("MPIFED_MPI")
    comm, rank, size = None, 0, 1
    if forced == "1" or (forced != "0" and launched_by_mpi()):
        from mpi4py import MPI
        comm, rank, size = MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1") or 1)
    if size == 1 and tasks > 1 and forced != "0":
        raise SystemExit(
            f"[mpifed] srun started {tasks} tasks, but each sees an MPI world of 1 process: srun's --mpi "
            f"plugin does not match the MPI library (Open MPI 5 needs --mpi=pmix; see srun --mpi=list), "
            f"or launch with mpirun inside the allocation (LAUNCHER=mpirun for the scripts in slurm/)")
    return comm, rank, size
