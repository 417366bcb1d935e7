"""FedNTD (Lee et al., NeurIPS 2022; paper 003): not-true distillation from the global model."""
from __future__ import annotations

from dataclasses import dataclass

from mpifed.algorithms.base import Algorithm, Client, Switches
from mpifed.algorithms.teacher import Teacher
from mpifed.local.losses import kd_loss, ntd_loss
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


class FedNTDClient(Client):
    """Local loss CE + beta * L_NTD (Eq. 10), L_NTD the KL over the not-true classes (Eq. 11);
    with ``lam`` < 1, CE + beta * ((1 - lam) L_KD + lam L_NTD) (App. H).

    The teacher is this round's global model, frozen, in eval mode, queried under no_grad
    on the same (augmented) batch as the student.
    """

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.teacher = Teacher(setup)

    def round_start(self, server_round, down):
        self.teacher.load(down.weights, down.ints)

    def loss(self, ctx, batch, out):
        teacher, lam, tau = self.teacher.batch_logits(ctx, batch), self.options.lam, self.options.tau
        distill = ntd_loss(out.logits, teacher, batch.y, tau)
        if lam < 1:
            distill = (1 - lam) * kd_loss(out.logits, teacher, tau) + lam * distill
        return super().loss(ctx, batch, out) + self.options.beta * distill


@ALGORITHMS.register("fedntd")
class FedNTD(Algorithm):
    """FedNTD (Lee et al., NeurIPS 2022; paper 003): CE + beta * not-true distillation from the round's
    global model (Eqs. 10-11).

    Defaults tau = 1, beta = 1 are the official configuration's (``config/fedntd.json``). The KL
    carries tau^2 as every temperature-scaled KL in :mod:`mpifed.local.losses` does (the official code
    has had versions with and without it; no effect at the default tau = 1). No extra communication.

    ``lam`` is App. H's move from knowledge distillation to not-true distillation (Table 12):
    the distillation term is (1 - lam) L_KD + lam L_NTD, L_KD the same KL over all classes
    (the true class included), so lam = 0 distils the global model's whole softmax and lam = 1
    (default) is FedNTD. Eqs. 17-18, which define the paper's L_lambda, are lost in our copy of
    the paper; what survives says only that it "moves from L_KD to L_NTD as lambda increases, and
    collapses to L_KD at lambda = 0 and L_NTD at lambda = 1", and the official code has no such
    loss. The convex combination is the form that says exactly that and nothing more.
    """

    extra_forwards = 1   # the global model's forward (the virtual clock's compute)
    asynchronous = "it distils from the model the client starts from"

    @dataclass
    class Options:
        tau: float = opt(1.0, "temperature of the not-true softmax", min=0, exclusive_min=True)
        beta: float = opt(1.0, "weight of the not-true distillation loss", min=0)
        lam: float = opt(1.0, "App. H's lambda: distil (1 - lam) KD + lam NTD (1: FedNTD; 0: KD from the global model, "
                              "true class included)", min=0, max=1)

    Client = FedNTDClient
    switches = Switches(on=("algorithm.beta=1",), off=("algorithm.beta=0",))
