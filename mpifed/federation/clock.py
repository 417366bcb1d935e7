"""The virtual clock: how long each sampled client takes in simulated seconds, who answers, and how
much local work each does, planned on the server before a round trains (FedScale's "clairvoyant"
simulation, with every draw keyed by (run seed, round, client): :mod:`mpifed.federation.keyed`).

A client's round time is its communication plus its computation, never measured:

* communication: (downlink bytes + uplink bytes) x 8 / 1000 / its bandwidth in kbit/s;
* computation: its speed in ms per sample / 1000 x the samples its local steps process x the
  method's passes per sample, counted in forward passes: 3 for FedAvg's forward and backward
  (FedScale's factor), plus one per extra forward the method declares (a teacher's, MOON's two).

Speeds and bandwidths come from a device trace (FedScale's ``client_device_capacity``) or are
log-normal around a median (``speed_sigma``, ``bandwidth_sigma``); both are the client's own for
the whole run. A sampled client drops out (never answers) with probability ``dropout`` each
round. Of the clients sampled (k x ``overcommit``), the first k to finish are kept; a kept client
that would end after the ``deadline`` is a straggler: left out (``drop``), or kept with the local
steps it finishes by the deadline (``partial``, as FedNova expects). The round's simulated time is
the last kept client's (the deadline where one was cut or left out); server compute is not on the
clock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mpifed.federation import keyed
from mpifed.federation.traces import AvailabilityTrace, DeviceTrace

SPEED, BANDWIDTH, DROPOUT, PHASE, ROWS = 0x5EED, 0xBA4D, 0xD40F, 0xFA5E, 0x9E43   # keyed streams
FORWARD_BACKWARD = 3     # forward passes a forward and backward pass cost (FedScale's factor)


@dataclass(frozen=True)
class Devices:
    """Every client's speed (ms per sample of one forward pass) and bandwidth (kbit/s)."""

    ms_per_sample: np.ndarray
    kbit_per_s: np.ndarray

    @classmethod
    def drawn(cls, num_clients: int, seed: int, ms_per_sample: float, speed_sigma: float, kbit_per_s: float,
              bandwidth_sigma: float) -> Devices:
        """Log-normal around the medians, each client's draw keyed by (seed, client)."""
        ids = np.arange(num_clients)
        speed = ms_per_sample * np.exp(speed_sigma * keyed.normal(seed, SPEED, 0, ids)) if speed_sigma else \
            np.full(num_clients, float(ms_per_sample))
        band = kbit_per_s * np.exp(bandwidth_sigma * keyed.normal(seed, BANDWIDTH, 0, ids)) if bandwidth_sigma else \
            np.full(num_clients, float(kbit_per_s))
        return cls(speed, band)

    @classmethod
    def from_trace(cls, trace: DeviceTrace, rows: np.ndarray) -> Devices:
        """Client c takes trace row ``rows[c]``."""
        return cls(trace.ms_per_sample[rows], trace.kbit_per_s[rows])


def trace_rows(num_clients: int, trace_length: int, mapping: str, seed: int) -> np.ndarray:
    """The trace row of each client: ``modulo`` (c mod rows) or ``permutation`` (a seeded
    permutation of the rows, then modulo)."""
    rows = np.arange(num_clients) % trace_length
    if mapping == "permutation":
        rows = keyed.generator(seed, ROWS, 0).permutation(trace_length)[rows]
    return rows


class Availability:
    """Which clients can be sampled at a simulated time: all, on-off periods, or a trace."""

    def __init__(self, num_clients: int, seed: int, on: float = 0.0, off: float = 0.0,
                 trace: AvailabilityTrace | None = None, rows: np.ndarray | None = None) -> None:
        self.num_clients = num_clients
        self.on, self.off = on, off
        self.trace, self.rows = trace, rows
        if trace is None and off > 0:   # each client's own phase in its on-off cycle, keyed by (seed, client)
            self.phase = keyed.uniform(seed, PHASE, 0, np.arange(num_clients)) * (on + off)
        if trace is not None:
            self._flat = np.concatenate(trace.windows)
            self._owner = np.repeat(np.arange(len(trace)), [len(w) for w in trace.windows])
            self._starts = np.concatenate([[0], np.cumsum([len(w) for w in trace.windows])[:-1]])

    @property
    def always(self) -> bool:
        return self.trace is None and self.off <= 0

    def mask(self, t: float) -> np.ndarray:
        """Each client's availability at simulated time ``t`` (a boolean per client)."""
        if self.trace is not None:
            period = self.trace.period
            phase = np.where(period > 0, np.fmod(t, np.where(period > 0, period, 1.0)), t)[self._owner]
            inside = (self._flat[:, 0] <= phase) & (phase <= self._flat[:, 1])
            return np.logical_or.reduceat(inside, self._starts)[self.rows]
        if self.off <= 0:
            return np.ones(self.num_clients, dtype=bool)
        return np.fmod(t + self.phase, self.on + self.off) < self.on


@dataclass(frozen=True)
class Policy:
    """The round's rules: ``deadline`` (simulated seconds; 0: none), ``overcommit`` (sample k times
    this), ``stragglers`` (``drop`` or ``partial``), ``dropout`` (probability a sampled client never answers)."""

    deadline: float = 0.0
    overcommit: float = 1.0
    stragglers: str = "drop"
    dropout: float = 0.0

    def sampled(self, k: int) -> int:
        """How many clients to sample for k kept ones."""
        return max(k, math.ceil(k * self.overcommit - 1e-9))


@dataclass
class RoundTiming:
    """What the clock decides for one round, before it trains."""

    kept: list[int]                                           # the clients that train, by id
    steps: dict[int, int]                                     # a kept client's local steps (partial: fewer)
    seconds: dict[int, float]                                 # each sampled client's time (inf: dropped out)
    dropped: list[int] = field(default_factory=list)          # sampled, never answered
    stragglers: list[int] = field(default_factory=list)       # would have ended after the deadline
    left_over: list[int] = field(default_factory=list)        # answered, but after the first k (overcommit)
    sim_time: float = 0.0                                     # the round's simulated seconds


def plan_round(seed: int, server_round: int, sampled: np.ndarray, k: int, devices: Devices, policy: Policy,
               full_steps: dict[int, int], samples_per_step: int, passes: int, bytes_down: int,
               bytes_up: int) -> RoundTiming:
    """The timing of round ``server_round`` for the ``sampled`` clients (k of them to keep):
    ``full_steps`` each client's local steps without a deadline, ``samples_per_step`` the batch
    size, ``passes`` forward passes per sample, ``bytes_down`` and ``bytes_up`` per client."""
    ids = np.asarray(sampled, dtype=np.int64)
    comm = (bytes_down + bytes_up) * 8 / 1000 / devices.kbit_per_s[ids]
    per_step = devices.ms_per_sample[ids] / 1000 * samples_per_step * passes
    steps = np.array([full_steps[int(c)] for c in ids], dtype=np.int64)
    seconds = comm + per_step * steps
    out = keyed.uniform(seed, DROPOUT, server_round, ids) < policy.dropout if policy.dropout > 0 else \
        np.zeros(len(ids), dtype=bool)
    seconds = np.where(out, np.inf, seconds)
    order = sorted(range(len(ids)), key=lambda i: (seconds[i], int(ids[i])))   # ties: by id
    answered = [i for i in order if not out[i]]
    kept_idx, left_over = answered[:k], answered[k:]
    timing = RoundTiming([], {}, {int(c): float(s) for c, s in zip(ids, seconds)},
                         dropped=sorted(int(ids[i]) for i in range(len(ids)) if out[i]),
                         left_over=sorted(int(ids[i]) for i in left_over))
    deadline = policy.deadline
    ends = []
    for i in kept_idx:
        cid = int(ids[i])
        if deadline and seconds[i] > deadline:
            timing.stragglers.append(cid)
            done = int((deadline - comm[i]) // per_step[i]) if deadline > comm[i] else 0
            if policy.stragglers == "drop" or done < 1:
                continue
            timing.steps[cid] = min(done, int(steps[i]))
            ends.append(deadline)
        else:
            timing.steps[cid] = int(steps[i])
            ends.append(float(seconds[i]))
        timing.kept.append(cid)
    timing.kept.sort()
    timing.stragglers.sort()
    # fewer than k answered in time: the server waited until the deadline (without one, for the last answer)
    timing.sim_time = deadline if deadline and len(timing.kept) < k else max(ends, default=0.0)
    return timing
