"""A worker's round, top to bottom: receive, train the assigned clients, reduce, evaluate.

``serve`` is the loop of an MPI worker rank. ``Worker.train_round`` and
``Worker.evaluate`` are also called in-process by the server in the single-process
debug mode, so both modes run the same code.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from pathlib import Path
import numpy as np
import torch

from mpifed.algorithms.base import Algorithm, ClientContext
from mpifed.client_state import ClientStateStore
from mpifed.comm import Comm
from mpifed.data.prepared import Manifest
from mpifed.data.store import ClientStore, load_eval_batches
from mpifed.data.transforms import BatchTransform
from mpifed.evaluation import eval_packer, evaluate_share
from mpifed.flat import Packer
from mpifed.inference import InferenceCopy
from mpifed.plan import RoundPlan, client_seed
from mpifed.signals import stop_requested


@dataclass
class ClientReport:
    """Small per-client figures gathered by the server (not the model)."""

    cid: int
    worker: int
    samples: int
    steps: int
    train_loss: float
    seconds: float
    extra: dict[str, float]


def usage() -> tuple[float, float]:
    """This process's peak resident memory (MB) and CPU time (user + system seconds) so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_maxrss / 1024.0, r.ru_utime + r.ru_stime


def downlink_packer(algo: Algorithm, num_floats: int, num_ints: int) -> Packer:
    spec = {"global": ((num_floats,), np.float32), "global_ints": ((num_ints,), np.int64)}
    spec.update({k: (s, np.float32) for k, s in algo.downlink_spec().items()})
    return Packer(spec)


def state_packer(num_floats: int, num_ints: int) -> Packer:
    """The global model alone (sent for evaluation)."""
    return Packer({"global": ((num_floats,), np.float32), "global_ints": ((num_ints,), np.int64)})


def uplink_packer(algo: Algorithm, num_ints: int) -> Packer:
    spec = {k: (s, np.float64) for k, s in algo.uplink_spec().items()}
    spec.update({"_ints": ((num_ints,), np.float64), "_samples": ((1,), np.float64)})
    return Packer(spec)


def statistics_packer(algo: Algorithm) -> Packer:
    return Packer({k: (s, np.float64) for k, s in algo.statistics_spec().items()})


class Worker:
    """Trains the clients it is given and evaluates its share of the test set."""

    def __init__(self, index: int, count: int, algo: Algorithm, manifest: Manifest, transform: BatchTransform,
                 peers: Comm, seed: int, cache_mb: int, eval_batch_size: int, run_dir: Path) -> None:
        self.index = index
        self.algo = algo
        self.peers = peers          # the workers only (for statistics all-reduce)
        self.seed = seed
        self.device = algo.setup.device
        self.flat = algo.setup.new_model()
        self.eval_net = InferenceCopy(self.flat)
        self.transform = transform
        self.store = ClientStore(manifest, self.device, cache_mb)
        self.eval_batches = load_eval_batches(manifest, eval_batch_size, index, count, self.device)
        self.eval_packer = eval_packer(manifest.test_size, eval_batch_size, manifest.num_classes, len(manifest.group_names))
        self.down = downlink_packer(algo, self.flat.num_floats, self.flat.ints.numel())
        self.state = state_packer(self.flat.num_floats, self.flat.ints.numel())
        self.up = uplink_packer(algo, self.flat.ints.numel())
        self.stats = statistics_packer(algo)
        self.states = ClientStateStore(run_dir / "client_state") if algo.has_client_state else None

    def train_round(self, plan: RoundPlan, down: dict[str, torch.Tensor]) -> tuple[np.ndarray, list[ClientReport]]:
        """Train this worker's clients of ``plan``; returns the uplink sums and per-client reports."""
        clients = plan.assignment[self.index]
        down = {k: v.to(self.device) for k, v in down.items()}
        self.algo.round_start(plan.round, down)
        if self.stats.entries:
            sums = self.stats.views(self.stats.empty())
            for cid in clients:
                for k, v in self.algo.client_statistics(self.store.get(cid), self.transform).items():
                    sums[k] += v.detach().cpu().double()
            buf = self.stats.pack(sums)
            self.peers.sync("client statistics")
            summed = self.peers.allreduce_sum(buf.view(np.float64)).view(np.uint8)
            self.algo.use_statistics({k: v.to(self.device) for k, v in self.stats.views(summed).items()})
        up_buf = self.up.empty()
        totals = self.up.views(up_buf)
        reports = []
        for cid in clients:
            start = time.perf_counter()
            ctx = self._train_client(plan, cid, down)
            for k, v in self.algo.client_uplink(ctx).items():
                totals[k] += v.detach().cpu().double().reshape(totals[k].shape)
            totals["_ints"] += ctx.flat.ints.cpu().double() * ctx.num_samples
            totals["_samples"] += ctx.num_samples
            if self.states is not None:
                self.states.save(cid, plan.round, ctx.state or {}, plan.keep_states_from)
            reports.append(ClientReport(cid, self.index, ctx.num_samples, ctx.steps, ctx.loss_sum / max(ctx.seen, 1),
                                        time.perf_counter() - start, ctx.extra))
        return up_buf, reports

    def _train_client(self, plan: RoundPlan, cid: int, down: dict[str, torch.Tensor]) -> ClientContext:
        seed = client_seed(self.seed, plan.round, cid)
        torch.manual_seed(seed)  # dropout and other global-RNG users
        self.flat.load(down["global"], down["global_ints"])
        state = None
        if self.states is not None:
            state = self.states.load(cid, plan.round)
            state = self.algo.init_client_state() if state is None else {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in state.items()}
        ctx = ClientContext(cid=cid, round=plan.round, lr=plan.lr, flat=self.flat, global_floats=down["global"],
                            data=self.store.get(cid), transform=self.transform,
                            generator=torch.Generator().manual_seed(seed), state=state)
        self.algo.local_train(ctx)
        return ctx

    def evaluate(self, floats: torch.Tensor, ints: torch.Tensor) -> np.ndarray:
        """This worker's share of the test-set evaluation sums for the given global state."""
        self.flat.load(floats.to(self.device), ints.to(self.device))
        self.eval_net.load_from(self.flat)
        return evaluate_share(self.eval_net, self.transform, self.eval_batches, self.eval_packer)


def serve(worker: Worker, world: Comm) -> None:
    """The loop of an MPI worker rank; mirrors ``Server.run_round`` collective for collective."""
    down_buf = worker.down.empty()
    state_buf = worker.state.empty()
    while True:
        world.sync("start of round")
        plan: RoundPlan = world.bcast_object(None)
        if plan.stop:
            world.gather_object(usage())
            return
        world.bcast_buffer(down_buf)
        up_buf, reports = worker.train_round(plan, worker.down.views(down_buf))
        world.sync("end of local training")
        world.reduce_sum(up_buf.view(np.float64))
        world.gather_object((reports, stop_requested()))
        if plan.evaluate:
            world.sync("evaluation")
            world.bcast_buffer(state_buf)
            views = worker.state.views(state_buf)
            share = worker.evaluate(views["global"], views["global_ints"])
            world.sync("end of evaluation")
            world.reduce_sum(share.view(np.float64))
