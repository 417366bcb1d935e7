"""A worker's round, top to bottom: receive, (client statistics), train the assigned clients, evaluate.

Each client's local round is the client role's :meth:`~mpifed.algorithms.base.Client.local_round`
(``begin_client``, ``train``, ``end_client``, ``uplink``) between its state being loaded and its
new state (``end_client``'s) stored, in :meth:`Worker.train`. The role's declared inputs are
zeroed before each round (``round``) and before each client (``client``).

:class:`Worker` is the worker side of :class:`~mpifed.round.protocol.RoundProtocol`: the
protocol calls it between the collectives, on every worker rank, and on the single
process of the debug mode. It holds the method's client role, the clients' data and
their persistent state.

An exception in the method's own hooks does not end the job from this rank: the worker keeps it
(:attr:`Worker.failure`, see :mod:`mpifed.round.method_errors`), trains nothing more this round, and
the round's gather brings it to rank 0, which reports it once.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from mpifed.algorithms.base import Client, ClientContext, ClientReport, Downlink, Fields, Setup, checked, zeros
from mpifed.round.client_state import ClientStates
from mpifed.data.prepared import Manifest
from mpifed.round.method_errors import HookFailure, hook_failure, method_sources
from mpifed.data.store import ClientStore, load_client_batches, load_eval_batches
from mpifed.data.transforms import BatchTransform
from mpifed.local.evaluation import client_loss, evaluate_share
from mpifed.local.inference import InferenceCopy
from mpifed.round.plan import RoundPlan, client_seed
from mpifed.round.protocol import Layouts, ProtocolError, Trained
from mpifed.local.steps import LocalSteps


class Worker:
    """Trains the clients it is given and evaluates its share of the test and validation sets."""

    def __init__(self, index: int, count: int, client: Client, setup: Setup, layouts: Layouts, manifest: Manifest,
                 transform: BatchTransform, seed: int, cache_mb: int, eval_batch_size: int, eval_test: bool,
                 states: ClientStates | None, runner: LocalSteps | None = None, client_holdout: float = 0.0, *,
                 method: str, rank: int) -> None:
        self.index = index
        self.client = client
        self.method = method                 # the method's name, for the report of a failure in its hooks
        self.rank = rank
        self.sources = method_sources(type(client))
        self.failure: HookFailure | None = None   # the method's code raised: nothing more is trained
        self.setup = setup
        self.layouts = layouts
        self.seed = seed
        self.device = setup.device
        self.flat = setup.new_model()
        self.eval_net = InferenceCopy(self.flat)
        self.transform = transform
        self.store = ClientStore(manifest, self.device, cache_mb, client_holdout)
        self.eval_batch_size = eval_batch_size
        self.eval_batches = load_eval_batches(manifest, eval_batch_size, index, count, self.device, eval_test)
        if client_holdout:
            self.eval_batches += load_client_batches(manifest, client_holdout, eval_batch_size, index, count,
                                                     self.device)
        self.states = states
        self.runner = runner or LocalSteps()
        self.down: Downlink | None = None
        self.server_round = 0                # the round under way, counted from 1
        self._fixed: dict[tuple[str, str], torch.Tensor] = {}
        self._declared = set(layouts.sums.entries) | set(layouts.rows.entries)

    # ---------------------------------------------------------------- the round
    def start_round(self, plan: RoundPlan, down: Downlink) -> None:
        self.server_round = plan.number
        self.down = Downlink(self._on_device("model", "weights", down.weights),
                             self._on_device("model", "ints", down.ints),
                             {k: self._on_device("down", k, v) for k, v in down}, self.layouts.down.what)
        self.client.inputs.reset("round")
        self._hook(None, plan.number, lambda: self.client.round_start(plan.number, self.down))

    def _hook(self, cid: int | None, server_round: int, call: Callable[[], Any]) -> Any:
        """``call()`` of the method's code; an exception raised in that code is kept as :attr:`failure`
        (None returned), any other raised as it is."""
        if self.failure is not None:
            return None
        try:
            return call()
        except Exception as exc:
            self.failure = hook_failure(exc, self.method, self.sources, self.rank, cid, server_round)
            if self.failure is None:
                raise
            return None

    def _on_device(self, part: str, name: str, t: torch.Tensor) -> torch.Tensor:
        """``t`` on this worker's device; with captured steps, in a buffer that keeps its address
        from round to round (a graph reads the addresses it was captured with)."""
        if not self.runner.graphs:
            return t.to(self.device)
        fixed = self._fixed.get((part, name))
        if fixed is None or fixed.shape != t.shape or fixed.dtype != t.dtype:
            fixed = self._fixed[(part, name)] = torch.empty_like(t, device=self.device)
        return fixed.copy_(t)

    def statistics(self, plan: RoundPlan) -> dict[str, torch.Tensor]:
        """This worker's clients' contributions to the method's statistics, summed."""
        layout = self.layouts.statistics
        sums = {k: torch.zeros(e.shape, dtype=torch.float64) for k, e in layout.entries.items()}
        for cid in plan.assignment[self.index]:
            found = self._hook(cid, plan.number, lambda: self.client.statistics(self.store.get(cid), self.transform))
            if self.failure is not None:
                break
            mine = checked(layout.what, layout.entries, found, f"{type(self.client).__name__}.statistics")
            for k, v in mine:
                sums[k] += v.detach().cpu().double().reshape(sums[k].shape)
        return sums

    def use_statistics(self, totals: Fields) -> None:
        moved = Fields(self.layouts.statistics.what, {k: v.to(self.device) for k, v in totals})
        self._hook(None, self.server_round, lambda: self.client.use_statistics(moved))

    def train(self, plan: RoundPlan) -> Trained:
        """Train this worker's clients of ``plan``: the uplink sums, their rows and reports."""
        clients = plan.assignment[self.index]
        sums_buf = self.layouts.uplink_buffer()
        sums, model_sums = self.layouts.uplink_views(sums_buf)
        row = self.layouts.rows
        rows = np.zeros(len(clients) * row.nbytes, dtype=np.uint8)
        reports = []
        for i, cid in enumerate(clients):
            start = time.perf_counter()
            ctx = self._context(plan, cid)
            self.client.inputs.reset("client")
            up = self._hook(cid, plan.number, lambda: self.client.local_round(ctx))
            if self.failure is not None:   # reported by rank 0 after the round's gather: nothing of it is sent
                return Trained(self.layouts.uplink_buffer(), np.zeros_like(rows), [])
            self._check(up, ctx)
            for k in sums:
                sums[k] += up[k].detach().cpu().double().reshape(sums[k].shape)
            if row.entries:
                row.pack({k: up[k].float() for k in row.entries}, rows[i * row.nbytes: (i + 1) * row.nbytes])
            model_sums["ints"] += ctx.flat.ints.cpu().double() * ctx.num_samples
            model_sums["samples"] += ctx.num_samples
            if self.states is not None:
                state = dict(iter(ctx.new_state))
                self.layouts.client_state.check(state, f"{type(self.client).__name__}.end_client (client {cid}, "
                                                       f"round {plan.number})")
                self.states.put(cid, plan.round, state, plan.resume_rounds)
            reports.append(ClientReport(cid, self.index, ctx.num_samples, ctx.steps, ctx.loss_sum / max(ctx.seen, 1),
                                        time.perf_counter() - start, ctx.extra))
        return Trained(sums_buf, rows, reports)

    def _check(self, up: dict[str, torch.Tensor], ctx: ClientContext) -> None:
        """A client's uplink is what the method declares: the names, each entry a tensor of its size,
        finite values, a ``weight`` (the client's weight in the server's average) not below zero (a
        :class:`ProtocolError` naming the hook, the client and the entry)."""
        source = f"{type(self.client).__name__}.uplink (client {ctx.cid}, round {ctx.server_round})"
        if set(up) != self._declared:
            raise ProtocolError(f"{source} returned {sorted(up)}; the method's messages() declare "
                                f"{sorted(self._declared)}")
        for layout in (self.layouts.sums, self.layouts.rows):
            layout.check({k: up[k] for k in layout.entries}, source)
        for name, t in up.items():
            bad = int((~torch.isfinite(t.detach())).sum())
            if bad:
                raise ProtocolError(f"{source}: {name!r} holds {bad} NaN or infinite value(s) of {t.numel()}, with a "
                                    f"finite local loss ({ctx.loss_sum / max(ctx.seen, 1):.4g}): the method computes "
                                    f"{name!r} from something that is not finite (a division by zero, a log of 0?)")
        if "weight" in up and bool((up["weight"] < 0).any()):
            raise ProtocolError(f"{source}: 'weight' is {up['weight'].min().item():.6g}, below zero: a client's weight "
                                f"in the server's average must be 0 or more (a negative one turns its model's share "
                                f"around and changes every client's); return a weight of 0 or more from the hook")

    def _context(self, plan: RoundPlan, cid: int) -> ClientContext:
        seed = client_seed(self.seed, plan.round if plan.seed_key is None else plan.seed_key, cid)
        torch.manual_seed(seed)  # dropout and other users of the global generator
        self.flat.load(self.down.weights, self.down.ints)
        ctx = ClientContext(cid=cid, server_round=plan.number, lr=plan.lr, flat=self.flat,
                            global_weights=self.down.weights, data=self.store.get(cid), transform=self.transform,
                            generator=torch.Generator(self.device).manual_seed(seed), train_cfg=self.setup.train,
                            runner=self.runner, step_limit=plan.steps.get(cid, 0))
        layout = self.layouts.client_state
        stored = self.states.get(cid, plan.last_trained.get(cid)) if self.states is not None else None
        ctx.state = (Fields(layout.what, {k: v.to(self.device) for k, v in stored.items()}) if stored is not None
                     else zeros(layout.what, {k: e.shape for k, e in layout.entries.items()}, self.device))
        return ctx

    def evaluate(self, weights: torch.Tensor, ints: torch.Tensor) -> np.ndarray:
        """This worker's share of the evaluation sums (test set, validation set, the clients' held-out
        rows) for the given global model."""
        self.flat.load(weights.to(self.device), ints.to(self.device))
        self.eval_net.load_from(self.flat)
        return evaluate_share(self.eval_net, self.transform, self.eval_batches, self.layouts.evaluation)

    def probe(self, weights: torch.Tensor, ints: torch.Tensor, clients: list[int]) -> list[tuple[int, float]]:
        """(client, its mean loss on its training samples) under the global model, for each of ``clients``
        (a probing selector's candidates that this worker holds)."""
        self.flat.load(weights.to(self.device), ints.to(self.device))
        self.eval_net.load_from(self.flat)
        return [(cid, client_loss(self.eval_net, self.transform, self.store.get(cid), self.eval_batch_size))
                for cid in clients]

    # ---------------------------------------------------------------- client state
    def flush_states(self, resume_rounds: tuple[int, ...]) -> None:
        if self.states is not None:
            self.states.flush(resume_rounds)

    def export_state(self, cid: int, last: int) -> np.ndarray:
        """Client ``cid``'s state after round ``last``, to hand over to another worker."""
        if self.states is None:
            raise RuntimeError(f"worker {self.index} was asked to hand over client {cid}'s state but holds none")
        return self.states.export(cid, last)

    def adopt_state(self, cid: int, message: np.ndarray) -> None:
        self.states.adopt(cid, message)

    def state_message_bytes(self) -> int:
        return self.states.message_bytes if self.states is not None else 0
