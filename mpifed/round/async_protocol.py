"""The asynchronous server's run in the debug mode (``aggregation: fedbuff`` or ``fedasync``;
docs/federations.md): one server step at a time, in one process.

Each step: the server plans it from the event queue (:meth:`~mpifed.federation.async_server.AsyncServer.plan`),
the worker trains each client it takes, in event order, from the model version the client started
from (the method's client role, unchanged; its training seed keyed by the client's dispatch
sequence number, its learning rate the schedule's at its start version), and the server applies
the rule's step through the server optimiser, records the step (one row of metrics.jsonl),
evaluates every ``run.eval_every`` steps and checkpoints as a round does. Under MPI the versions in
flight would travel as buffers once per step; that is not wired yet, and startup refuses it.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from mpifed.algorithms.base import Downlink, ProtocolError
from mpifed.local.optim import round_lr
from mpifed.round.plan import RoundPlan
from mpifed.round.protocol import usage

if TYPE_CHECKING:
    from mpifed.round.server import RoundServer
    from mpifed.round.worker import Worker


class AsyncProtocol:
    """Walks the server steps of an asynchronous run in the debug mode (the server and the worker in one process)."""

    def __init__(self, server: RoundServer, worker: Worker) -> None:
        if server.steps is None:
            raise ValueError("AsyncProtocol needs a server with an asynchronous aggregation (aggregation: fedbuff "
                             "or fedasync)")
        layouts = server.layouts
        carried = [what for what, layout in (("down tensors", layouts.down), ("client statistics", layouts.statistics),
                                              ("client state", layouts.client_state)) if layout.entries]
        if carried:
            raise ProtocolError(f"algorithm {server.cfg.algorithm.name!r} declares that it runs asynchronously, but "
                                f"its messages hold {', '.join(carried)}, which the asynchronous server does not carry "
                                f"yet (docs/federations.md, Asynchronous FL); set aggregation=sync")
        self.server, self.worker = server, worker

    def run(self) -> None:
        """Walk server steps until the run stops."""
        while self.step():
            pass

    def step(self) -> bool:
        """One server step; False once the run has stopped."""
        server, worker = self.server, self.worker
        steps = server.steps
        if server.stopping:
            worker.flush_states(())
            server.stopped([usage()])
            return False
        times: dict[str, float] = {}
        start = time.perf_counter()
        plan = steps.plan()
        cfg = server.cfg
        models, reports = [], []
        ints = torch.zeros_like(server.global_ints, dtype=torch.float64)
        for event, staleness in zip(plan.taken, plan.staleness):
            round_plan = RoundPlan(round=event.start_version, lr=round_lr(cfg.train, event.start_version),
                                   assignment=[[event.cid]], seed_key=event.seq)
            worker.start_round(round_plan, Downlink(steps.start_model(event), server.global_ints, {},
                                                    server.layouts.down.what))
            trained = worker.train(round_plan)
            if worker.failure is not None:
                raise server.method_failed([worker.failure])
            report = trained.reports[0]
            report.extra.update({"seq": event.seq, "start_version": event.start_version, "staleness": staleness,
                                 "sim_end": event.end})
            reports.append(report)
            models.append(worker.flat.floats.detach().clone())
            ints += worker.flat.ints.cpu().double() * report.samples
        times["local_training"] = time.perf_counter() - start
        new = steps.apply(plan, models, server.optimizer)
        samples = sum(r.samples for r in reports)
        server.stepped(plan, new, torch.round(ints / samples).to(torch.int64), reports)
        if server.evaluate_now(plan.version):
            tick = time.perf_counter()
            state = server.evaluation_state()
            share = worker.evaluate(state["weights"], state["ints"])
            server.evaluated(RoundPlan(round=plan.version - 1, lr=0.0), server.layouts.evaluation.views(share))
            times["evaluation"] = time.perf_counter() - tick
        times["round"] = time.perf_counter() - start
        server.end_step(plan, reports, times)
        return True
