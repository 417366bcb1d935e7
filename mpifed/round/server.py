"""The server's round, top to bottom: plan, send, aggregate, evaluate, record, checkpoint.

:class:`RoundServer` is the server side of :class:`~mpifed.round.protocol.RoundProtocol`: the
protocol calls its methods, in the order below, between the collectives of each round
(on rank 0, which in the debug mode also runs the only worker). It owns the global model,
the method's server role and the checkpoints; it hands each round's row to the run's records
(:class:`~mpifed.run.run_records.RunRecords`: metrics.jsonl and its trackers, status, summary).
"""
from __future__ import annotations

import io
import statistics
import time
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch

from mpifed.run import checkpoint
from mpifed.algorithms.base import Fields, ProtocolError, Replies, Server
from mpifed.settings.config import Config, math_fingerprint
from mpifed.data.prepared import Manifest
from mpifed.data.store import holdout_size
from mpifed.local.evaluation import client_figures, evaluation_figures, validation
from mpifed.comm.handoff import EXIT_STOPPED, describe_signal, note_resume_point
from mpifed.local.optim import round_lr
from mpifed.federation.async_server import StepPlan
from mpifed.round.async_setup import asynchronous, make_async_server
from mpifed.round.method_errors import HookFailure, MethodFailed, hook_failure, how_to_continue, method_sources
from mpifed.round.plan import RoundPlan, assign_clients, sample_clients, state_moves
from mpifed.run.progress import Progress
from mpifed.round.protocol import Layouts
from mpifed.round.timeline import Timeline
from mpifed.run.run_records import RunRecords
from mpifed.run.rundir import MODEL, RunDir, atomic_write
from mpifed.round.signals import received, stop_requested
from mpifed.run.state import RunState


class RoundServer:
    def __init__(self, cfg: Config, cfg_dict: dict[str, Any], manifest: Manifest, method: Server, layouts: Layouts,
                 workers: int, run: RunDir, resume: dict[str, Any] | None, resume_command: str,
                 timeline: Timeline) -> None:
        self.cfg = cfg
        self.timeline = timeline
        self.layouts = layouts
        self.resume_command = resume_command
        self.cfg_dict = cfg_dict
        self.manifest = manifest
        self.method = method
        self.workers = workers
        self.run_dir = run
        flat = method.tools.flat
        self.device = flat.floats.device
        self.optimizer = method.tools.optimizer
        self.rounds_done = 0               # rounds trained so far: the next round's 0-based index
        self.model_sent = False            # the evaluation or probe since the last plan broadcast the global model
        self.holders: dict[int, int] = {}  # client -> the worker holding its state in memory
        self.last_trained: dict[int, int] = {}   # client -> the last round it trained in (methods with client state)
        self.last_checkpoint: Path | None = None
        self.last_checkpoint_round = 0
        self.elapsed_before = 0.0
        self.started = time.perf_counter()
        self.first_round_at = time.time()
        self.worker_stops: list[tuple[int, list[str]]] = []
        self.replies: Replies | None = None
        self.result: dict[str, Any] = {}
        self.held: np.ndarray | None = None   # each client's held-out rows (data.client_holdout)
        self.exit_code = 0
        self.progress = Progress(cfg.train.rounds, resume["rounds_done"] if resume else 0)
        run.console = self.progress.write
        self.records = RunRecords(cfg, cfg_dict, manifest, run, resume["metrics"] if resume else None,
                                  resume["rounds_done"] if resume else 0)
        if resume is None:
            self.global_floats = flat.floats.detach().clone()
            self.global_ints = flat.ints.detach().clone()
            method.start(self.global_floats)
        else:
            self._restore(resume)
            method.start(self.global_floats)
            method.load_state_dict(resume["algorithm"])
            if "server_optimizer" in resume:     # a checkpoint from before server optimisers: sgd, no state
                self.optimizer.load_state_dict(resume["server_optimizer"], self.device)
        # made now: a name not declared fails before round 1
        self.first_down = self._method_downlink(self.rounds_done + 1)
        # aggregation fedbuff or fedasync: the asynchronous server (its event queue, the versions in flight and
        # their downlinks; version 0's is round 1's)
        self.steps = make_async_server(cfg, timeline, self.global_floats, self.first_down) if asynchronous(cfg) \
            else None
        if self.steps is not None and resume is not None:
            self.steps.load_state_dict(resume["async"], self.device)
        if cfg.system.time_budget:
            self.progress.budget_from(cfg.system.time_budget, self.sim_clock)
        # a finished run trained further is running again, from now
        self.records.status(RunState.RUNNING, self.rounds_done, self.last_checkpoint)
        note_resume_point(self.describe_checkpoint())

    # ------------------------------------------------------------ the round, in order
    @property
    def stopping(self) -> bool:
        """Whether the run stops now: the last round (or server step) is done, or a stop was requested."""
        return self.finished or stop_requested() or bool(self.worker_stops)

    @property
    def finished(self) -> bool:
        """Whether the run has trained all it was asked to: ``train.rounds``, or ``system.time_budget``."""
        return self.rounds_done >= self.cfg.train.rounds or self.budget_spent(self.sim_clock)

    @property
    def sim_clock(self) -> float:
        """The simulated seconds so far (0 without the virtual clock)."""
        return self.steps.sim_clock if self.steps is not None else self.timeline.sim_clock

    def budget_spent(self, sim_clock: float) -> bool:
        """Whether a run whose simulated clock reads ``sim_clock`` has spent its ``system.time_budget``."""
        budget = self.cfg.system.time_budget
        return bool(budget) and sim_clock >= budget

    def probe(self) -> list[list[int]] | None:
        """A probing selector's candidates for the next round, split over the workers (None: the run stops)."""
        if self.stopping:
            return None
        return assign_clients(self.timeline.probe(self.rounds_done), self.manifest.client_sizes, self.workers)

    def probe_model(self) -> dict[str, torch.Tensor]:
        return {"weights": self.global_floats, "ints": self.global_ints}

    def probed(self, losses: dict[int, float]) -> None:
        """The candidates' losses; every rank now holds the global model as it is."""
        self.timeline.probed(losses)
        self.model_sent = True

    def plan(self) -> RoundPlan:
        """The next round's plan, or the stop plan after the last round or on a stop request."""
        cfg, rnd = self.cfg, self.rounds_done
        if self.stopping:
            return RoundPlan(round=rnd, lr=0.0, stop=True, resume_rounds=self._resume_rounds())
        planned = self.timeline.plan(rnd)
        clients = planned.clients
        assignment = assign_clients(clients, self.manifest.client_sizes, self.workers)
        moves = state_moves(assignment, self.holders)
        self.holders.update({cid: w for w, a in enumerate(assignment) for cid in a})
        last = {}
        if self.layouts.client_state.entries:
            last = {int(c): self.last_trained[int(c)] for c in clients if int(c) in self.last_trained}
            self.last_trained.update({int(c): rnd for c in clients})
        every = cfg.run.checkpoint_every
        # only the round right after the evaluation or probe may use the model it sent: that round's downlink
        # uses up the broadcast buffer, and a round that no client answers changes nothing that would send it again
        held, self.model_sent = self.model_sent, False
        return RoundPlan(round=rnd, lr=round_lr(cfg.train, rnd), assignment=assignment,
                         evaluate=self.evaluate_now(rnd + 1, self.timeline.clock_after()),
                         checkpoint=bool(every) and (rnd + 1) % every == 0 and rnd + 1 < cfg.train.rounds,
                         resume_rounds=self._resume_rounds(), moves=moves, model_held=held,
                         last_trained=last, steps=planned.steps)

    def downlink(self, plan: RoundPlan) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The global model and the method's down tensors (the first round's made at start-up)."""
        down = self.first_down if self.first_down is not None else self._method_downlink(plan.number)
        self.first_down = None
        return {"weights": self.global_floats, "ints": self.global_ints}, down

    def _method_downlink(self, server_round: int) -> dict[str, torch.Tensor]:
        down = self.method.downlink(server_round, self.global_floats)
        self.layouts.down.check(down, f"{type(self.method).__name__}.downlink")
        return down

    def aggregate(self, plan: RoundPlan, replies: Replies, model_sums: dict[str, torch.Tensor]) -> None:
        """The new global model: the method's from its replies; the integer buffers (BatchNorm's
        counters) the clients' sample-weighted mean, rounded."""
        sums = Fields(self.layouts.sums.what, {k: v.to(self.device) for k, v in replies.sums})
        rows = Fields(self.layouts.rows.what, {k: v.to(self.device) for k, v in replies.rows})
        mine = Replies(sums, rows, replies.clients)
        self.replies = mine
        if not replies.clients:     # no client answered in time (system:): the round keeps the model
            return
        steps = self.optimizer.steps
        new = self.method.aggregate(plan.number, self.global_floats, mine).to(torch.float32)
        if self.optimizer.steps == steps and not self.optimizer.identity:
            name = type(self.method).__name__
            raise ProtocolError(f"{name}.aggregate (round {plan.number}) took no step of the server optimiser "
                                f"server_optimizer: {self.cfg.server_optimizer.name}: it neither calls "
                                f"super().aggregate nor returns self.server_step(weights, its_aggregate). Return "
                                f"that, or declare why the method steps itself (its Algorithm's own_server_step), "
                                f"which refuses any server_optimizer but sgd at lr 1")
        bad = int((~torch.isfinite(new)).sum())
        if bad:
            scalars = ", ".join(f"{k}={float(v):.6g}" for k, v in sums if v.numel() == 1)
            summed = f" (summed: {scalars})" if scalars else ""
            raise ProtocolError(f"{type(self.method).__name__}.aggregate (round {plan.number}) returned a global "
                                f"model with {bad} NaN or infinite value(s) of {new.numel()}, from finite "
                                f"uplinks{summed}: a weighted mean whose weights sum to zero, or another division by "
                                f"zero, in the method's aggregate")
        self.global_floats = new
        self.method.global_updated(plan.number, new)
        ints, samples = (model_sums[k].to(self.device) for k in ("ints", "samples"))
        self.global_ints = torch.round(ints / samples).to(torch.int64)

    def evaluation_state(self) -> dict[str, torch.Tensor]:
        reported = self.method.reported(self.global_floats)
        self.model_sent = reported is self.global_floats     # so the next downlink need not send it
        return {"weights": reported, "ints": self.global_ints}

    def evaluated(self, plan: RoundPlan, totals: dict[str, torch.Tensor]) -> None:
        m = self.manifest
        self.result = (evaluation_figures(totals, m.test_class_counts, m.test_group_counts, m.group_names)
                       if self.cfg.run.eval_test else {})
        if m.val_size:
            self.result.update(validation(totals, m.val_size))
        if self.cfg.data.client_holdout:
            if self.held is None:
                self.held = np.array([holdout_size(int(n), self.cfg.data.client_holdout) for n in m.client_sizes])
            self.result.update(client_figures(totals, self.held))

    def end_round(self, plan: RoundPlan, times: dict[str, float], stops: list[tuple[int, list[str]]]) -> None:
        self._check_lock()
        simulated = self.timeline.finished(plan.round, self.replies.clients)   # the selector learns, the clock moves
        self._record(plan, times, simulated)
        self.rounds_done = plan.number
        self.worker_stops = stops
        if plan.checkpoint:
            self.checkpoint(self.rounds_done)

    def stopped(self, usage: list[Any]) -> None:
        """After the stop plan: the final checkpoint, model, summary and status."""
        self.progress.close()
        rounds_done = self.rounds_done
        finished = self.finished
        self._check_lock()
        if self.last_checkpoint_round != rounds_done:
            self.checkpoint(rounds_done)
        if finished and self.cfg.run.save_model:
            self._save_model()
        self.records.finish(RunState.FINISHED if finished else RunState.STOPPED, rounds_done, self.last_checkpoint,
                            self.elapsed(), self.first_round_at, usage,
                            self.sim_clock if self.cfg.system.clock else None)
        if not finished:
            if rounds_done == 0:
                self.run_dir.log(f"[mpifed] stopped before round 1 on {self._stop_reason()}: nothing was trained; "
                                 f"this starts the run from round 1: {self.resume_command}")
            else:
                self.run_dir.log(f"[mpifed] stopped after round {rounds_done} on {self._stop_reason()} (checkpoint "
                                 f"{self.last_checkpoint}); continue with: {self.resume_command}")
            self.exit_code = EXIT_STOPPED

    # ------------------------------------------------------------ an asynchronous server's step
    def stepped(self, plan: StepPlan, new: torch.Tensor, ints: torch.Tensor) -> None:
        """The asynchronous server applied ``plan``: ``new`` is the global float state (version
        ``plan.version``), ``ints`` the integer buffers (the taken clients' sample-weighted mean, rounded). The
        method's server role then learns of it (``global_updated``, with ``server_round`` the new version) and
        makes the new version's down tensors, those of the round that would start from it (``plan.version + 1``,
        as round t's downlink is made from the model after t - 1 rounds), which its clients will train with."""
        bad = int((~torch.isfinite(new)).sum())
        if bad:
            raise ProtocolError(f"aggregation {self.cfg.aggregation.name} (server step {plan.version}) made a global "
                                f"model with {bad} NaN or infinite value(s) of {new.numel()} from finite client "
                                f"models: lower the server optimiser's learning rate or the clients' train.lr")
        self.global_floats = new.to(torch.float32)
        self.global_ints = ints.to(self.device)
        self.model_sent = False
        self.method.global_updated(plan.version, self.global_floats)
        self.steps.keep_downlink(plan.version, self._method_downlink(plan.version + 1))

    def evaluate_now(self, version: int, sim_clock: float) -> bool:
        """Whether round or server step ``version`` (counted from 1), which ends at simulated time
        ``sim_clock``, is evaluated: every ``run.eval_every``, the last ``run.eval_last`` (the last one at
        least), and the one that spends the time budget."""
        cfg = self.cfg
        return version % cfg.run.eval_every == 0 or version > cfg.train.rounds - max(cfg.run.eval_last, 1) or \
            self.budget_spent(sim_clock)

    def end_step(self, plan: StepPlan, reports: list[Any], times: dict[str, float],
                 stops: list[tuple[int, list[str]]]) -> None:
        """Server step ``plan.version`` done: its row in metrics.jsonl (the version, the simulated time, the
        staleness of each update taken, those left out), then a checkpoint when one is due; ``stops``: the
        stop signals workers received."""
        self._check_lock()
        self.worker_stops = stops
        samples = sum(r.samples for r in reports)
        row: dict[str, Any] = {"round": plan.version, "lr": round_lr(self.cfg.train, plan.version - 1),
                               "clients": len(reports),
                               "train_loss": sum(r.train_loss * r.samples for r in reports) / max(samples, 1)}
        if self.evaluate_now(plan.version, plan.sim_time):
            row.update(self.result)
        row.update(self.method.log())
        row.update({"version": plan.version, "sim_clock": plan.sim_time, "staleness": list(plan.staleness),
                    "stale_dropped": len(plan.stale), "dropped": len(plan.dropped),
                    "in_flight_versions": len(self.steps.versions)})
        row["time"] = {k: round(v, 4) for k, v in times.items()}
        self.records.add_round(row, reports)
        self.run_dir.log(self.progress.line(plan.version, row))
        self.progress.advance(plan.version)
        self.rounds_done = plan.version
        every = self.cfg.run.checkpoint_every
        if every and plan.version % every == 0 and plan.version < self.cfg.train.rounds:
            self.checkpoint(self.rounds_done)

    # ------------------------------------------------------------ bookkeeping
    def _stop_reason(self) -> str:
        if received():
            return ", ".join(describe_signal(name) for name in received())
        by_workers = [f"{', '.join(names)} received by rank {rank}" for rank, names in self.worker_stops if names]
        return "; ".join(by_workers) or "a stop request"

    def _check_lock(self) -> None:
        warning = self.run_dir.check_lock()
        if warning:
            self.run_dir.log(warning)

    def _record(self, plan: RoundPlan, t: dict[str, float], simulated: dict[str, Any]) -> None:
        reports = self.replies.clients
        samples = sum(r.samples for r in reports)
        busy = [sum(r.seconds for r in reports if r.worker == w) for w in range(self.workers)]
        timing = {k: round(v, 4) for k, v in t.items()}
        timing["worker_idle_mean"] = round(t["local_training"] - statistics.fmean(busy), 4)
        row: dict[str, Any] = {"round": plan.number, "lr": plan.lr, "clients": len(reports),
                               "train_loss": sum(r.train_loss * r.samples for r in reports) / max(samples, 1)}
        if plan.evaluate:
            row.update(self.result)
        row.update(self.method.log())
        row.update(simulated)
        row["time"] = timing
        self.records.add_round(row, reports)
        self.run_dir.log(self.progress.line(plan.number, row))
        self.progress.advance(plan.number)

    def _resume_rounds(self) -> tuple[int, ...]:
        """The rounds a resume could start at: those of the checkpoints on disk."""
        return tuple(checkpoint.rounds_done(p) for p in checkpoint.all_checkpoints(self.run_dir.checkpoints))

    def checkpoint(self, rounds_done: int) -> None:
        payload = {
            "rounds_done": rounds_done,
            "global_floats": self.global_floats.cpu(),
            "global_ints": self.global_ints.cpu(),
            "algorithm": self.method.state_dict(),
            "server_optimizer": self.optimizer.state_dict(),
            "timeline": self.timeline.state_dict(),    # the simulated time and the selector's state
            **({"async": self.steps.state_dict()} if self.steps is not None else {}),   # queue, versions in flight
            # the rounds clients last trained in, where the plan is not today's draw by (seed, round) alone
            **({} if self.timeline.today else {"last_trained": dict(self.last_trained)}),
            "metrics": self.records.metrics,
            "config": self.cfg_dict,
            "config_math": math_fingerprint(self.cfg_dict),
            "data_spec": self.manifest.spec,    # the prepared data's identity: another partition is refused on resume
            "elapsed_s": self.elapsed(),
        }
        self.last_checkpoint = checkpoint.save(self.run_dir.checkpoints, rounds_done, payload,
                                               self.cfg.run.keep_checkpoints)
        self.last_checkpoint_round = rounds_done
        self.records.status(RunState.RUNNING, rounds_done, self.last_checkpoint)
        note_resume_point(self.describe_checkpoint())

    def _restore(self, state: dict[str, Any]) -> None:
        self.global_floats = state["global_floats"].to(self.device)
        self.global_ints = state["global_ints"].to(self.device)
        self.rounds_done = state["rounds_done"]
        self.last_checkpoint_round = state["rounds_done"]
        self.last_checkpoint = checkpoint.path_for(self.run_dir.checkpoints, state["rounds_done"])
        self.elapsed_before = state["elapsed_s"]
        if "timeline" in state:
            self.timeline.load_state_dict(state["timeline"])
        if "last_trained" in state:
            self.last_trained = dict(state["last_trained"])
        elif self.layouts.client_state.entries:   # each round sampled by (seed, round) alone: today's draw
            for rnd in range(self.rounds_done):
                self.last_trained.update({int(c): rnd for c in sample_clients(self.cfg.run.seed, rnd,
                                                                             self.manifest.num_clients,
                                                                             self.cfg.train.participation)})

    def abandon(self) -> None:
        """The run failed: end what it tracks (its MLflow run is marked failed)."""
        self.records.abandon()

    def elapsed(self) -> float:
        """Wall time of the run so far, across resumes."""
        return self.elapsed_before + time.perf_counter() - self.started

    def method_failed(self, failures: list[HookFailure]) -> MethodFailed:
        """The report of an exception in the method's hooks (on ``failures``' ranks), with how to continue
        the run after the fix."""
        since = self.last_checkpoint_round if self.last_checkpoint is not None else None
        how = how_to_continue(self.resume_command, since)
        note_resume_point(f" {how}")   # what the launcher says after the job: the same command
        return MethodFailed(failures, how)

    @contextmanager
    def method_hooks(self, plan: RoundPlan) -> Iterator[None]:
        """Around calls into the method's server role: an exception raised in the method's code becomes
        its :class:`MethodFailed` report; any other passes as it is."""
        try:
            yield
        except Exception as exc:
            found = hook_failure(exc, self.cfg.algorithm.name, method_sources(type(self.method)), 0, None,
                                 plan.number)
            if found is None:
                raise
            raise self.method_failed([found]) from None

    def describe_checkpoint(self) -> str:
        if self.last_checkpoint is None:
            return (" No checkpoint was written yet (see run.checkpoint_every); start the run again with: "
                    f"{self.resume_command}")
        return (f" Last checkpoint: {self.last_checkpoint} (after round {self.last_checkpoint_round}); "
                f"continue with: {self.resume_command}")

    def _save_model(self) -> None:
        flat = self.method.tools.flat
        flat.load(self.method.reported(self.global_floats), self.global_ints)
        buf = io.BytesIO()
        torch.save(flat.model.state_dict(), buf)
        atomic_write(self.run_dir.path / MODEL, buf.getvalue())
