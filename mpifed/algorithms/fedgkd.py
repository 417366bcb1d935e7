"""FedGKD and FedGKD-VOTE (Yao et al.; paper 004): distillation from the last M global models."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm
from mpifed.algorithms.teacher import Teacher
from mpifed.config import opt
from mpifed.losses import kd_loss


class FedGKD(Algorithm):
    """Local loss CE + (gamma/2) * KD(teacher || student) (Eqs. 3-4), the teacher the parameter
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
    """

    name = "fedgkd"

    @dataclass
    class Options:
        buffer_size: int = opt(5, "M, the number of past global models averaged into the teacher", min=1)
        gamma: float = opt(0.2, "distillation weight gamma (the loss uses gamma/2)", min=0)
        tau: float = opt(1.0, "distillation temperature", min=0, exclusive_min=True)
        distill_first_round: bool = opt(False, "distil in round 1 from the initial model (the official code does not)")

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.buffer: list[torch.Tensor] = []
        self.teacher: Teacher | None = None
        self.active = False
        self.teacher_models = 0      # global models behind this round's teacher (for the log)

    def downlink_spec(self):
        return {"teacher": (self.setup.num_floats,), "active": (1,)}

    def downlink(self, rnd, global_floats):
        models = self.buffer or ([global_floats] if self.options.distill_first_round else [])
        self.teacher_models = len(models)
        if models:
            return {"teacher": torch.stack(models).mean(0), "active": torch.ones(1)}
        return {"teacher": torch.zeros_like(global_floats), "active": torch.zeros(1)}

    def after_round(self, rnd, global_floats):
        self.buffer = (self.buffer + [global_floats.clone()])[-self.options.buffer_size:]

    def round_log(self) -> dict[str, Any]:
        return {"teacher_models": self.teacher_models}

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": [b.cpu() for b in self.buffer]}

    def load_state_dict(self, state):
        self.buffer = [b.to(self.setup.device) for b in state["buffer"]]

    def round_start(self, rnd, down):
        self.active = bool(down["active"].item())
        if self.active:
            self.teacher = self.teacher or Teacher(self.setup)
            self.teacher.load(down["teacher"], down["global_ints"])

    def loss(self, ctx, x, y, logits):
        ce = super().loss(ctx, x, y, logits)
        if not self.active:
            return ce
        return ce + self.options.gamma / 2 * kd_loss(logits, self.teacher.batch_logits(ctx, x), self.options.tau)


class FedGKDVote(FedGKD):
    """FedGKD-VOTE (Eq. 5): distil from each of the M buffered models, weighted by validation loss.

    gamma_m / 2 = lambda * exp(-L_m / beta) / sum_i exp(-L_i / beta), L_m the loss of buffered
    model m on the server's validation split (``data.server_holdout_per_class``), computed
    on the server each round. The paper sets beta = 1/M ("we set beta as 1/M"; the
    text rendering stacks the fraction) and lambda = 0.1; ``vote_temperature`` overrides beta.
    The server sends all M models: the downlink is M + 1 models per round.
    """

    name = "fedgkd_vote"
    needs_server_data = "a validation split to weight the buffered teachers"

    @dataclass
    class Options:
        buffer_size: int = opt(5, "M, the number of past global models used as teachers (paper: 5 for vision)", min=1)
        lam: float = opt(0.1, "lambda, the scale of the teacher weights", min=0)
        tau: float = opt(1.0, "distillation temperature", min=0, exclusive_min=True)
        vote_temperature: float | None = opt(None, "beta of the weight softmax (null: 1/M as in the paper)", min=0, exclusive_min=True)
        distill_first_round: bool = opt(False, "distil in round 1 from the initial model (the official code does not)")

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.tools = None
        self.weights = torch.zeros(options.buffer_size)
        self.validation_losses: list[float] = []
        self.teachers: list[Teacher] = []
        self.active_teachers: list[tuple[Teacher, float]] = []

    def downlink_spec(self):
        m = self.options.buffer_size
        return {"teachers": (m, self.setup.num_floats), "weights": (m,)}

    def server_start(self, global_floats, tools):
        self.tools = tools

    def downlink(self, rnd, global_floats):
        m = self.options.buffer_size
        models = self.buffer or ([global_floats] if self.options.distill_first_round else [])
        self.teacher_models = len(models)
        teachers = torch.zeros(m, self.setup.num_floats, device=global_floats.device)
        self.weights = torch.zeros(m)
        if models:
            labels = self.tools.data.labels
            losses = torch.stack([F.cross_entropy(self.tools.logits(w), labels) for w in models]).cpu().double()
            beta = self.options.vote_temperature or 1.0 / m
            self.weights[: len(models)] = (self.options.lam * torch.softmax(-losses / beta, dim=0)).float()
            teachers[: len(models)] = torch.stack(models)
            self.validation_losses = losses.tolist()
        return {"teachers": teachers, "weights": self.weights}

    def round_log(self) -> dict[str, Any]:
        return {"teacher_models": self.teacher_models, "teacher_weights": [round(float(w), 6) for w in self.weights],
                "teacher_validation_losses": [round(v, 6) for v in self.validation_losses]}

    def round_start(self, rnd, down):
        self.weights = down["weights"].cpu()
        live = [i for i, w in enumerate(self.weights.tolist()) if w > 0]
        while len(self.teachers) < len(live):
            self.teachers.append(Teacher(self.setup))
        self.active_teachers = []
        for teacher, i in zip(self.teachers, live):
            teacher.load(down["teachers"][i], down["global_ints"])
            self.active_teachers.append((teacher, float(self.weights[i])))

    def loss(self, ctx, x, y, logits):
        total = F.cross_entropy(logits, y)
        for teacher, weight in self.active_teachers:
            total = total + weight * kd_loss(logits, teacher.batch_logits(ctx, x), self.options.tau)
        return total
