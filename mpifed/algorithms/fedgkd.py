"""FedGKD and FedGKD-VOTE (Yao et al.; paper 004): distillation from the last M global models."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm, Client, Inputs, Server, Switches
from mpifed.algorithms.teacher import Teacher
from mpifed.local.losses import kd_loss
from mpifed.models.base import ProjectionHead
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


class BufferServer(Server):
    """Keeps the last M global models (Alg. 1's buffer): each round's aggregate, or each asynchronous
    server step's new version."""

    state = ("buffer",)

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        self.buffer: list[torch.Tensor] = []
        self.teacher_models = 0      # global models behind this round's teacher(s), for the log

    def teachers(self, weights: torch.Tensor) -> list[torch.Tensor]:
        """The buffered models this round distils from (round 1: none, or the initial model)."""
        models = self.buffer or ([weights] if self.options.distill_first_round else [])
        self.teacher_models = len(models)
        return models

    def global_updated(self, server_round, weights):
        self.buffer = (self.buffer + [weights.clone()])[-self.options.buffer_size:]

    def log(self) -> dict[str, Any]:
        return {"teacher_models": self.teacher_models}


class FedGKDServer(BufferServer):
    def downlink(self, server_round, weights):
        models = self.teachers(weights)
        if models:
            return {"teacher": torch.stack(models).mean(0), "active": torch.ones(1)}
        return {"teacher": torch.zeros_like(weights), "active": torch.zeros(1)}


class FedGKDClient(Client):
    """CE + (gamma/2) * KD(teacher || student) (Eqs. 3-4), or CE + (gamma/2) * MSE(logits) (Table 9)."""

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.teacher = Teacher(setup)

    def round_start(self, server_round, down):
        self.inputs.active = bool(down.active.item())
        if self.inputs.active:
            self.teacher.load(down.teacher, down.ints)

    def loss(self, ctx, batch, out):
        ce = super().loss(ctx, batch, out)
        if not self.inputs.active:
            return ce
        teacher = self.teacher.batch_logits(ctx, batch)
        if self.options.loss == "mse":
            return ce + self.options.gamma / 2 * F.mse_loss(out.logits, teacher.detach())
        return ce + self.options.gamma / 2 * kd_loss(out.logits, teacher, self.options.tau)


@ALGORITHMS.register("fedgkd")
class FedGKD(Algorithm):
    """FedGKD (Yao et al.; paper 004): CE + (gamma/2) KD from the average of the last M global models.

    Local loss CE + (gamma/2) * KD(teacher || student) (Eqs. 3-4), the teacher the parameter
    average of the buffered global models (Alg. 1), sent next to the global weights.

    The server's buffer holds the last M models produced by aggregation, so in round t the
    teacher averages w_t, ..., w_{t-M+1} (including the model the clients start from); with
    M = 1 it is the current global model. The average covers parameters and float buffers
    (as the official code averages the whole state dict). Round 1 has no aggregated model:
    by default it trains without distillation as the official code does (``comm_round <= 1``);
    ``distill_first_round: true`` distils from the initial model instead. Defaults: M = 5
    (Table 7), gamma = 0.2 (ResNet-8; the paper uses 0.1 for ResNet-50), tau = 1 (the code's
    default; the paper gives none). Downlink: two models per round (one when M = 1 would
    suffice, but the teacher is always sent to keep the layout fixed).

    ``loss: mse`` replaces the KL by the mean squared error between the student's and the
    teacher's logits, the regulariser of Table 9 ("means squared error (MSE) defined over the
    logit", Sec. 5.3), as the official code computes it (``pcode/workers/worker_fedgkd.py``,
    ``loss_type == 'mse'``: ``F.mse_loss(student_logits, teacher_logits)``, the mean over the
    batch and the classes, no temperature), with the same weight gamma/2.

    FedGKD+ (Sec. 5.1, "to compare with MOON"): ``projection_dim: 256`` adds MOON's projection
    head (SimCLR's 2-layer MLP, output 256) to the network; the loss is unchanged (no
    contrastive term).

    Asynchronously (``aggregation: fedbuff`` or ``fedasync``; the paper has only rounds): the
    buffer holds the last M versions the server's steps made, and a client distils from the
    teacher made at the version it started from, sent with that version's model, not from the
    teacher of the version current when its update arrives. That keeps the round's relation
    between the two: the teacher averages the M global models up to and including the one the
    student starts from (with M = 1, the start model itself, as FedNTD's teacher). It is also the
    only reading a deployment can follow: a client downloads its model and teacher once, when it
    is dispatched, and cannot fetch the teachers of versions made while it trains.
    """

    extra_forwards = 1   # the averaged teacher's forward (the virtual clock's compute)
    asynchronous = "its teacher is the one made at the model version the client starts from"

    @dataclass
    class Options:
        buffer_size: int = opt(5, "M, the number of past global models averaged into the teacher", min=1)
        gamma: float = opt(0.2, "distillation weight gamma (the loss uses gamma/2)", min=0)
        tau: float = opt(1.0, "distillation temperature", min=0, exclusive_min=True)
        distill_first_round: bool = opt(False, "distil in round 1 from the initial model (the official code does not)")
        projection_dim: int = opt(0, "FedGKD+: add MOON's projection head with this output size (paper: 256; "
                                     "0: none)", min=0)
        loss: Literal["kl", "mse"] = opt("kl", "the regulariser: tau^2 KL of the softmaxes (Eq. 3) or the mean squared "
                                               "error of the logits (Table 9; no temperature)")

    Server = FedGKDServer
    Client = FedGKDClient
    switches = Switches(on=("algorithm.gamma=1", "algorithm.buffer_size=2"), off=("algorithm.gamma=0",))

    def messages(self):
        return super().messages().extend(down={"teacher": (self.setup.num_floats,), "active": (1,)})

    def inputs(self):
        return Inputs(round={"active": bool})     # distil this round (from the teacher, loaded in place)

    @classmethod
    def extend_model(cls, net, options):
        return ProjectionHead(net, options.projection_dim) if options.projection_dim else net


@ALGORITHMS.register("fedgkd_plus")
class FedGKDPlus(FedGKD):
    """FedGKD+ (paper 004, Sec. 5.1): FedGKD on the network with MOON's projection head (256),
    "to compare with MOON"; no contrastive term (the official code's ``--projection True``)."""

    @dataclass
    class Options(FedGKD.Options):
        projection_dim: int = opt(256, "output size of MOON's projection head (paper: 256, as SimCLR)", min=1)

    switches = Switches(on=("algorithm.gamma=1", "algorithm.projection_dim=16"),
                        off=("algorithm.gamma=0", "algorithm.projection_dim=16"),
                        reference=("algorithm.name=moon", "algorithm.mu=0", "algorithm.projection_dim=16"))


class VoteServer(BufferServer):
    """Sends all M buffered models and their weights gamma_m/2 = lambda softmax_m(-L_m / beta)."""

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        self.weights = torch.zeros(options.buffer_size)
        self.validation_losses: list[float] = []

    def downlink(self, server_round, weights):
        m = self.options.buffer_size
        models = self.teachers(weights)
        teachers = torch.zeros(m, self.setup.num_floats, device=weights.device)
        self.weights = torch.zeros(m)
        if models:
            labels = self.tools.data.labels
            losses = torch.stack([F.cross_entropy(self.tools.logits(w), labels) for w in models]).cpu().double()
            beta = self.options.vote_temperature or 1.0 / m
            self.weights[: len(models)] = (self.options.lam * torch.softmax(-losses / beta, dim=0)).float()
            teachers[: len(models)] = torch.stack(models)
            self.validation_losses = losses.tolist()
        return {"teachers": teachers, "teacher_weights": self.weights}

    def log(self) -> dict[str, Any]:
        return {"teacher_models": self.teacher_models, "teacher_weights": [round(float(w), 6) for w in self.weights],
                "teacher_validation_losses": [round(v, 6) for v in self.validation_losses]}


class VoteClient(Client):
    """CE + sum_m (gamma_m/2) KD(teacher_m || student) (Eq. 5)."""

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.teachers = tuple(Teacher(setup) for _ in range(options.buffer_size))

    def round_start(self, server_round, down):
        weights = down.teacher_weights.cpu().tolist()
        live = [i for i, w in enumerate(weights) if w > 0]
        self.inputs.live = len(live)
        for j, i in enumerate(live):
            self.teachers[j].load(down.teachers[i], down.ints)
            self.inputs.teacher_weights[j] = weights[i]

    def loss(self, ctx, batch, out):
        total = F.cross_entropy(out.logits, batch.y)
        for teacher, weight in zip(self.teachers[:self.inputs.live], self.inputs.teacher_weights):
            total = total + weight * kd_loss(out.logits, teacher.batch_logits(ctx, batch), self.options.tau)
        return total


@ALGORITHMS.register("fedgkd_vote")
class FedGKDVote(Algorithm):
    """FedGKD-VOTE (paper 004, Eq. 5): distil from each of the M buffered models, weighted by validation loss.

    gamma_m / 2 = lambda * exp(-L_m / beta) / sum_i exp(-L_i / beta), L_m the loss of buffered
    model m on the server's validation split (``data.server_holdout_per_class``), computed
    on the server each round. The paper sets beta = 1/M ("we set beta as 1/M"; the
    text rendering stacks the fraction) and lambda = 0.1; ``vote_temperature`` overrides beta.
    The server sends all M models: the downlink is M + 1 models per round.

    Asynchronously, as FedGKD: a client distils from the teachers and weights made at the version
    it started from (the last M versions then, weighted by their validation losses then).
    """

    needs_server_data = "a validation split to weight the buffered teachers"
    asynchronous = "its teachers and their weights are those made at the model version the client starts from"

    @dataclass
    class Options:
        buffer_size: int = opt(5, "M, the number of past global models used as teachers (paper: 5 for vision, 3 for "
                                  "NLP)", min=1)
        lam: float = opt(0.1, "lambda, the scale of the teacher weights", min=0)
        tau: float = opt(1.0, "distillation temperature", min=0, exclusive_min=True)
        vote_temperature: float | None = opt(None, "beta of the weight softmax (null: 1/M "
                                                   "as in the paper)", min=0, exclusive_min=True)
        distill_first_round: bool = opt(False, "distil in round 1 from the initial model (the official code does not)")

    Server = VoteServer
    Client = VoteClient
    switches = Switches(on=("algorithm.lam=0.5", "algorithm.buffer_size=2", "data.server_holdout_per_class=3"),
                        off=("algorithm.lam=0", "data.server_holdout_per_class=3"),
                        reference=("algorithm.name=fedavg", "data.server_holdout_per_class=3"))

    @classmethod
    def forward_passes(cls, options):
        """One teacher forward per buffered model, beside FedAvg's 3 (the virtual clock's compute)."""
        return 3 + options.buffer_size

    def messages(self):
        m = self.options.buffer_size
        return super().messages().extend(down={"teachers": (m, self.setup.num_floats), "teacher_weights": (m,)})

    def inputs(self):
        # the first `live` teachers (loaded in place) distil, with the first `live` weights
        return Inputs(round={"live": int, "teacher_weights": (self.options.buffer_size,)})
