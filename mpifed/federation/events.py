"""The asynchronous federation's event queue on the virtual clock: which client trains when, and in
which order the updates arrive (``aggregation: fedbuff`` or ``fedasync``; docs/federations.md).

Up to ``concurrency`` clients train at once. Each dispatch gets the next sequence number; the
client that fills a free slot is a keyed draw (run seed, dispatch sequence) among the clients
available at the simulated time and not already training, and its duration is the clock's for
that client (its keyed device draws: :mod:`mpifed.federation.clock`); a client drops out (never
answers, its slot freed at the time it would have ended) with the clock's ``dropout``
probability, a keyed draw by (seed, sequence, client). Events are ordered by (simulated end time,
sequence, client), so the order of events is a pure function of the seed and the settings, the
same in the debug mode, under MPI and after a resume. :meth:`EventQueue.state_dict` is what a
checkpoint keeps.
"""
from __future__ import annotations

import heapq
from dataclasses import astuple, dataclass
from typing import Any, Callable

import numpy as np

from mpifed.federation import keyed

FILL, DROP = 0xF111, 0xD409     # keyed streams: which client fills a slot, whether a dispatched client drops out


@dataclass(frozen=True, order=True)
class Event:
    """One dispatched client: when its update arrives (``end``, simulated seconds), its dispatch
    sequence number (its training seed's key), its id, the server version it starts from, and whether
    it dropped out (then it brings no update)."""

    end: float
    seq: int
    cid: int
    start_version: int
    dropped: bool = False


class EventQueue:
    """The clients in flight, ordered by (end time, sequence, client).

    ``durations`` gives a client's simulated seconds for one dispatch; ``available`` the boolean
    availability mask of all clients at a simulated time (None: always all); ``idle_wait`` the
    simulated seconds the server waits before it looks again when no client is available and none
    is in flight."""

    def __init__(self, seed: int, num_clients: int, concurrency: int, durations: Callable[[int], float],
                 available: Callable[[float], np.ndarray] | None = None, dropout: float = 0.0,
                 idle_wait: float = 60.0) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency {concurrency}: at least one client must train at once; set it to 1 or more")
        if idle_wait <= 0:
            raise ValueError(f"idle_wait {idle_wait}: the clock must move when no client is available; give a "
                             f"positive number of simulated seconds")
        self.seed, self.num_clients, self.concurrency = seed, num_clients, concurrency
        self.durations, self.available, self.dropout, self.idle_wait = durations, available, dropout, idle_wait
        self.now = 0.0          # simulated seconds
        self.seq = 0            # the next dispatch's sequence number
        self.heap: list[Event] = []

    def __len__(self) -> int:
        return len(self.heap)

    def busy(self) -> set[int]:
        """The clients in flight."""
        return {e.cid for e in self.heap}

    def fill(self, version: int) -> list[Event]:
        """Dispatch clients, starting from server ``version``, to the free slots at the current time;
        returns the new events in dispatch order (fewer than the free slots where too few clients are
        available)."""
        new = []
        free = self.concurrency - len(self.heap)
        if free <= 0:
            return new
        mask = np.ones(self.num_clients, dtype=bool) if self.available is None else \
            np.asarray(self.available(self.now), dtype=bool).copy()
        for cid in self.busy():
            mask[cid] = False
        candidates = np.flatnonzero(mask)
        for _ in range(free):
            if len(candidates) == 0:
                break
            pick = int(keyed.uniform(self.seed, FILL, self.seq, 0) * len(candidates))
            cid = int(candidates[pick])
            candidates = np.delete(candidates, pick)
            dropped = bool(self.dropout > 0 and keyed.uniform(self.seed, DROP, self.seq, cid) < self.dropout)
            event = Event(self.now + float(self.durations(cid)), self.seq, cid, version, dropped)
            heapq.heappush(self.heap, event)
            new.append(event)
            self.seq += 1
        return new

    def pop(self) -> Event | None:
        """The next event: the clock moves to its end time and its slot is free. With nothing in flight
        (no client was available) the clock moves on by ``idle_wait`` and this returns None: fill again."""
        if not self.heap:
            self.now += self.idle_wait
            return None
        event = heapq.heappop(self.heap)
        self.now = event.end
        return event

    def start_versions(self) -> set[int]:
        """The server versions the clients in flight started from."""
        return {e.start_version for e in self.heap}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the time, the next sequence number and the events in flight."""
        return {"now": self.now, "seq": self.seq, "events": [list(astuple(e)) for e in sorted(self.heap)]}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.now, self.seq = float(saved["now"]), int(saved["seq"])
        self.heap = [Event(float(end), int(seq), int(cid), int(v), bool(d)) for end, seq, cid, v, d in saved["events"]]
        heapq.heapify(self.heap)
