"""The algorithm interface: a method is an :class:`Algorithm` with a server role and a client role.

A method file registers one ``Algorithm`` subclass under an explicit name, and overrides
what differs from FedAvg::

    @ALGORITHMS.register("fedprox")
    class FedProx(Algorithm):
        Options = ProxOptions          # its config keys (algorithm.<key>)
        Client = FedProxClient         # the worker side: local training
        Server = ...                   # the server side: aggregation (default FedAvg's)

        def messages(self) -> Messages # what travels besides the global model
        def inputs(self) -> Inputs     # what the client role's hooks set for its loss

The two roles are built separately, on different ranks under MPI and as two objects in
the debug mode; they share nothing but the options, the :class:`Setup` and what the round
protocol (:mod:`mpifed.round.protocol`) carries between them. One round, in order::

    server  downlink(server_round, w)    -> the Messages.down tensors sent with the global model w
    client  round_start(server_round, down)  once per round on each worker: the round inputs, from down.<name>
    client  statistics(data, transform)  summed over the round's clients on all workers
            use_statistics(totals)       before local training (Messages.statistics)
    client  local_round(ctx)             per client, these hooks in this order:
            begin_client(ctx)            before its local training: the client inputs its loss reads
            train(ctx)                   E epochs (or train.local_steps steps), one step per batch,
                                           minimising loss(ctx, batch, out);
            on_batch(ctx, batch, out)      after each batch's forward pass: per-client sums
            end_client(ctx)              -> the client's new Messages.client_state (ctx.new_state)
            uplink(ctx)                  -> Messages.up entries, summed or one row per client (no side effects)
    server  aggregate(server_round, w, replies)  -> the new global model, from the sums, rows and reports:
                                         the run's server optimiser steps from w to the method's
                                         aggregate (server_step), then the method's own updates
    server  global_updated(server_round, w)  after each new global model w: what the method keeps of it
                                         (after aggregate; once per step of an asynchronous server)
    server  reported(w)                  -> the model evaluated and saved (default: the global model)

What the client role's hooks leave for the loss (a per-round temperature, a client's correction)
is declared once too, in :meth:`Algorithm.inputs` (:mod:`mpifed.algorithms.inputs`): buffers
allocated once and set in place as ``self.inputs.<name>``, so a captured step never replays a stale
value (``mpifed check-method`` proves it by replaying the captured step against an eager one).

Every message is declared once, in :meth:`Algorithm.messages`, and read back by name as an
attribute of a :class:`Fields` (``down.teacher``, ``ctx.state.control``, ``replies.sums.model``);
a name it does not declare is an error that lists the declared ones. A client's state starts
as zeros of its declared shapes; the server's first downlink is checked against the
declaration when the run starts.

The base classes are FedAvg: clients minimise cross-entropy and send n_k w_k and n_k (or
1 and w_k with ``train.client_weights: uniform``); the server divides the sums, and the run's
``server_optimizer`` steps the global model to that mean (sgd at lr 1, the default: the mean itself).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Iterator, Literal, Mapping

import torch
import torch.nn.functional as F

from mpifed.algorithms.inputs import (  # noqa: F401 (Buffer and UndeclaredInput: for method files to import here)
    Buffer, InputBuffers, Inputs, UndeclaredInput, merged_parts)
from mpifed.data.store import ClientData, rows, take
from mpifed.data.transforms import BatchTransform
from mpifed.local.flat import FlatModel
from mpifed.models.base import Classifier
from mpifed.local.optim import FlatOptimizer
from mpifed.plugin.options import NoOptions
from mpifed.local.steps import Batch, LocalSteps, batches_per_epoch
from mpifed.local.train_config import TrainConfig

if TYPE_CHECKING:
    from mpifed.federation.server_optimizers import ServerOptimizer

Shape = tuple[int, ...]


class NonFiniteLoss(FloatingPointError):
    """The local loss became NaN or infinite."""


# ------------------------------------------------------------------- what travels
class ProtocolError(RuntimeError):
    """A role sent something other than what its method's messages() declare."""


class UndeclaredName(AttributeError):
    """A role read a message entry its method's messages() do not declare."""


class Fields:
    """The tensors of one declared message, each under its declared name as an attribute:
    ``down.teacher``, ``ctx.state.control``, ``replies.sums.model``. Reading a name that is not
    declared raises :class:`UndeclaredName`, listing the declared ones. Read-only; iterating
    gives (name, tensor) pairs."""

    __slots__ = ("_Fields__what", "_Fields__values")

    def __init__(self, what: str, values: Mapping[str, torch.Tensor]) -> None:
        object.__setattr__(self, "_Fields__what", what)
        object.__setattr__(self, "_Fields__values", dict(values))

    def __getattr__(self, name: str) -> torch.Tensor:
        if name.startswith("_Fields__"):
            raise AttributeError(name)
        try:
            return self.__values[name]
        except KeyError:
            declared = sorted(self.__values)
            raise UndeclaredName(f"{self.__what} has no {name!r}; the method's messages() declare "
                                 f"{declared if declared else 'none'}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self.__what} is read-only: return new tensors from the hook instead")

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.__values.items())

    def __len__(self) -> int:
        return len(self.__values)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in self.__values.items())
        return f"Fields({self.__what}: {shapes})"


def checked(what: str, declared: Iterable[str], values: Mapping[str, torch.Tensor] | Fields, source: str) -> Fields:
    """What a hook (``source``) returned as ``what``: exactly the ``declared`` names, or a
    :class:`ProtocolError` naming both."""
    given = dict(values) if isinstance(values, Mapping) else {k: v for k, v in values}
    declared = sorted(declared)
    if sorted(given) != declared:
        raise ProtocolError(f"{source} returned {sorted(given)} as {what}; the method's messages() declare {declared}")
    return Fields(what, given)


def renewed(old: Fields, values: Mapping[str, torch.Tensor] | Fields, source: str) -> Fields:
    """``values`` as the next version of ``old`` (a client's state): the same names, or a :class:`ProtocolError`."""
    return checked(old._Fields__what, [name for name, _ in old], values, source)


def zeros(what: str, shapes: Mapping[str, Shape], device: torch.device | str = "cpu") -> Fields:
    """Float32 zeros of the declared ``shapes``: a client's state before it first trains."""
    return Fields(what, {name: torch.zeros(shape, device=device) for name, shape in shapes.items()})


@dataclass(frozen=True)
class Up:
    """An uplink entry: its shape, and how it travels: ``sum`` (one Reduce of float64 sums over
    all clients) or ``per_client`` (one float32 row per client, gathered to the server)."""

    shape: Shape
    travel: Literal["sum", "per_client"] = "sum"


def summed(*shape: int) -> Up:
    return Up(tuple(shape), "sum")


def per_client(*shape: int) -> Up:
    return Up(tuple(shape), "per_client")


@dataclass(frozen=True)
class Messages:
    """Everything a method sends besides the global model, by name and shape: the one place a
    method names its messages.

    * ``down``: float32 tensors broadcast with the global model each round;
    * ``statistics``: float64 sums over the round's clients, all-reduced between the workers
      before local training;
    * ``up``: what each client returns (:class:`Up`);
    * ``client_state``: float32 tensors each client keeps from one round it trains in to the next
      (zeros before it first trains).

    Each name is a Python identifier (roles read it as an attribute); ``weights`` and ``ints``
    name the global model on the :class:`Downlink`, so ``down`` cannot use them.
    """

    down: dict[str, Shape] = field(default_factory=dict)
    statistics: dict[str, Shape] = field(default_factory=dict)
    up: dict[str, Up] = field(default_factory=dict)
    client_state: dict[str, Shape] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for part in ("down", "statistics", "up", "client_state"):
            bad = [name for name in getattr(self, part) if not (isinstance(name, str) and name.isidentifier())]
            if bad:
                raise ValueError(f"Messages.{part}: {bad} are not Python identifiers; roles read each entry as an "
                                 f"attribute (down.<name>), so name them like variables")
        taken = sorted(set(self.down) & set(Downlink.__slots__))
        if taken:
            raise ValueError(f"Messages.down: {taken} name the global model on the Downlink (down.weights, down.ints); "
                             f"choose other names")

    def extend(self, **more: dict) -> "Messages":
        """These messages plus ``more`` (e.g. ``down={...}``); a name declared twice is an error."""
        return Messages(**merged_parts(self, ("down", "statistics", "up", "client_state"), more))


# ------------------------------------------------------------------- shared context
@dataclass
class Setup:
    """What every rank knows about the run when a method's roles are built."""

    num_classes: int
    num_clients: int
    clients_per_round: int
    num_floats: int            # length of the flat float32 state (parameters, then float buffers)
    num_params: int            # of which parameters
    num_ints: int              # length of the flat int64 state (integer buffers: BatchNorm's counters)
    feature_dim: int           # the model's features(x) width
    train: TrainConfig
    device: torch.device
    new_model: Callable[[], FlatModel]   # a fresh network (with the method's extensions) on this rank's device
    seed: int = 0              # run.seed: for a method's own random draws (e.g. a server-side generator)

    def initial_model(self) -> FlatModel:
        """The run's initial global model, the same draw on every rank: a new network after
        ``torch.manual_seed(seed)`` (which it leaves set, as the server's start does)."""
        torch.manual_seed(self.seed)
        return self.new_model()


class Downlink(Fields):
    """What a client receives each round: the global model (``weights``, the float state;
    ``ints``, the integer buffers such as BatchNorm's counters) and the method's ``down`` tensors
    by name (``down.teacher``)."""

    __slots__ = ("weights", "ints")

    def __init__(self, weights: torch.Tensor, ints: torch.Tensor, sent: Mapping[str, torch.Tensor] | Fields,
                 what: str = "the downlink") -> None:
        super().__init__(what, sent if isinstance(sent, Mapping) else dict(iter(sent)))
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "ints", ints)


@dataclass
class Outputs:
    """The model's outputs on a batch: ``features`` (the classifier's input) and ``logits``.

    Every model computes ``logits = head(features(x))``, so the features come at no extra cost.
    """

    features: torch.Tensor
    logits: torch.Tensor


def forward(model: Classifier, x: Any) -> Outputs:
    z = model.features(x)
    return Outputs(z, model.head(z))


@dataclass
class ClientContext:
    """One client's local training in one round."""

    cid: int
    server_round: int               # the round, 1 for the first (as Flower numbers it)
    lr: float
    flat: FlatModel                 # the local model, loaded with the global model
    global_weights: torch.Tensor    # the round's global float state (on the device)
    data: ClientData
    transform: BatchTransform
    generator: torch.Generator      # seeded by (seed, round, client), on the device: batches and augmentation
    train_cfg: TrainConfig
    # the Messages.client_state it starts with
    state: Fields = field(default_factory=lambda: Fields("the client state", {}))
    new_state: Fields = field(default_factory=lambda: Fields("the client state", {}))   # what it keeps: end_client's
    epoch: int = 0                  # the local epoch (pass over the data) being trained (0-based)
    steps: int = 0
    loss_sum: float = 0.0
    seen: int = 0
    extra: dict[str, float] = field(default_factory=dict)   # per-client figures for clients.jsonl
    runner: LocalSteps = field(default_factory=LocalSteps)  # how local steps run (precision, CUDA graphs)
    step_limit: int = 0             # the local steps the server's plan allows this round (0: the full local work)

    @property
    def model(self) -> Classifier:
        return self.flat.model

    @property
    def round(self) -> int:
        raise AttributeError("ctx.round is gone: read ctx.server_round, which numbers the rounds from 1 (ctx.round "
                             "counted from 0), and check what the hook computes from it")

    @property
    def num_samples(self) -> int:
        return self.data.num_samples

    @property
    def weight(self) -> float:
        """The client's weight in the server's average: n_k, or 1 with ``train.client_weights: uniform``."""
        return 1.0 if self.train_cfg.client_weights == "uniform" else float(self.num_samples)

    @property
    def batches_per_epoch(self) -> int:
        """How many mini-batches :meth:`batches` yields."""
        return int(batches_per_epoch(self.num_samples, self.train_cfg.batch_size))

    @property
    def epochs(self) -> int:
        """The passes over its data this client makes this round: train.local_epochs, or with
        train.local_steps (or a step limit from the round's plan) as many as its steps need (the last
        one cut short where they end)."""
        steps = self.step_limit or self.train_cfg.local_steps
        return -(-steps // self.batches_per_epoch) if steps else self.train_cfg.local_epochs

    def batches(self) -> Iterator[Batch]:
        """One epoch of shuffled, augmented mini-batches (a trailing single sample is dropped when
        the batch size is larger: BatchNorm cannot train on it)."""
        n, size = self.num_samples, self.train_cfg.batch_size
        perm = torch.randperm(n, generator=self.generator, device=self.generator.device).to(self.data.labels.device)
        for start in range(0, n, size):
            idx = perm[start: start + size]
            if len(idx) == 1 and n > 1 and size > 1:
                return
            yield Batch(self.transform.train(take(self.data.inputs, idx), self.generator), self.data.labels[idx], idx)


@dataclass
class ClientReport:
    """A client's small figures, gathered by the server with every round."""

    cid: int
    worker: int
    samples: int
    steps: int
    train_loss: float
    seconds: float
    extra: dict[str, float]


@dataclass
class Replies:
    """What the server receives from a round's clients, by the names of Messages.up.

    ``sums`` holds the ``sum`` entries summed over all clients (float64; ``replies.sums.model``);
    ``rows`` the ``per_client`` entries, one row per client in the order of ``clients``
    (ascending client id). Plain dicts given are read as :class:`Fields`.
    """

    sums: Fields
    rows: Fields
    clients: list[ClientReport]

    def __post_init__(self) -> None:
        if isinstance(self.sums, Mapping):
            self.sums = Fields("the uplink sums", self.sums)
        if isinstance(self.rows, Mapping):
            self.rows = Fields("the per-client uplink", self.rows)


@dataclass
class ServerTools:
    """What the server gives a method: a scratch model, the server-held data (if any) and the run's
    server optimiser (``server_optimizer``; None: the aggregate itself, as ``sgd`` at lr 1)."""

    flat: FlatModel
    transform: BatchTransform
    data: ClientData | None
    eval_batch_size: int
    optimizer: ServerOptimizer | None = None

    @torch.no_grad()
    def logits(self, weights: torch.Tensor, ints: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the model with state ``weights`` on the server-held data (eval mode)."""
        if self.data is None:
            raise RuntimeError("this run has no server-held data (data.server_holdout_per_class is 0)")
        self.flat.load(weights.to(self.flat.floats.device), ints)
        model = self.flat.model.eval()
        size = self.eval_batch_size
        return torch.cat([model(self.transform.eval(rows(self.data.inputs, i, i + size)))
                          for i in range(0, self.data.num_samples, size)])


# ------------------------------------------------------------------- behaviour checks
@dataclass(frozen=True)
class Switches:
    """``--set`` overrides under which tests/test_method_behaviour.py checks a method: ``on``
    switches its own term on (the MPI-equals-debug run uses them too; the run must differ from
    ``reference``'s); ``off`` reduces the method exactly to the run of ``reference`` (``None``:
    no setting does, and the method's own tests say why)."""

    on: tuple[str, ...] = ()
    off: tuple[str, ...] | None = None
    reference: tuple[str, ...] = ("algorithm.name=fedavg",)


# ------------------------------------------------------------------- the roles
class Server:
    """FedAvg's server role: the new global model is sum_k w_k n_k / sum_k n_k.

    ``state`` names the attributes that hold what the server keeps from round to round
    (tensors, lists of tensors, or None), each set in ``__init__`` (or ``None`` there until
    :meth:`start`): the checkpoint saves them under these names and a resume restores them. A
    name the server does not set is an error when the method is built.
    """

    state: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: Any, setup: Setup, tools: ServerTools) -> None:
        self.options = options
        self.setup = setup
        self.tools = tools

    def start(self, weights: torch.Tensor) -> None:
        """Once, with the initial global model, before the first round (and before
        ``load_state_dict`` on resume)."""

    def downlink(self, server_round: int, weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ``Messages.down`` tensors of round ``server_round`` (1 for the first) by name, for global model
        ``weights``. The first round's is made when the run starts, and checked there against the
        declaration."""
        return {}

    def aggregate(self, server_round: int, weights: torch.Tensor, replies: Replies) -> torch.Tensor:
        """The new global model from the replies of round ``server_round`` (1 for the first): the
        server optimiser's step from ``weights`` to the weighted mean of the clients' models."""
        return self.server_step(weights, (replies.sums.model / replies.sums.weight).to(torch.float32))

    def server_step(self, weights: torch.Tensor, aggregate: torch.Tensor) -> torch.Tensor:
        """The new global model from the current one (``weights``) and the round's ``aggregate``: the
        step of the run's ``server_optimizer`` (sgd at lr 1, the default, returns ``aggregate`` itself;
        BatchNorm's statistics always take the aggregate). :meth:`aggregate` takes it; a method whose
        aggregate does not call the base class's returns ``self.server_step(weights, its_aggregate)``
        (or declares ``Algorithm.own_server_step``)."""
        optimizer = self.tools.optimizer if self.tools is not None else None
        return aggregate if optimizer is None else optimizer.step(weights, aggregate)

    def global_updated(self, server_round: int, weights: torch.Tensor) -> None:
        """The global model of round ``server_round`` is now ``weights``: keep what later downlinks need of it
        (FedGKD's buffer of past global models). Called after :meth:`aggregate` in each round that changed
        the model, and once per server step of an asynchronous server (``aggregation: fedbuff``,
        ``fedasync``: its rule takes the step in place of :meth:`aggregate`), ``server_round`` the new
        version."""

    def reported(self, weights: torch.Tensor) -> torch.Tensor:
        """The float state the run evaluates and saves as its model, given the global model
        ``weights`` just aggregated: the global model itself, unless the method reports another
        (FedDyn's official code reports the mean of the round's client models)."""
        return weights

    def log(self) -> dict[str, Any]:
        """Figures of the round just aggregated, for metrics.jsonl."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Server state needed to resume exactly: the ``state`` attributes, on the CPU."""
        return {name: _moved(getattr(self, name), torch.device("cpu")) for name in self.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned: each tensor where the attribute's tensor lives now
        (set by ``__init__`` or :meth:`start`), else on the run's device."""
        for name in self.state:
            now = getattr(self, name)
            setattr(self, name, _moved(state[name], now.device if isinstance(now, torch.Tensor) else self.setup.device))


def _moved(value: Any, device: torch.device) -> Any:
    """A state value (a tensor, a list of tensors, or None) on ``device``."""
    if isinstance(value, list):
        return [v.to(device) for v in value]
    return None if value is None else value.to(device)


class Client:
    """FedAvg's client role: E epochs of SGD on cross-entropy, then n_k w_k and n_k up.

    A role keeps on ``self`` only what its ``__init__`` builds (teachers, generators: objects
    loaded in place); what its hooks set for the loss, per round or per client, are its method's
    declared inputs (``self.inputs``, :class:`~mpifed.algorithms.inputs.Inputs`): anything else its
    step reads is replayed stale by a captured step (``mpifed check-method`` finds it). ``eager`` says
    why the role's steps must not be captured as CUDA graphs (empty: they can be, see
    :meth:`eager_reason`).
    """

    eager: ClassVar[str] = ""

    def __init__(self, options: Any, setup: Setup) -> None:
        self.options = options
        self.setup = setup
        if "inputs" not in self.__dict__:       # a role built directly, not by its method: no inputs
            self.inputs = InputBuffers(Inputs(), setup.device if setup is not None else "cpu")

    @classmethod
    def eager_reason(cls) -> str:
        """Why this role's local steps run eagerly under ``resources.cuda_graphs`` (empty: they are
        captured). Its own ``eager``, or a hook that works outside a fixed step: per-batch sums
        (:meth:`on_batch`), its own :meth:`step`, :meth:`optimizer` or :meth:`train`."""
        if cls.eager:
            return cls.eager
        for hook, what in (("on_batch", "collects per-client sums after each batch (on_batch)"),
                           ("step", "makes its own local step (step)"),
                           ("optimizer", "makes its own optimiser (optimizer)"),
                           ("train", "runs its own local training (train)")):
            if getattr(cls, hook) is not getattr(Client, hook):
                return what
        return ""

    def round_start(self, server_round: int, down: Downlink) -> None:
        """Once per round on each worker, with what the server sent for round ``server_round`` (1 for the
        first)."""

    def statistics(self, data: ClientData, transform: BatchTransform) -> dict[str, torch.Tensor]:
        """One client's contribution to the ``Messages.statistics`` sums, by name."""
        return {}

    def use_statistics(self, totals: Fields) -> None:
        """The ``Messages.statistics`` sums over all of the round's clients (``totals.<name>``)."""

    def local_round(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """One client's local round, the lifecycle every method plugs into: :meth:`begin_client`,
        :meth:`train` (:meth:`on_batch` after each forward pass), :meth:`end_client` (its result,
        checked against the declared names, becomes ``ctx.new_state``), then :meth:`uplink`, whose
        entries it returns."""
        self.begin_client(ctx)
        self.train(ctx)
        ctx.new_state = renewed(ctx.state, self.end_client(ctx), f"{type(self).__name__}.end_client")
        return self.uplink(ctx)

    def begin_client(self, ctx: ClientContext) -> None:
        """Before a client's local training: set up what :meth:`loss` and :meth:`on_batch` read for
        this client (from ``ctx.state``, ``ctx.global_weights``, its data), on ``self``."""

    def train(self, ctx: ClientContext) -> None:
        """E epochs of local training (``ctx.epochs`` passes, ``train.local_steps`` steps where set), one
        :meth:`step` per batch; fills ctx.steps/loss_sum/seen.

        A fresh optimiser (and momentum) for every client in every round, as the papers do.
        """
        limit = ctx.step_limit or self.setup.train.local_steps
        ctx.model.train()
        opt = self.optimizer(ctx)
        for epoch in range(ctx.epochs):
            ctx.epoch = epoch
            epoch_loss = torch.zeros((), device=ctx.data.labels.device)
            for batch in ctx.batches():
                loss = ctx.runner(self, ctx, opt, batch)
                epoch_loss += loss.detach() * len(batch.y)
                ctx.steps += 1
                ctx.seen += len(batch.y)
                if ctx.steps == limit:
                    break
            value = float(epoch_loss)
            if not math.isfinite(value):
                raise NonFiniteLoss(
                    f"client {ctx.cid}, round {ctx.server_round}, epoch {epoch + 1}: the local loss is {value} "
                    f"(learning rate {ctx.lr:g}). Lower train.lr, set train.grad_clip, or check the data")
            ctx.loss_sum += value

    def optimizer(self, ctx: ClientContext) -> FlatOptimizer:
        """The local optimiser of one client's training: ``train.optimizer`` (the worker's own, reset,
        when its steps are captured as CUDA graphs)."""
        return ctx.runner.optimizer(ctx.flat, ctx.lr, self.setup.train)

    def step(self, ctx: ClientContext, opt: FlatOptimizer, batch: Batch) -> torch.Tensor:
        """One local step on ``batch``: forward, :meth:`loss`, backward, clipping, update; returns the loss.

        Nothing in it waits for the host (no ``.item()``, no boolean-mask indexing, no tensor made
        from Python data), so the GPU never idles between steps and the step can be captured.
        """
        with ctx.runner.autocast(ctx.flat.floats.device):
            out = forward(ctx.model, batch.x)
            with torch.no_grad():
                self.on_batch(ctx, batch, out)
            loss = self.loss(ctx, batch, out)
        opt.zero_grad()
        loss.backward()
        if self.setup.train.grad_clip > 0:
            opt.clip_grad_norm(self.setup.train.grad_clip)
        opt.step()
        return loss

    def on_batch(self, ctx: ClientContext, batch: Batch, out: Outputs) -> None:
        """After each training batch's forward pass (no gradient, the step's precision): add the
        batch to this client's sums (e.g. per-class logits, in ``client`` inputs zeroed before each
        client). A role that overrides it runs its steps eagerly."""

    def loss(self, ctx: ClientContext, batch: Batch, out: Outputs) -> torch.Tensor:
        """The local objective on one batch (FedAvg: cross-entropy), from the batch, the model
        (``out``, ``ctx.model``), the round's ``ctx.global_weights``, objects built in ``__init__``
        (teachers) and the declared ``self.inputs``. Unless the role runs eagerly
        (:meth:`eager_reason`), a per-client field of ``ctx`` (``ctx.state``, ``ctx.lr``,
        ``ctx.server_round``...) read here is replayed stale by a captured step: copy it into a declared
        input in :meth:`begin_client`."""
        return F.cross_entropy(out.logits, batch.y)

    def end_client(self, ctx: ClientContext) -> dict[str, torch.Tensor] | Fields:
        """After local training: the client's new ``Messages.client_state``, by name (the one place
        where it changes; the worker keeps it as ``ctx.new_state`` and stores it), and its figures
        in ``ctx.extra``. Default: the state unchanged."""
        return ctx.state

    def uplink(self, ctx: ClientContext) -> dict[str, torch.Tensor]:
        """What this client returns: every ``Messages.up`` entry by name (FedAvg: weight * w_k and
        weight), from the trained model, ``ctx.state`` and ``ctx.new_state``; changes nothing."""
        weight = ctx.weight
        return {"model": ctx.flat.floats.double() * weight, "weight": torch.tensor([weight], dtype=torch.float64)}


class Algorithm:
    """FedAvg (McMahan et al., 2017), and what every method declares.

    Subclasses set ``Options`` (a dataclass of the method's config keys), ``Server`` and
    ``Client`` (role classes), ``needs_server_data`` (why the method needs
    ``data.server_holdout_per_class``; empty if it does not), ``switches`` (the settings its
    behaviour tests use), ``depends_on`` (the settings beyond its own options whose values its
    numbers depend on, where mpifed would not count them: ``("train.rounds",)`` for a schedule
    over the rounds), ``own_server_step`` (why its server role steps the global model itself, as
    FedAvgM's momentum does, so that it refuses any ``server_optimizer`` but sgd at lr 1; empty
    if it does not), ``asynchronous`` (how the method runs under ``aggregation: fedbuff`` or
    ``fedasync``, where each client trains from the model version it started from and the server
    takes the asynchronous rule's step instead of the method's aggregation; empty: it needs
    synchronous rounds and is refused there), and override :meth:`messages` and
    :meth:`extend_model` where they add to FedAvg's.
    """

    Options: ClassVar[type] = NoOptions
    Server: ClassVar[type[Server]] = Server
    Client: ClassVar[type[Client]] = Client
    needs_server_data: ClassVar[str] = ""
    switches: ClassVar[Switches] = Switches()
    depends_on: ClassVar[tuple[str, ...]] = ()   # dotted config keys: part of the run's identity with this method
    own_server_step: ClassVar[str] = ""   # why its server steps itself: it takes no server_optimizer but sgd at lr 1
    extra_forwards: ClassVar[int] = 0   # forward passes per sample beyond FedAvg's forward and backward (the clock's)
    asynchronous: ClassVar[str] = ""    # how it runs under an asynchronous aggregation (empty: it is refused there)

    def __init__(self, options: Any, setup: Setup) -> None:
        self.options = options
        self.setup = setup

    @classmethod
    def forward_passes(cls, options: Any) -> int:
        """Forward passes one local step costs per sample (the virtual clock's compute time): FedAvg's
        forward and backward count 3 (FedScale's factor), plus :attr:`extra_forwards` (a teacher's, MOON's
        two models'); a method whose count depends on its options overrides this."""
        return 3 + cls.extra_forwards

    def messages(self) -> Messages:
        """FedAvg's: the weighted model sum and the weights, summed over clients."""
        return Messages(up={"model": summed(self.setup.num_floats), "weight": summed(1)})

    def inputs(self) -> Inputs:
        """What the client role's hooks set for its loss, per round and per client (FedAvg: nothing)."""
        return Inputs()

    @classmethod
    def extend_model(cls, net: Classifier, options: Any) -> Classifier:
        """The network the method trains, built from the zoo's ``net`` (e.g. MOON adds a projection head)."""
        return net

    @classmethod
    def check_config(cls, cfg: Any) -> list[str]:
        """Problems with the rest of the run's configuration for this method, each naming the fix."""
        return []

    def server(self, tools: ServerTools) -> Server:
        server = self.Server(self.options, self.setup, tools)
        unset = [name for name in server.state if not hasattr(server, name)]
        if unset:
            raise TypeError(f"{type(server).__name__}.state names {unset}, which {type(server).__name__}.__init__ "
                            f"does not set")
        return server

    def client(self) -> Client:
        """The client role, with its declared inputs allocated on the run's device."""
        role = self.Client
        client = role.__new__(role)
        client.inputs = InputBuffers(self.inputs(), self.setup.device)
        client.__init__(self.options, self.setup)
        return client


# the hooks a role may override, with the arguments the round passes them (after self)
_HOOKS: dict[type, dict[str, int]] = {
    Client: {"round_start": 2, "statistics": 2, "use_statistics": 1, "local_round": 1, "begin_client": 1, "train": 1,
             "optimizer": 1, "step": 3, "on_batch": 3, "loss": 3, "end_client": 1, "uplink": 1},
    Server: {"start": 1, "downlink": 2, "aggregate": 3, "global_updated": 2, "reported": 1, "log": 0,
             "state_dict": 0, "load_state_dict": 1},
}


def _parameters(hook: Any) -> list[str]:
    """A hook's parameter names after ``self`` (none where it has no signature)."""
    import inspect
    try:
        return list(inspect.signature(hook).parameters)[1:]
    except (TypeError, ValueError):
        return []


def role_problems(cls: Any) -> list[str]:
    """Why a registered algorithm cannot run in the round (empty when it can): not an Algorithm,
    roles that are not a Server and a Client, a hook that cannot take the round's arguments, or a
    server ``state`` that is not a tuple of attribute names."""
    import inspect
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        return ["is not a subclass of mpifed.algorithms.base.Algorithm (register the method's Algorithm class)"]
    problems = []
    for role, base in (("Server", Server), ("Client", Client)):
        given = getattr(cls, role)
        if not (isinstance(given, type) and issubclass(given, base)):
            problems.append(f"its {role} is {given!r}, not a subclass of mpifed.algorithms.base.{base.__name__}")
            continue
        for hook, count in _HOOKS[base].items():
            mine = getattr(given, hook)
            if mine is getattr(base, hook):
                continue
            if "rnd" in _parameters(mine) and "server_round" in _parameters(getattr(base, hook)):
                wanted = ", ".join(_parameters(getattr(base, hook)))
                problems.append(f"{given.__name__}.{hook} takes rnd, the round counted from 0; the round now calls "
                                f"{hook}({wanted}) with server_round, counted from 1 as Flower does: rename the "
                                f"argument and check what the hook computes from it (rnd == 0 is server_round == 1)")
                continue
            try:
                inspect.signature(mine).bind(None, *[None] * count)
            except TypeError:
                wanted = ", ".join(["self"] + list(inspect.signature(getattr(base, hook)).parameters)[1:])
                problems.append(f"{given.__name__}.{hook}{inspect.signature(mine)} cannot be called as the round "
                                f"calls it: {hook}({wanted})")
            except ValueError:
                continue
    if isinstance(cls.Client, type) and issubclass(cls.Client, Client):
        if hasattr(cls.Client, "capture_key"):
            problems.append(f"{cls.Client.__name__}.capture_key is no longer read: whether a step is captured follows "
                            f"from the method's inputs() (declare what the loss reads there; eager = \"<why>\" to opt "
                            f"out); remove capture_key")
    depends = cls.depends_on
    if not isinstance(depends, tuple) or not all(isinstance(k, str) and "." in k for k in depends):
        problems.append(f"{cls.__name__}.depends_on is {depends!r}; it names the settings the method's numbers depend "
                        f"on, as a tuple of dotted config keys, e.g. depends_on = (\"train.rounds\",)")
    state = getattr(cls.Server, "state", ())
    if isinstance(cls.Server, type) and (not isinstance(state, tuple) or not all(isinstance(s, str) for s in state)):
        problems.append(f"{cls.Server.__name__}.state is {state!r}; it names the attributes a checkpoint keeps, as a "
                        f"tuple of strings, e.g. state = (\"momentum\",)")
    return problems
