"""The asynchronous server's state on rank 0: the event queue, the update rule, the global model
versions still in flight, and one server step at a time (``aggregation: fedbuff`` or ``fedasync``).

A server step is planned before anything trains: :meth:`AsyncServer.plan` pops events until the
rule's ``take`` updates have arrived (dropped-out clients bring none; an update staler than
``max_staleness`` versions is dropped), dispatching a client to each slot freed on the way, from
the current version. Whether an update is taken depends only on the event order and the versions,
never on what a client learns, so the clients a step takes can then train anywhere (each from the
version it started from, its training seed keyed by its dispatch sequence number) and
:meth:`AsyncServer.apply` takes the rule's aggregate, in event order, through the server
optimiser. The server keeps a version while a client in flight started from it and it is at most
``max_staleness`` versions old: at most ``max_staleness + 1`` models, each with its whole downlink (the
method's down tensors made at that version, :meth:`AsyncServer.keep_downlink`), which its clients train
with. A checkpoint is taken between steps (:meth:`AsyncServer.state_dict`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from mpifed.federation.async_rules import AsyncRule
from mpifed.federation.events import Event, EventQueue
from mpifed.federation.server_optimizers import ServerOptimizer

IDLE_LIMIT = 100_000      # consecutive idle waits before a step gives up: no client ever becomes available


@dataclass
class StepPlan:
    """One server step before it trains: the version it makes, the simulated time it is applied at,
    the events it takes (in event order) with their staleness, and the events it leaves out."""

    version: int
    sim_time: float = 0.0
    taken: list[Event] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    stale: list[Event] = field(default_factory=list)         # arrived staler than max_staleness: dropped
    dropped: list[Event] = field(default_factory=list)       # dropped out: never answered


class AsyncServer:
    """Rank 0's asynchronous server: ``rule`` (FedBuff or FedAsync) over ``queue``, from the global
    float state ``model`` (version 0) and the method's down tensors made for it, ``down`` (none: a method
    that sends nothing besides the model)."""

    def __init__(self, rule: AsyncRule, queue: EventQueue, model: torch.Tensor, max_staleness: int,
                 down: dict[str, torch.Tensor] | None = None) -> None:
        self.rule, self.queue, self.max_staleness = rule, queue, max_staleness
        self.version = 0
        self.versions: dict[int, torch.Tensor] = {0: model}
        self.downlinks: dict[int, dict[str, torch.Tensor]] = {}   # version -> its down tensors (keep_downlink's)
        self.keep_downlink(0, down or {})

    @property
    def model(self) -> torch.Tensor:
        """The current global float state."""
        return self.versions[self.version]

    @property
    def sim_clock(self) -> float:
        """The simulated time of the last server step (0 before the first)."""
        return self.queue.now

    def plan(self) -> StepPlan:
        """Pop events until the next server step's updates have arrived (see the module's docstring)."""
        plan = StepPlan(self.version + 1)
        idle = 0
        while len(plan.taken) < self.rule.take:
            self.queue.fill(self.version)
            event = self.queue.pop()
            if event is None:
                idle += 1
                if idle >= IDLE_LIMIT:
                    raise RuntimeError(f"no client became available in {IDLE_LIMIT} waits of the aggregation's "
                                       f"idle_wait (simulated time {self.queue.now:g}); check the availability trace "
                                       f"or system.availability")
                continue
            idle = 0
            staleness = self.version - event.start_version
            if event.dropped:
                plan.dropped.append(event)
            elif staleness > self.max_staleness:
                plan.stale.append(event)
            else:
                plan.taken.append(event)
                plan.staleness.append(staleness)
        plan.sim_time = self.queue.now
        return plan

    def start_model(self, event: Event) -> torch.Tensor:
        """The global float state ``event``'s client started from."""
        return self.versions[event.start_version]

    def apply(self, plan: StepPlan, models: list[torch.Tensor], optimizer: ServerOptimizer) -> torch.Tensor:
        """The new version from the trained ``models`` of ``plan.taken`` (in its order): the rule's
        aggregate through ``optimizer``; forgets the versions no client in flight needs."""
        if len(models) != len(plan.taken) or plan.version != self.version + 1:
            raise ValueError(f"apply() takes the models of the plan of version {self.version + 1} ({len(plan.taken)} "
                             f"of them), got version {plan.version} and {len(models)} models")
        starts = [self.start_model(e) for e in plan.taken]
        x = self.model
        new = optimizer.step(x, self.rule.aggregate(x, starts, models, plan.staleness))
        self.version += 1
        self.versions[self.version] = new
        needed = {v for v in self.queue.start_versions() if v >= self.version - self.max_staleness} | {self.version}
        self.versions = {v: m for v, m in self.versions.items() if v in needed}
        self.downlinks = {v: d for v, d in self.downlinks.items() if v in needed}
        return new

    def keep_downlink(self, version: int, down: dict[str, torch.Tensor]) -> None:
        """The method's down tensors made for ``version``, the current one (after :meth:`apply`, which keeps
        a version's down tensors as long as the version): its clients'."""
        if version != self.version:
            raise ValueError(f"keep_downlink() takes the downlink of the current version {self.version}, got "
                             f"version {version}'s")
        self.downlinks[version] = {k: v.detach().clone() for k, v in down.items()}

    def step(self, train: Callable[[Event, torch.Tensor], torch.Tensor], optimizer: ServerOptimizer) -> StepPlan:
        """One server step in this process: plan it, ``train(event, start model)`` each client it takes
        in event order, apply it."""
        plan = self.plan()
        self.apply(plan, [train(e, self.start_model(e)) for e in plan.taken], optimizer)
        return plan

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps between steps: the queue, the version and the versions in flight with
        their down tensors (made from the method's state at each version, so kept, not made again)."""
        return {"queue": self.queue.state_dict(), "version": self.version,
                "versions": {v: m.cpu() for v, m in self.versions.items()},
                "downlinks": {v: {k: t.cpu() for k, t in d.items()} for v, d in self.downlinks.items()}}

    def load_state_dict(self, saved: dict[str, Any], device: torch.device | str = "cpu") -> None:
        """Restore what :meth:`state_dict` returned, the models on ``device``."""
        self.queue.load_state_dict(saved["queue"])
        self.version = int(saved["version"])
        self.versions = {int(v): m.to(device) for v, m in saved["versions"].items()}
        # a checkpoint from before the downlinks were kept: its methods sent nothing besides the model
        downlinks = saved.get("downlinks", {v: {} for v in saved["versions"]})
        self.downlinks = {int(v): {k: t.to(device) for k, t in d.items()} for v, d in downlinks.items()}
