"""FedCSD (Yan et al.; papers 000/001): class-prototype similarity distillation with an adaptive mask."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm
from mpifed.algorithms.teacher import Teacher
from mpifed.config import opt
from mpifed.losses import csd_loss


class FedCSD(Algorithm):
    """Alg. 1: local loss CE + mu * L_CSD (Eq. 15), with a moving-average teacher and global prototypes.

    * Teacher (Eq. 12): w_xi^{t+1} = alpha * w_xi^t + (1 - alpha) * w_G^{t+1}, w_xi^0 = w_G^0,
      kept on the server (parameters and float buffers) and broadcast with the global weights.
    * Prototypes (Eqs. 6-7): before local training each sampled client computes, with the
      teacher, the mean logit vector of each class it holds (its unaugmented data, eval
      mode). The per-class means and the number of clients holding each class are summed
      over all workers by an MPI all-reduce; the global prototype of class c is the sum of
      the client means over the clients holding c. Eq. 7 divides by K instead: each row only
      scales, which the cosine of Eq. 8 ignores. A class no client holds has a zero row.
      (The released code never averages: each client uses its own prototypes.)
    * Loss: :func:`mpifed.losses.csd_loss` (similarity score, refined teacher, adaptive mask).
      Paper defaults mu = 0.001, tau = 10 (label skew); Office-Caltech uses mu = 0.5, tau = 4.

    The paper calls the teacher frozen, so by default the similarity score carries no
    gradient and the teacher runs in eval mode; ``similarity_grad`` and ``teacher_train_mode``
    take the official code's choices instead (gradient through the score; BatchNorm in train
    mode). Two more differences of the official code follow the paper here and have no
    option: it takes the mask from the refined teacher logits (the paper's Eq. 13: the
    teacher's own prediction), and it weighs the losses (1 - mu) CE + mu L_CSD (Eq. 15:
    CE + mu L_CSD).
    """

    name = "fedcsd"

    @dataclass
    class Options:
        mu: float = opt(0.001, "weight of the CSD loss", min=0)
        tau: float = opt(10.0, "distillation temperature", min=0, exclusive_min=True)
        alpha: float = opt(0.9, "teacher moving-average momentum", min=0, max=1)
        similarity_grad: bool = opt(False, "let the gradient flow through the similarity score (official code)")
        teacher_train_mode: bool = opt(False, "run the teacher in train mode (official code; BatchNorm uses batch statistics)")

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.ema: torch.Tensor | None = None
        self.teacher: Teacher | None = None
        self.prototypes: torch.Tensor | None = None

    def downlink_spec(self):
        return {"teacher": (self.setup.num_floats,)}

    def statistics_spec(self):
        c = self.setup.num_classes
        return {"prototype_sum": (c, c), "holders": (c,)}

    # server side
    def server_start(self, global_floats, tools):
        self.ema = global_floats.clone()

    def downlink(self, rnd, global_floats):
        return {"teacher": self.ema}

    def after_round(self, rnd, global_floats):
        a = self.options.alpha
        self.ema = a * self.ema + (1 - a) * global_floats

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema.cpu()}

    def load_state_dict(self, state):
        self.ema = state["ema"].to(self.setup.device)

    # worker side
    def round_start(self, rnd, down):
        self.teacher = self.teacher or Teacher(self.setup, self.options.teacher_train_mode)
        self.teacher.load(down["teacher"], down["global_ints"])

    def client_statistics(self, data, transform):
        c = self.setup.num_classes
        logits = self.teacher.client_logits(data, transform).double()   # reused by the loss when cached
        one_hot = F.one_hot(data.labels, c).double()
        sums = one_hot.T @ logits            # per-class sums (a matrix product: deterministic on GPUs)
        counts = one_hot.sum(dim=0)
        held = counts > 0
        means = torch.where(held[:, None], sums / counts.clamp(min=1)[:, None], torch.zeros_like(sums))
        return {"prototype_sum": means, "holders": held.double()}

    def use_statistics(self, totals):
        holders = totals["holders"].clamp(min=1)[:, None]
        self.prototypes = (totals["prototype_sum"] / holders).float()

    def loss(self, ctx, x, y, logits):
        distill = csd_loss(logits, self.teacher.batch_logits(ctx, x), y, self.prototypes, self.options.tau, self.options.similarity_grad)
        return super().loss(ctx, x, y, logits) + self.options.mu * distill
