"""The asynchronous server's run (``aggregation: fedbuff`` or ``fedasync``; docs/federations.md): one
server step at a time, every collective of a step written once, as :mod:`mpifed.round.protocol`
does for a round (the debug mode walks the same steps in one process)::

    order      server -> all       the step's updates in event order (client, dispatch sequence, start
                                   version, learning rate), which worker trains which, evaluate? stop?
    versions   server -> all       the current integer buffers and the whole downlinks (the model and the
                                   method's down tensors) of the versions the step's clients started from
                                   that no step broadcast before (Bcast, one buffer); every worker caches
                                   the downlinks a client in flight may still need
    (local training)               each taken client trained by the method's client role, unchanged,
                                   with its start version's downlink (its round that version's: v + 1);
                                   its seed keyed by its dispatch sequence number
    models     all -> server       each trained model, one row per update (Gatherv), put in event order
    buffers    all -> server       the integer buffers times samples, and the samples (Reduce; exact sums)
    reports    all -> server       small per-client figures (gather of objects)
    evaluation server -> all -> server   as a round's (every ``run.eval_every`` steps)

The server plans each step from the event queue before anything trains
(:meth:`~mpifed.federation.async_server.AsyncServer.plan`), applies the rule's step through the
server optimiser on the models in event order, whatever the rank count, records the step (one row of
metrics.jsonl) and checkpoints as a round does.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from mpifed.algorithms.base import Downlink, ProtocolError
from mpifed.comm.collectives import Comm
from mpifed.federation.async_server import StepPlan
from mpifed.local.optim import round_lr
from mpifed.round.plan import RoundPlan
from mpifed.round.protocol import Layouts, RoundProtocol, _timed
from mpifed.round.signals import received

if TYPE_CHECKING:
    from mpifed.round.server import RoundServer
    from mpifed.round.worker import Worker


@dataclass
class StepOrder:
    """Broadcast to every rank at the start of a server step (a small pickled object)."""

    plan: RoundPlan                                   # round: the new version less 1; evaluate; stop
    entries: list[tuple[int, int, int, float]] = field(default_factory=list)   # per update, in event order:
                                                      # (client, dispatch sequence, start version, learning rate)
    assignment: list[list[int]] = field(default_factory=list)   # per worker: the entries (indices) it trains
    new: list[int] = field(default_factory=list)      # the versions this step broadcasts (no earlier step did)
    keep: list[int] = field(default_factory=list)     # the versions a worker keeps cached (the others are dropped)


def assign_entries(cids: list[int], sizes: np.ndarray, workers: int) -> list[list[int]]:
    """The step's updates (by index; a client may train twice in one step) split over workers, balancing
    their sample counts (largest first to the least loaded); each worker's in event order."""
    load = np.zeros(workers, dtype=np.int64)
    out: list[list[int]] = [[] for _ in range(workers)]
    for i in sorted(range(len(cids)), key=lambda i: (-int(sizes[cids[i]]), i)):
        w = int(np.argmin(load))
        out[w].append(i)
        load[w] += int(sizes[cids[i]])
    return [sorted(a) for a in out]


class AsyncProtocol(RoundProtocol):
    """Walks the server steps of an asynchronous run on one rank, with the roles this rank plays."""

    def __init__(self, layouts: Layouts, world: Comm, peers: Comm, server: RoundServer | None,
                 worker: Worker | None) -> None:
        carried = [what for what, layout in (("client statistics", layouts.statistics),
                                              ("client state", layouts.client_state)) if layout.entries]
        if carried:
            raise ProtocolError(f"the method declares that it runs asynchronously, but its messages hold "
                                f"{' and '.join(carried)}, which the asynchronous server does not carry: "
                                f"statistics are summed over one round's clients and a client's state assumes "
                                f"rounds (docs/federations.md, Asynchronous FL); set aggregation=sync")
        super().__init__(layouts, world, peers, server, worker, clients_per_round=0)
        self._pending: StepPlan | None = None      # the server's plan of the step under way (rank 0)
        self._sent: set[int] = set()               # the versions every worker holds (rank 0's record)
        # version -> its float state and the method's down tensors made for it (a worker's cache)
        self._cache: dict[int, tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}
        self._ints = torch.zeros(0, dtype=torch.int64)   # the integer buffers each client starts from
        self._reports: list = []                   # its clients' reports, in event order

    def round(self) -> bool:
        """One server step on this rank; False once the server has said stop."""
        server, worker, world = self.server, self.worker, self.world
        times: dict[str, float] = {}
        start = time.perf_counter()
        order = self._order() if server else None
        world.sync("start of server step")
        order = world.bcast_object(order, what="server step: broadcast")
        if order.plan.stop:
            self._stop(order.plan)
            return False
        self._versions(order)
        with _timed(times, "local_training"):
            rows, buffers, reports = self._train(order) if worker else self._nothing()
            world.sync("end of local training")
        with _timed(times, "uplink"):
            per_update = self.layouts.model.entries["weights"].nbytes
            counts = [len(a) * per_update for a in order.assignment]
            if world.size > 1:
                counts = [0] + counts     # rank 0 (the server) trains no client under MPI
            gathered_rows = world.gatherv(rows, counts, np.zeros(sum(counts), np.uint8) if server else None,
                                          what="models: gather")
            totals = world.reduce_sum(buffers, what="integer buffers: reduction")
            failure = worker.failure if worker else None
            gathered = world.gather_object((reports, received(), failure), what="reports: gather")
        if server:
            failures = [f for _, _, f in gathered if f is not None]
            if failures:
                raise server.method_failed(failures)
            with _timed(times, "aggregate"):
                self._apply(order, gathered_rows, totals, [r for part, _, _ in gathered for r in part])
        if order.plan.evaluate:
            with _timed(times, "evaluation"):
                self._evaluate(order.plan)
        if server:
            times["round"] = time.perf_counter() - start
            stops = [(rank, names) for rank, (_, names, _) in enumerate(gathered) if names]
            server.end_step(self._pending, self._reports, times, stops)
        return True

    # ---------------------------------------------------------------- the server's side
    def _order(self) -> StepOrder:
        server = self.server
        if server.stopping:
            return StepOrder(RoundPlan(round=server.rounds_done, lr=0.0, stop=True))
        steps = server.steps
        plan = self._pending = steps.plan()
        train = server.cfg.train
        entries = [(e.cid, e.seq, e.start_version, round_lr(train, e.start_version)) for e in plan.taken]
        assignment = assign_entries([e.cid for e in plan.taken], server.manifest.client_sizes, server.workers)
        new = sorted({e.start_version for e in plan.taken} - self._sent)
        keep = sorted(steps.versions)
        self._sent = (self._sent | set(new)) & set(keep)
        evaluate = server.evaluate_now(plan.version, plan.sim_time)
        return StepOrder(RoundPlan(round=plan.version - 1, lr=round_lr(train, plan.version - 1), evaluate=evaluate),
                         entries, assignment, new, keep)

    def _versions(self, order: StepOrder) -> None:
        """The current integer buffers and the downlinks of the step's new start versions on every rank, as
        one buffer (per version its float state, then the method's down tensors); each worker caches the
        versions in ``order.keep``."""
        ints = self.layouts.model.entries["ints"].nbytes
        weights = self.layouts.model.entries["weights"].nbytes
        down = self.layouts.down
        stride = -(-weights // 8) * 8 + down.nbytes      # each part 8-byte aligned
        buf = np.zeros(ints + stride * len(order.new), dtype=np.uint8)
        parts = [buf[ints + i * stride: ints + (i + 1) * stride] for i in range(len(order.new))]
        if self.server:
            buf[:ints] = self.server.global_ints.cpu().numpy().view(np.uint8)
            steps = self.server.steps
            for part, v in zip(parts, order.new):
                part[:weights] = steps.versions[v].cpu().float().numpy().view(np.uint8)
                down.pack(steps.downlinks[v], part[stride - down.nbytes:])
        self.world.bcast_buffer(buf, what="versions in flight: broadcast")
        if not self.worker:
            return
        self._ints = torch.from_numpy(buf[:ints].view(np.int64).copy())
        for part, v in zip(parts, order.new):
            sent = {k: t.clone() for k, t in down.views(part[stride - down.nbytes:]).items()}
            self._cache[v] = torch.from_numpy(part[:weights].view(np.float32).copy()), sent
        self._cache = {v: d for v, d in self._cache.items() if v in set(order.keep)}

    def _apply(self, order: StepOrder, rows: np.ndarray, totals: np.ndarray, reports: list) -> None:
        """The step's models in event order through the rule and the server optimiser."""
        server = self.server
        per_update = self.layouts.model.entries["weights"].nbytes
        position = [i for a in order.assignment for i in a]     # the gathered rows' order: worker by worker
        models: list[torch.Tensor | None] = [None] * len(order.entries)
        for k, i in enumerate(position):
            row = rows[k * per_update: (k + 1) * per_update].view(np.float32)
            models[i] = torch.from_numpy(row.copy()).to(server.device)
        by_seq = {r.extra["seq"]: r for r in reports}
        self._reports = [by_seq[seq] for _, seq, _, _ in order.entries]
        for report, event, staleness in zip(self._reports, self._pending.taken, self._pending.staleness):
            report.extra.update({"start_version": event.start_version, "staleness": staleness, "sim_end": event.end})
        new = server.steps.apply(self._pending, models, server.optimizer)
        samples = torch.from_numpy(totals[-1:].copy())
        ints = torch.round(torch.from_numpy(totals[:-1].copy()) / samples).to(torch.int64)
        with server.method_hooks(order.plan):
            server.stepped(self._pending, new, ints)

    # ---------------------------------------------------------------- the worker's side
    def _train(self, order: StepOrder) -> tuple[np.ndarray, np.ndarray, list]:
        """This worker's updates of the step: their trained models (rows), integer buffers times samples
        and samples (summed), and reports."""
        worker = self.worker
        mine = order.assignment[worker.index]
        per_update = self.layouts.model.entries["weights"].nbytes
        rows = np.zeros(len(mine) * per_update, dtype=np.uint8)
        num_ints = self.layouts.model.entries["ints"].shape[0]
        buffers = np.zeros(num_ints + 1, dtype=np.float64)
        reports = []
        for k, i in enumerate(mine):
            cid, seq, start, lr = order.entries[i]
            assignment: list[list[int]] = [[] for _ in order.assignment]
            assignment[worker.index] = [cid]
            plan = RoundPlan(round=start, lr=lr, assignment=assignment, seed_key=seq)   # round start + 1's downlink
            weights, sent = self._cache[start]
            worker.start_round(plan, Downlink(weights, self._ints, sent, self.layouts.down.what))
            trained = worker.train(plan)
            if worker.failure is not None:   # reported by rank 0 after the step's gather
                return np.zeros_like(rows), buffers, []
            report = trained.reports[0]
            report.extra["seq"] = seq
            reports.append(report)
            rows[k * per_update: (k + 1) * per_update] = worker.flat.floats.detach().cpu().float().numpy().view(
                np.uint8)
            buffers[:-1] += worker.flat.ints.cpu().double().numpy() * report.samples
            buffers[-1] += report.samples
        return rows, buffers, reports

    def _nothing(self) -> tuple[np.ndarray, np.ndarray, list]:
        num_ints = self.layouts.model.entries["ints"].shape[0]
        return np.zeros(0, dtype=np.uint8), np.zeros(num_ints + 1, dtype=np.float64), []

