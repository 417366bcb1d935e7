"""FedNTD (Lee et al., NeurIPS 2022; paper 003): not-true distillation from the global model."""
from __future__ import annotations

from dataclasses import dataclass

from mpifed.algorithms.base import Algorithm, Client
from mpifed.algorithms.teacher import Teacher
from mpifed.losses import ntd_loss
from mpifed.options import opt
from mpifed.registry import ALGORITHMS


class FedNTDClient(Client):
    """Local loss CE + beta * L_NTD (Eq. 10), L_NTD the KL over the not-true classes (Eq. 11).

    The teacher is this round's global model, frozen, in eval mode, queried under no_grad
    on the same (augmented) batch as the student.
    """

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.teacher = Teacher(setup)

    def round_start(self, rnd, down):
        self.teacher.load(down.weights, down.ints)

    def loss(self, ctx, batch, out):
        distill = ntd_loss(out.logits, self.teacher.batch_logits(ctx, batch), batch.y, self.options.tau)
        return super().loss(ctx, batch, out) + self.options.beta * distill


@ALGORITHMS.register("fedntd")
class FedNTD(Algorithm):
    """FedNTD (Lee et al., NeurIPS 2022; paper 003): CE + beta * not-true distillation from the round's
    global model (Eqs. 10-11).

    Defaults tau = 1, beta = 1 are the official configuration's (``config/fedntd.json``). The KL
    carries tau^2 as every temperature-scaled KL in :mod:`mpifed.losses` does (the official code
    has had versions with and without it; no effect at the default tau = 1). No extra communication.
    """

    @dataclass
    class Options:
        tau: float = opt(1.0, "temperature of the not-true softmax", min=0, exclusive_min=True)
        beta: float = opt(1.0, "weight of the not-true distillation loss", min=0)

    Client = FedNTDClient
