"""Whether a method's captured local step is its eager step, proved by behaviour (``mpifed check-method``).

:func:`check_method` runs a method's server and client roles for a few rounds in this process, on
tiny data whose values change the way a run's do: the learning rate decays each round, the clients
differ in size, more rounds than a method's warm-up (its on-switches, such as FedGKD's
``buffer_size=2``), two clients a round. It runs them twice from one seed and one random state: with
every local step eager (the eager twin), and with the steps captured by the CPU stand-in for CUDA
graphs (:class:`~mpifed.local.trace.TracedStep`: the same warm-up, one graph per value of a
Python-valued input, the capturable optimisers) and every replay compared with an eager step from the
same state. A replay that leaves the eager step stops the captured twin with the line of the step that
read the value; otherwise the two twins' global models must agree round by round.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import yaml

from mpifed.algorithms.base import (Algorithm, ClientContext, ClientReport, Downlink, Fields, Replies, ServerTools,
                                    Setup, checked, renewed, zeros)
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.local.flat import FlatModel
from mpifed.local.steps import LocalSteps
from mpifed.local.trace import RELATIVE_TOLERANCE, HostRead, StaleCapture, parted
from mpifed.models.base import SplitNet
from mpifed.settings.config import TrainConfig

CLIENT_SIZES = (13, 9, 17, 11)   # samples per client: full batches of 4 and a shorter last one, each its own size
CLIENTS_PER_ROUND = 2
CLASSES = 3
LR, LR_DECAY = 0.1, 0.7          # the learning rate of round r: LR * LR_DECAY ** (r - 1)


@dataclass(frozen=True)
class CaptureCheck:
    """What :func:`check_method` found: ``problem`` is empty when the captured step equals the eager one."""

    method: str
    rounds: int
    problem: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem


def check_method(name: str, cls: type[Algorithm], rounds: int = 4, seed: int = 0) -> CaptureCheck:
    """Run method ``cls`` (registered as ``name``) eagerly and captured for ``rounds`` rounds (more where its
    on-switches need more) and say whether the captured twin left the eager one, where and why."""
    options = _switched_on(cls)
    rounds = max(rounds, getattr(options, "buffer_size", 0) + 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)        # tiny tensors: one thread is the fastest, and the same on every machine
    try:
        captured = _Twin(name, cls, options, LocalSteps(graphs=True, backend="trace", check="every"), seed).run(rounds)
        eager = _Twin(name, cls, options, LocalSteps(graphs=True, backend="eager"), seed).run(rounds)
    except (StaleCapture, HostRead) as exc:
        return CaptureCheck(name, rounds, f"method {name}: {exc}")
    finally:
        torch.set_num_threads(threads)
    start = eager[0]
    for server_round, (e, c) in enumerate(zip(eager[1:], captured[1:]), start=1):
        gap = parted(e, c, start)
        if gap > RELATIVE_TOLERANCE["trace"]:
            return CaptureCheck(name, rounds, f"method {name}: the captured run's global model left the eager run's in "
                                              f"round {server_round} (relative difference {gap:.3g}) although each "
                                              f"replay matched an eager step: a hook outside the step reads what "
                                              f"the step changed differently; declare what the step reads in the "
                                              f"method's inputs()")
        start = e
    return CaptureCheck(name, rounds)


def _switched_on(cls: type[Algorithm]) -> object:
    """The method's default options with its own term switched on (its ``switches.on`` ``algorithm.*`` keys)."""
    options = cls.Options()
    given = {}
    for setting in cls.switches.on:
        key, _, value = setting.partition("=")
        if key.startswith("algorithm.") and "." not in key[len("algorithm."):]:
            field = key[len("algorithm."):]
            default = getattr(options, field)
            parsed = yaml.safe_load(value)
            given[field] = float(parsed) if isinstance(default, float) and isinstance(parsed, int) else parsed
    return dataclasses.replace(options, **given) if given else options


def _network() -> SplitNet:
    """A small network with what steps must handle: BatchNorm statistics and counters, and dropout."""
    body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Dropout(0.2))
    return SplitNet(body, torch.nn.Linear(8, CLASSES))


class _Twin:
    """One run of a method's roles on tiny data, in this process, with the local steps of ``runner``."""

    def __init__(self, name: str, cls: type[Algorithm], options: object, runner: LocalSteps, seed: int) -> None:
        train = TrainConfig(batch_size=4, local_epochs=2, eval_batch_size=8)

        def new_model() -> FlatModel:
            return FlatModel(cls.extend_model(_network(), options))

        probe = new_model()
        self.setup = Setup(CLASSES, len(CLIENT_SIZES), CLIENTS_PER_ROUND, probe.num_floats, probe.num_params,
                           probe.ints.numel(), probe.model.feature_dim, train, torch.device("cpu"), new_model, seed)
        g = torch.Generator().manual_seed(seed)
        self.data = [ClientData(cid, torch.randint(0, 256, (n, 1, 2, 2), dtype=torch.uint8, generator=g),
                                torch.randint(0, CLASSES, (n,), generator=g)) for cid, n in enumerate(CLIENT_SIZES)]
        held = ClientData(-1, torch.randint(0, 256, (9, 1, 2, 2), dtype=torch.uint8, generator=g), torch.arange(9) % 3)
        self.transform = BatchTransform([0.5], [0.5], 0, False, 0, "cpu")
        self.name = name
        self.runner = runner
        self.seed = seed
        algo = cls(options, self.setup)
        self.messages = algo.messages()
        self.server = algo.server(ServerTools(new_model(), self.transform, held, train.eval_batch_size))
        self.client = algo.client()
        self.flat = new_model()
        self.states: dict[int, Fields] = {}
        self.fixed: dict[str, torch.Tensor] = {}

    def run(self, rounds: int) -> list[torch.Tensor]:
        """The global model before the first round and after each round."""
        weights = self.setup.initial_model().floats.clone()
        ints = self.flat.ints.clone()
        self.server.start(weights)
        models = [weights.clone()]
        for server_round in range(1, rounds + 1):
            weights = self._round(server_round, weights, ints)
            models.append(weights.clone())
        return models

    def _fixed(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """``t`` in a buffer that keeps its address from round to round, as a worker with captured steps keeps it."""
        if name not in self.fixed or self.fixed[name].shape != t.shape:
            self.fixed[name] = torch.empty_like(t)
        return self.fixed[name].copy_(t)

    def _round(self, server_round: int, weights: torch.Tensor, ints: torch.Tensor) -> torch.Tensor:
        sent = checked("the downlink", self.messages.down, self.server.downlink(server_round, weights), "downlink")
        down = Downlink(self._fixed("weights", weights), self._fixed("ints", ints),
                        {k: self._fixed(f"down.{k}", v) for k, v in sent})
        chosen = [(server_round + i) % len(CLIENT_SIZES) for i in range(CLIENTS_PER_ROUND)]
        self.client.inputs.reset("round")
        self.client.round_start(server_round, down)
        if self.messages.statistics:
            totals = {k: torch.zeros(shape, dtype=torch.float64) for k, shape in self.messages.statistics.items()}
            for cid in chosen:
                for k, v in self.client.statistics(self.data[cid], self.transform).items():
                    totals[k] += v.double().reshape(totals[k].shape)
            self.client.use_statistics(Fields("the statistics", totals))
        sums: dict[str, torch.Tensor] = {}
        rows: dict[str, list[torch.Tensor]] = {}
        reports = []
        for cid in sorted(chosen):
            up = self._client(server_round, cid, down)
            for k, entry in self.messages.up.items():
                if entry.travel == "sum":
                    sums[k] = sums.get(k, 0) + up[k].detach().double().reshape(entry.shape)
                else:
                    rows.setdefault(k, []).append(up[k].detach().float().reshape(entry.shape))
            reports.append(ClientReport(cid, 0, len(self.data[cid].labels), 0, 0.0, 0.0, {}))
        replies = Replies(sums, {k: torch.stack(v) for k, v in rows.items()}, reports)
        new = self.server.aggregate(server_round, weights, replies).float()
        self.server.global_updated(server_round, new)
        return new

    def _client(self, server_round: int, cid: int, down: Downlink) -> dict[str, torch.Tensor]:
        seed = self.seed * 1000 + server_round * 10 + cid
        torch.manual_seed(seed)
        self.flat.load(down.weights, down.ints)
        ctx = ClientContext(cid, server_round, LR * LR_DECAY ** (server_round - 1), self.flat, down.weights,
                            self.data[cid], self.transform, torch.Generator().manual_seed(seed), self.setup.train,
                            runner=self.runner)
        ctx.state = self.states.get(cid) or zeros("the client state", self.messages.client_state)
        self.client.inputs.reset("client")
        up = self.client.local_round(ctx)
        self.states[cid] = renewed(ctx.state, ctx.new_state, f"{self.name} end_client")
        return up
