"""The round protocol: every collective of a round, in order, written once.

Every rank walks :meth:`RoundProtocol.round`: rank 0 as the server, ranks 1..N-1 as
workers, and the single process of the debug mode as both. Each phase is one collective
whose sending and receiving sides stand next to each other, so the server and the
workers cannot disagree about the sequence; whether an optional phase happens is decided
by the broadcast plan or by the layouts, which every rank builds the same. What travels is
laid out once, in :class:`Layouts`, from the method's ``Messages``::

    probe        server -> all -> server   a probing selector's (selection: pow_d) candidates and the global
                                     model out, each candidate's loss on it back (optional: every rank knows
                                     from the config; the downlink then need not send the model again)
    plan         server -> all       which clients train where, the learning rate, evaluate? stop?
    migrate      worker -> worker    client state held by another worker (point to point)
    downlink     server -> all       the global model and the method's down tensors (Bcast); after an
                                     evaluated round only the method's tensors (the evaluation sent the
                                     model), unless the method evaluates another model (plan.model_held)
    statistics   workers <-> workers sums over the round's clients before training (Allreduce; optional)
    (local training)
    uplink       all -> server       sums over the round's clients (Reduce)
    per-client   all -> server       one row per client (Gatherv into one buffer; optional)
    reports      all -> server       small per-client figures (gather of objects)
    evaluation   server -> all -> server   the test and validation sets split over workers (optional)
    stop         all -> server       flush client state; resource usage

The server and worker sides are the callbacks of :class:`ServerSide` and :class:`WorkerSide`
(implemented by :mod:`mpifed.round.server` and :mod:`mpifed.round.worker`); no callback sends anything.
"""
from __future__ import annotations

import resource
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, ContextManager, Iterator, Protocol

import numpy as np
import torch

from mpifed.algorithms.base import ClientReport, Downlink, Fields, Messages, ProtocolError, Replies
from mpifed.comm.collectives import Comm
from mpifed.round.method_errors import HookFailure
from mpifed.round.plan import RoundPlan
from mpifed.round.signals import received

__all__ = ["Layout", "Layouts", "ProtocolError", "RoundProtocol", "Trained", "build_layouts"]


@dataclass(frozen=True)
class Entry:
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


class Layout:
    """Named arrays of fixed shapes and dtypes in one contiguous, 8-byte-aligned byte buffer."""

    def __init__(self, what: str, spec: dict[str, tuple[tuple[int, ...], Any]]) -> None:
        self.what = what
        self.entries: dict[str, Entry] = {}
        offset = 0
        for name, (shape, dtype) in spec.items():
            entry = Entry(tuple(int(s) for s in shape), np.dtype(dtype), offset)
            self.entries[name] = entry
            offset += -(-entry.nbytes // 8) * 8
        self.nbytes = offset

    def empty(self) -> np.ndarray:
        """A zeroed buffer (uint8) for this layout."""
        return np.zeros(self.nbytes, dtype=np.uint8)

    def views(self, buf: np.ndarray) -> dict[str, torch.Tensor]:
        """Named torch views into ``buf`` (no copies)."""
        return {name: torch.from_numpy(buf[e.offset: e.offset + e.nbytes].view(e.dtype).reshape(e.shape))
                for name, e in self.entries.items()}

    def check(self, tensors: dict[str, torch.Tensor], source: str = "") -> None:
        """Raise :class:`ProtocolError` unless ``tensors`` has every declared name, no other, each
        with its declared number of elements (``source``: the hook that made them, for the message)."""
        by = f" from {source}" if source else ""
        missing = set(self.entries) - set(tensors)
        unknown = set(tensors) - set(self.entries)
        if missing or unknown:
            parts = ([f"missing {sorted(missing)}"] if missing else []) + (
                [f"undeclared {sorted(unknown)}"] if unknown else [])
            raise ProtocolError(f"{self.what}{by}: {'; '.join(parts)} (declared: {sorted(self.entries)}). "
                                f"Return exactly the entries the method's messages() declare")
        for name, t in tensors.items():
            size = int(np.prod(self.entries[name].shape))
            if not isinstance(t, torch.Tensor):
                raise ProtocolError(f"{self.what}{by}: {name!r} is {type(t).__name__}, not a tensor; return a torch "
                                    f"tensor of {size} element(s) (declared shape {self.entries[name].shape})")
            if t.numel() != size:
                raise ProtocolError(f"{self.what}{by}: {name!r} has {t.numel()} elements, its declared shape "
                                    f"{self.entries[name].shape} has {size}")

    def pack(self, tensors: dict[str, torch.Tensor], buf: np.ndarray | None = None) -> np.ndarray:
        """Copy ``tensors`` (any device) into a buffer (or ``buf``, a slice of one); every declared name
        must be given, and no other."""
        self.check(tensors)
        buf = self.empty() if buf is None else buf
        views = self.views(buf)
        for name, t in tensors.items():
            view = views[name]
            view.copy_(t.detach().reshape(view.shape))
        return buf


@dataclass(frozen=True)
class Layouts:
    """What travels in each phase, from the method's messages and the model's size.

    The protocol's own entries have layouts apart from the method's, so every name a method
    declares is its own: the downlink's buffer is ``model`` then ``down``, the uplink's
    ``sums`` then ``model_sums``, each part at a multiple of 8 bytes.
    """

    model: Layout         # the global model: its float state and integer buffers (downlink, evaluation)
    down: Layout          # Messages.down (float32)
    statistics: Layout    # Messages.statistics (float64 sums)
    sums: Layout          # Messages.up "sum" entries (float64)
    model_sums: Layout    # the protocol's sums: the clients' integer buffers and their samples (float64)
    rows: Layout          # Messages.up "per_client" entries: one row (float32)
    evaluation: Layout    # per-batch loss sums, per-class and per-group correct counts (test set); per-batch
                          # loss sums and the correct count (validation set)
    client_state: Layout  # Messages.client_state (float32)

    def downlink_buffer(self) -> np.ndarray:
        """A zeroed downlink buffer: the global model, then the method's down tensors."""
        return np.zeros(self.model.nbytes + self.down.nbytes, dtype=np.uint8)

    def uplink_buffer(self) -> np.ndarray:
        """A zeroed uplink buffer: the method's sums, then the protocol's."""
        return np.zeros(self.sums.nbytes + self.model_sums.nbytes, dtype=np.uint8)

    def uplink_views(self, buf: np.ndarray) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The method's sums and the protocol's, as views into an uplink buffer."""
        return self.sums.views(buf[:self.sums.nbytes]), self.model_sums.views(buf[self.sums.nbytes:])


def build_layouts(messages: Messages, num_floats: int, num_ints: int, test_size: int, eval_batch_size: int,
                  num_classes: int, num_groups: int, val_size: int = 0, method: str = "the method",
                  evaluated_clients: int = 0) -> Layouts:
    """The layouts of a run of ``method`` (its registered name, in error messages); ``evaluated_clients``:
    the clients whose held-out rows are evaluated (all of them, with ``data.client_holdout``; else 0)."""
    sums = {k: (u.shape, np.float64) for k, u in messages.up.items() if u.travel == "sum"}
    return Layouts(
        model=Layout("the global model", {"weights": ((num_floats,), np.float32), "ints": ((num_ints,), np.int64)}),
        down=Layout(f"{method}'s downlink", {k: (s, np.float32) for k, s in messages.down.items()}),
        statistics=Layout(f"{method}'s client statistics",
                          {k: (s, np.float64) for k, s in messages.statistics.items()}),
        sums=Layout(f"{method}'s uplink sums", sums),
        model_sums=Layout("the integer buffers' "
                          "sums", {"ints": ((num_ints,), np.float64), "samples": ((1,), np.float64)}),
        rows=Layout(f"{method}'s per-client uplink", {k: (u.shape, np.float32) for k, u in messages.up.items()
                                                      if u.travel == "per_client"}),
        evaluation=evaluation_layout(test_size, eval_batch_size, num_classes, num_groups, val_size, evaluated_clients),
        client_state=Layout(f"{method}'s client state", {k: (s, np.float32) for k, s in messages.client_state.items()}),
    )


def evaluation_layout(test_size: int, eval_batch_size: int, num_classes: int, num_groups: int,
                      val_size: int = 0, clients: int = 0) -> Layout:
    """The evaluation sums (:func:`mpifed.local.evaluation.evaluate_share`): per test batch its loss, per class
    and per group the correct predictions; per validation batch its loss, and the validation set's correct ones;
    per client (of ``clients``) its held-out rows' loss and correct predictions."""
    return Layout("evaluation sums", {"loss": ((-(-test_size // eval_batch_size),), np.float64),
                                      "correct": ((num_classes,), np.float64),
                                      "group_correct": ((num_groups,), np.float64),
                                      "val_loss": ((-(-val_size // eval_batch_size),), np.float64),
                                      "val_correct": ((1 if val_size else 0,), np.float64),
                                      "client_loss": ((clients,), np.float64),
                                      "client_correct": ((clients,), np.float64)})


@dataclass
class Trained:
    """A worker's round: its uplink sums, its clients' rows (in assignment order), their reports."""

    sums: np.ndarray
    rows: np.ndarray
    reports: list[ClientReport]


class ServerSide(Protocol):
    def probe(self) -> list[list[int]] | None: ...
    def probe_model(self) -> dict[str, torch.Tensor]: ...
    def probed(self, losses: dict[int, float]) -> None: ...
    def plan(self) -> RoundPlan: ...
    def downlink(self, plan: RoundPlan) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]: ...
    def aggregate(self, plan: RoundPlan, replies: Replies, model_sums: dict[str, torch.Tensor]) -> None: ...
    def evaluation_state(self) -> dict[str, torch.Tensor]: ...
    def evaluated(self, plan: RoundPlan, totals: dict[str, torch.Tensor]) -> None: ...
    def end_round(self, plan: RoundPlan, times: dict[str, float], stops: list[tuple[int, list[str]]]) -> None: ...
    def stopped(self, usage: list[Any]) -> None: ...
    def method_hooks(self, plan: RoundPlan) -> ContextManager[None]: ...
    def method_failed(self, failures: list[HookFailure]) -> Exception: ...


class WorkerSide(Protocol):
    index: int

    failure: HookFailure | None   # the method's code raised in this round (reported by rank 0)

    def probe(self, weights: torch.Tensor, ints: torch.Tensor, clients: list[int]) -> list[tuple[int, float]]: ...
    def start_round(self, plan: RoundPlan, down: Downlink) -> None: ...
    def statistics(self, plan: RoundPlan) -> dict[str, torch.Tensor]: ...
    def use_statistics(self, totals: Fields) -> None: ...
    def train(self, plan: RoundPlan) -> Trained: ...
    def flush_states(self, resume_rounds: tuple[int, ...]) -> None: ...
    def export_state(self, cid: int, last: int) -> np.ndarray: ...
    def adopt_state(self, cid: int, message: np.ndarray) -> None: ...
    def state_message_bytes(self) -> int: ...
    def evaluate(self, weights: torch.Tensor, ints: torch.Tensor) -> np.ndarray: ...


def usage() -> tuple[float, float]:
    """This process's peak resident memory (MB) and CPU time (user + system seconds) so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_maxrss / 1024.0, r.ru_utime + r.ru_stime


@contextmanager
def _timed(times: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    times[name] = time.perf_counter() - start


class RoundProtocol:
    """Walks the phases of every round on one rank, with the roles this rank plays."""

    def __init__(self, layouts: Layouts, world: Comm, peers: Comm, server: ServerSide | None,
                 worker: WorkerSide | None, clients_per_round: int, probes: bool = False) -> None:
        self.layouts = layouts
        self.probes = probes        # the selector probes candidates before each plan
        self.world = world
        self.peers = peers          # the workers only (statistics, client-state moves)
        self.server = server
        self.worker = worker
        self._down = layouts.downlink_buffer()
        self._model = layouts.model.empty()
        self._evaluated: np.ndarray | None = None   # the state the last evaluation broadcast
        self._rows = np.zeros(clients_per_round * layouts.rows.nbytes, dtype=np.uint8) if server else None

    def run(self) -> None:
        """Walk rounds until the server says stop."""
        while self.round():
            pass

    def round(self) -> bool:
        """One round on this rank; False once the server has said stop."""
        times: dict[str, float] = {}
        start = time.perf_counter()
        server, worker, world = self.server, self.worker, self.world

        if self.probes:                                                             # probe
            self._probe()
        plan = server.plan() if server else None                                    # plan
        world.sync("start of round")
        plan = world.bcast_object(plan, what="plan: broadcast")
        if plan.stop:
            self._stop(plan)
            return False

        if plan.moves and self.layouts.client_state.entries:                        # migrate
            self._migrate(plan)

        with _timed(times, "downlink"), server.method_hooks(plan) if server else nullcontext():    # downlink
            down = self._downlink(self._packed_downlink(server.downlink(plan)) if server else self._down,
                                  plan.model_held)

        with _timed(times, "local_training"):
            if worker:
                worker.start_round(plan, down)
                if self.layouts.statistics.entries:                                 # statistics
                    sums = self.layouts.statistics.pack(worker.statistics(plan))
                    self.peers.sync("client statistics")
                    self.peers.allreduce_sum(sums.view(np.float64), what="statistics: all-reduce")
                    worker.use_statistics(Fields(self.layouts.statistics.what, self.layouts.statistics.views(sums)))
                trained = worker.train(plan)                                        # (local training)
                if plan.checkpoint:
                    worker.flush_states(plan.resume_rounds)
            else:
                trained = Trained(self.layouts.uplink_buffer(), np.zeros(0, np.uint8), [])
            world.sync("end of local training")

        with _timed(times, "uplink"):
            totals = world.reduce_sum(trained.sums.view(np.float64), what="uplink: reduction")
            rows = self._gather_rows(plan, trained.rows)
            failure = worker.failure if worker else None
            gathered = world.gather_object((trained.reports, received(), failure), what="reports: gather")

        if server:
            failures = [f for _, _, f in gathered if f is not None]
            if failures:   # the method's code raised on a worker: reported once, here
                raise server.method_failed(failures)
            with _timed(times, "aggregate"), server.method_hooks(plan):
                server.aggregate(plan, *self._replies(plan, totals, rows, gathered))

        if plan.evaluate:                                                           # evaluation
            with _timed(times, "evaluation"):
                self._evaluate(plan)

        if server:
            times["round"] = time.perf_counter() - start
            server.end_round(plan, times, [(rank, names) for rank, (_, names, _) in enumerate(gathered) if names])
        return True

    # ---------------------------------------------------------------- phases
    def _stop(self, plan: RoundPlan) -> None:
        if self.worker:
            self.worker.flush_states(plan.resume_rounds)
        gathered = self.world.gather_object(usage(), what="stop: gather of the resource usage")
        if self.server:
            self.server.stopped(gathered)

    def _probe(self) -> None:
        """The candidates (split over the workers) and the global model to every rank, each candidate's loss
        back to the server; afterwards every rank holds the global model, so the downlink need not send it."""
        server, worker, world = self.server, self.worker, self.world
        split = server.probe() if server else None
        world.sync("probe")
        split = world.bcast_object(split, what="probe: broadcast of the candidates")
        if split is None:       # the next plan stops the run
            return
        buf = self.layouts.model.pack(server.probe_model()) if server else self.layouts.model.empty()
        world.bcast_buffer(buf, what="probe: broadcast of the global model")
        views = self.layouts.model.views(buf)
        mine = worker.probe(views["weights"], views["ints"], split[worker.index]) if worker else []
        gathered = world.gather_object(mine, what="probe: gather of the losses")
        self._evaluated = buf
        if server:
            server.probed({cid: loss for part in gathered for cid, loss in part})

    def _migrate(self, plan: RoundPlan) -> None:
        """Each moved client's state goes from the worker that last trained it to its new worker."""
        if not self.worker:
            return
        me = self.worker.index
        sends = [(dst, cid, self.worker.export_state(cid, plan.last_trained[cid])) for cid, src, dst in plan.moves
                 if src == me]
        recvs = [(src, cid, np.empty(self.worker.state_message_bytes(), dtype=np.uint8))
                 for cid, src, dst in plan.moves if dst == me]
        self.peers.exchange(sends, recvs)
        for _, cid, message in recvs:
            self.worker.adopt_state(cid, message)

    def _packed_downlink(self, sent: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]) -> np.ndarray:
        model, down = sent
        buf = self.layouts.downlink_buffer()
        self.layouts.model.pack(model, buf[:self.layouts.model.nbytes])
        self.layouts.down.pack(down, buf[self.layouts.model.nbytes:])
        return buf

    def _downlink(self, buf: np.ndarray, held: bool) -> Downlink:
        """The global model and the method's down tensors, on every rank. When every rank ``held`` the
        global model already (the last evaluation broadcast it, after aggregation, the last change to
        it, and it was the global model, not another one the method reports), only the method's
        tensors travel."""
        evaluated, self._evaluated = self._evaluated, None
        m = self.layouts.model.nbytes
        if not held:
            self.world.bcast_buffer(buf, what="downlink: broadcast")
            model = self.layouts.model.views(buf[:m])
        else:
            model = self.layouts.model.views(evaluated)
            if buf.nbytes > m:
                self.world.bcast_buffer(buf[m:], what="downlink: broadcast")
        return Downlink(model["weights"], model["ints"], self.layouts.down.views(buf[m:]), self.layouts.down.what)

    def _gather_rows(self, plan: RoundPlan, mine: np.ndarray) -> np.ndarray | None:
        row = self.layouts.rows.nbytes
        if not row:
            return None
        counts = [len(a) * row for a in plan.assignment]
        if self.world.size > 1:
            counts = [0] + counts     # rank 0 (the server) trains no client under MPI
        return self.world.gatherv(mine, counts, self._rows, what="per-client: gather")

    def _replies(self, plan: RoundPlan, totals: np.ndarray, rows: np.ndarray | None,
                 gathered: list) -> tuple[Replies, dict[str, torch.Tensor]]:
        """The method's replies, and the protocol's own sums."""
        reports = [r for worker_reports, _, _ in gathered for r in worker_reports]
        order = sorted(range(len(reports)), key=lambda i: reports[i].cid)
        layout = self.layouts.rows
        stacked: dict[str, torch.Tensor] = {}
        if rows is not None:
            per = [layout.views(rows[i * layout.nbytes: (i + 1) * layout.nbytes]) for i in order]
            stacked = {name: torch.stack([p[name] for p in per]) for name in layout.entries}
        sums, model_sums = self.layouts.uplink_views(totals.view(np.uint8))
        return (Replies(Fields(self.layouts.sums.what, sums), Fields(layout.what, stacked),
                        [reports[i] for i in order]),
                model_sums)

    def _evaluate(self, plan: RoundPlan) -> None:
        buf = self.layouts.model.pack(self.server.evaluation_state()) if self.server else self._model
        self.world.sync("evaluation")
        self.world.bcast_buffer(buf, what="evaluation: broadcast of the global model")
        if self.worker:
            views = self.layouts.model.views(buf)
            share = self.worker.evaluate(views["weights"], views["ints"])
        else:
            share = self.layouts.evaluation.empty()
        self.world.sync("end of evaluation")
        totals = self.world.reduce_sum(share.view(np.float64), what="evaluation: reduction")
        if self.server:
            self.server.evaluated(plan, self.layouts.evaluation.views(totals.view(np.uint8)))
        self._evaluated = buf
