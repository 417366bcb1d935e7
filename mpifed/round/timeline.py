"""The simulated federation on the server: which clients a round samples and trains, and for how
many local steps, on the virtual clock (``system:`` and ``selection:``; docs/federations.md).

Each round, on rank 0 before anything trains: the clients available at the simulated time
(:class:`~mpifed.federation.clock.Availability`), the selector's pick among them (k times
``system.overcommit``), each one's local work (``system.local_work``), then the clock's plan
(:func:`~mpifed.federation.clock.plan_round`: dropouts, the first k to finish, the deadline). Every
draw is keyed by (run seed, round, client), so the plan is the same in the debug mode, under MPI
and after a resume; what is not a pure function of the key (the simulated time, the selector's
state) is in the checkpoint.

With the clock off, uniform selection and fixed local work, the pick is today's
(:func:`~mpifed.round.plan.sample_clients`) and every client takes its full local work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpifed.local.steps import batches_per_epoch
from mpifed.algorithms.base import ClientReport
from mpifed.data.store import holdout_size
from mpifed.federation import keyed
from mpifed.federation.clock import Availability, Devices, Policy, RoundTiming, plan_round, trace_rows
from mpifed.federation.selection import SELECTORS, Known, Outcome
from mpifed.federation.traces import read_availability_trace, read_device_trace
from mpifed.round.plan import SAMPLING, clients_per_round
from mpifed.round.protocol import Layouts
from mpifed.settings.config import Config

LOCAL_WORK, STRAGGLER, PROBE = 0x10CA, 0x57A6, 0x960B     # keyed streams: the local work's draws, the probe's


@dataclass
class Costs:
    """What one client's round costs the clock: forward passes per sample, and bytes each way."""

    passes: int
    bytes_down: int
    bytes_up: int


@dataclass
class Planned:
    """Who trains in a round, and with how many local steps where fewer than the full work."""

    clients: np.ndarray                                      # the clients that train, sorted
    steps: dict[int, int] = field(default_factory=dict)      # client -> its step limit (absent: the full work)
    sampled: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    timing: RoundTiming | None = None                        # the clock's plan (None: the clock is off)
    probed: int = 0                                          # candidates a probing selector asked for their loss
    probe_seconds: float = 0.0                               # the probe's simulated time (its slowest candidate)


def costs(layouts: Layouts, passes: int) -> Costs:
    """A method's cost on the clock: ``passes`` forward passes per sample; down, the global model and the
    method's down tensors; up, its per-client rows and its summed entries counted as float32 (what a
    client sends; the sums travel as float64 between ranks only to add them up)."""
    up = sum(int(np.prod(e.shape)) * 4 for e in layouts.sums.entries.values()) + layouts.rows.nbytes
    return Costs(passes, layouts.model.nbytes + layouts.down.nbytes, up)


def training_sizes(sizes: np.ndarray, client_holdout: float) -> np.ndarray:
    """Each client's samples to train on: its sample count less the rows data.client_holdout keeps."""
    n = np.asarray(sizes, dtype=np.int64)
    if client_holdout > 0:
        n = n - np.array([holdout_size(int(c), client_holdout) for c in n], dtype=np.int64)
    return n


def full_steps(n: np.ndarray, batch_size: int, local_epochs: int, local_steps: int) -> np.ndarray:
    """Each client's local steps in a round of full work for its ``n`` training samples (as
    :meth:`ClientContext.batches` counts them)."""
    if local_steps:
        return np.full(len(n), local_steps, dtype=np.int64)
    return np.maximum(batches_per_epoch(n, batch_size), 1).astype(np.int64) * local_epochs


class Timeline:
    """The rounds' plans, the simulated clock and the selector's state, on the server."""

    def __init__(self, cfg: Config, sizes: np.ndarray, costs: Costs, traces: dict[str, Path] | None = None) -> None:
        """``traces``: the trace files to read by kind (device, availability), the copies prepared with the data."""
        self.cfg = cfg
        self.system = s = cfg.system
        self.seed = cfg.run.seed
        self.num_clients = len(sizes)
        self.k = clients_per_round(self.num_clients, cfg.train.participation)
        self.costs = costs
        self.selector = SELECTORS.get(cfg.selection.name)(cfg.selection.options)
        self.sim_clock = 0.0
        self.last: Planned | None = None
        self.today = not s.simulated and cfg.selection.name == "uniform"
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.trains_on = None if self.today else training_sizes(sizes, cfg.data.client_holdout)
        self.full = None if self.today else full_steps(self.trains_on, cfg.train.batch_size, cfg.train.local_epochs,
                                                       cfg.train.local_steps)
        self.candidates: np.ndarray | None = None    # a probing selector's candidates of the round being planned
        self.policy = Policy(s.deadline, s.overcommit, s.stragglers, s.dropout)
        self.devices: Devices | None = None
        self.availability: Availability | None = None
        self.known = Known(self.sizes)
        if s.clock:
            traces = traces or {}
            missing = [f"system.{kind}_trace" for kind, given in (("device", s.device_trace),
                                                                  ("availability", s.availability_trace))
                       if given and kind not in traces]
            if missing:
                raise ValueError(f"{', '.join(missing)} is set but the prepared data holds no copy of it: prepare the "
                                 f"data with this config (python -m mpifed.prepare), which copies the traces")
            self.devices, self.availability = self._devices(traces.get("device")), \
                self._availability(traces.get("availability"))
            self.known = Known(self.sizes, self._seconds(np.arange(self.num_clients), self.full))

    def _devices(self, trace_file: Path | None) -> Devices:
        s = self.system
        if trace_file is not None:
            trace = read_device_trace(trace_file)
            return Devices.from_trace(trace, trace_rows(self.num_clients, len(trace), s.trace_mapping, self.seed))
        return Devices.drawn(self.num_clients, self.seed, s.speed_ms, s.speed_sigma, s.bandwidth, s.bandwidth_sigma)

    def _availability(self, trace_file: Path | None) -> Availability:
        s = self.system
        if trace_file is not None:
            trace = read_availability_trace(trace_file)
            return Availability(self.num_clients, self.seed, trace=trace,
                                rows=trace_rows(self.num_clients, len(trace), s.trace_mapping, self.seed))
        if s.availability == "on-off":
            return Availability(self.num_clients, self.seed, on=s.on_period, off=s.off_period)
        return Availability(self.num_clients, self.seed)

    def _seconds(self, ids: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """The simulated seconds of the clients ``ids`` taking ``steps`` local steps (no deadline)."""
        d, c = self.devices, self.costs
        comm = (c.bytes_down + c.bytes_up) * 8 / 1000 / d.kbit_per_s[ids]
        return comm + d.ms_per_sample[ids] / 1000 * self.cfg.train.batch_size * c.passes * steps

    # ------------------------------------------------------------ a round
    def _available(self) -> np.ndarray:
        if self.availability is None or self.availability.always:
            return np.arange(self.num_clients)
        return np.flatnonzero(self.availability.mask(self.sim_clock))

    @property
    def probes(self) -> bool:
        """Whether the selector asks candidates for their loss on the global model before each plan."""
        return self.selector.probes

    def probe(self, rnd: int) -> np.ndarray:
        """Round ``rnd`` (0-based)'s candidates of a probing selector, whose losses :meth:`probed` takes."""
        available = self._available()
        wanted = self.policy.sampled(self.k) if self.system.clock else self.k
        rng = keyed.generator(self.seed, PROBE, rnd)
        self.candidates = self.selector.candidates(rnd + 1, available, wanted, rng, self.known) if len(available) \
            else np.zeros(0, dtype=np.int64)
        return self.candidates

    def probed(self, losses: dict[int, float]) -> None:
        """The candidates' losses on the global model (each on its training samples)."""
        self.known.losses = losses

    def _probe_seconds(self, ids: np.ndarray) -> float:
        """The probe's simulated time: its slowest candidate's downlink and forward pass over its samples."""
        if not len(ids):
            return 0.0
        d = self.devices
        seconds = self.costs.bytes_down * 8 / 1000 / d.kbit_per_s[ids] + \
            d.ms_per_sample[ids] / 1000 * self.trains_on[ids]
        return float(seconds.max())

    def plan(self, rnd: int) -> Planned:
        """Round ``rnd`` (0-based)'s clients and their step limits (a probing selector's after :meth:`probe`
        and :meth:`probed`)."""
        rng = keyed.generator(self.seed, SAMPLING, rnd)   # today's sampling draw, for the same (seed, round)
        if self.today:
            picked = self.selector.select(rnd + 1, np.arange(self.num_clients), self.k, rng, self.known)
            self.last = Planned(picked, sampled=picked)
            return self.last
        available = self._available() if self.candidates is None else self.candidates
        wanted = self.policy.sampled(self.k) if self.system.clock else self.k
        picked = self.selector.select(rnd + 1, available, wanted, rng, self.known) if len(available) else \
            np.zeros(0, dtype=np.int64)
        probed, self.candidates = (0 if self.candidates is None else len(self.candidates)), None
        steps = self._local_work(rnd + 1, picked)
        if not self.system.clock:
            self.last = Planned(picked, {c: n for c, n in steps.items() if n < self.full[c]}, sampled=picked,
                                probed=probed)
            return self.last
        c = self.costs
        timing = plan_round(self.seed, rnd + 1, picked, self.k, self.devices, self.policy, steps,
                            self.cfg.train.batch_size, c.passes, c.bytes_down, c.bytes_up)
        kept = np.array(timing.kept, dtype=np.int64)
        self.last = Planned(kept, {cid: n for cid, n in timing.steps.items() if n < self.full[cid]}, picked, timing,
                            probed, self._probe_seconds(available) if probed else 0.0)
        return self.last

    def clock_after(self) -> float:
        """The simulated clock once the round just planned is over (without the virtual clock: 0, as now)."""
        timing = self.last.timing if self.last is not None else None
        return self.sim_clock if timing is None else self.sim_clock + self.last.probe_seconds + timing.sim_time

    def _local_work(self, server_round: int, ids: np.ndarray) -> dict[int, int]:
        """Each client's local steps this round (``system.local_work``)."""
        full = self.full[ids]
        work = self.system.local_work
        if work == "uniform":
            full = 1 + (keyed.uniform(self.seed, LOCAL_WORK, server_round, ids) * full).astype(np.int64)
        elif work == "straggler":
            slow = (keyed.uniform(self.seed, STRAGGLER, server_round, ids) < self.system.straggler_share) & (full > 1)
            fewer = 1 + (keyed.uniform(self.seed, LOCAL_WORK, server_round, ids) * (full - 1)).astype(np.int64)
            full = np.where(slow, fewer, full)
        return {int(c): int(n) for c, n in zip(ids, full)}

    def finished(self, rnd: int, reports: list[ClientReport]) -> dict[str, Any]:
        """Round ``rnd`` trained: the selector learns from it, the clock moves on; returns the
        metrics row's simulated figures (none with the clock off) and each client's simulated seconds."""
        planned = self.last
        timing = planned.timing
        by_client = {r.cid: r for r in reports}
        outcomes = [Outcome(int(c), int(c) in by_client, timing.seconds[int(c)] if timing else 0.0,
                            by_client[int(c)].samples if int(c) in by_client else 0,
                            by_client[int(c)].train_loss if int(c) in by_client else None)
                    for c in planned.sampled]
        self.selector.observe(rnd + 1, outcomes)
        if timing is None:
            return {}
        sim_time = planned.probe_seconds + timing.sim_time
        self.sim_clock += sim_time
        for r in reports:
            r.extra["sim_seconds"] = min(timing.seconds[r.cid], self.system.deadline or timing.seconds[r.cid])
        return {"sim_time": sim_time, "sim_clock": self.sim_clock,
                "bytes_down": self.costs.bytes_down * (len(planned.sampled) + planned.probed),
                "bytes_up": self.costs.bytes_up * len(planned.clients),
                "dropped": len(timing.dropped), "stragglers": len(timing.stragglers)}

    # ------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"sim_clock": self.sim_clock, "selector": self.selector.state_dict()}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.sim_clock = saved["sim_clock"]
        self.selector.load_state_dict(saved["selector"])
