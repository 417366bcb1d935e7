"""FedCSD (Yan et al.; papers 000/001): class-prototype similarity distillation with an adaptive mask."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from mpifed.algorithms.base import Algorithm, Client, Inputs, Server, Switches
from mpifed.algorithms.teacher import Teacher
from mpifed.local.losses import class_sums, csd_loss
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


class FedCSDServer(Server):
    """The moving-average teacher (Eq. 12): w_xi^{t+1} = alpha w_xi^t + (1 - alpha) w_G^{t+1},
    w_xi^0 = w_G^0, over parameters and float buffers, sent with the global model."""

    state = ("ema",)

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        self.ema: torch.Tensor | None = None       # from start()

    def start(self, weights):
        self.ema = weights.clone()

    def downlink(self, server_round, weights):
        return {"teacher": self.ema}

    def aggregate(self, server_round, weights, replies):
        new = super().aggregate(server_round, weights, replies)
        a = self.options.alpha
        self.ema = a * self.ema + (1 - a) * new
        return new


class FedCSDClient(Client):
    """Class prototypes (global: from the round's clients; or the client's own), then
    CE + mu * L_CSD per batch ((1 - mu) CE + mu L_CSD with ``weighting: official``)."""

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.teacher = Teacher(setup, options.teacher_train_mode)

    def round_start(self, server_round, down):
        self.teacher.load(down.teacher, down.ints)

    def client_prototypes(self, data, transform) -> tuple[torch.Tensor, torch.Tensor]:
        """This client's mean teacher logits per class it holds (Eq. 6; zero rows elsewhere), and
        which classes it holds."""
        c = self.setup.num_classes
        logits = self.teacher.client_logits(data, transform).double()   # reused by the loss when cached
        sums, counts = class_sums(logits, data.labels, c)
        held = counts > 0
        return torch.where(held[:, None], sums / counts.clamp(min=1)[:, None], torch.zeros_like(sums)), held.double()

    def statistics(self, data, transform):
        means, held = self.client_prototypes(data, transform)
        return {"prototype_sum": means, "holders": held}

    def use_statistics(self, totals):
        holders = totals.holders.clamp(min=1)[:, None]
        self.inputs.prototypes = (totals.prototype_sum / holders).float()

    def begin_client(self, ctx):
        if self.options.prototypes == "local":
            self.inputs.prototypes = self.client_prototypes(ctx.data, ctx.transform)[0].float()

    def loss(self, ctx, batch, out):
        o = self.options
        distill = csd_loss(out.logits, self.teacher.batch_logits(ctx, batch), batch.y, self.inputs.prototypes, o.tau,
                           o.similarity_grad, refine=o.refine, mask=o.mask, mask_from_refined=o.mask_from_refined)
        ce = super().loss(ctx, batch, out)
        return ((1 - o.mu) * ce if o.weighting == "official" else ce) + o.mu * distill


@ALGORITHMS.register("fedcsd")
class FedCSD(Algorithm):
    """FedCSD (Yan et al.; papers 000/001): CE + mu * class-prototype similarity distillation from a
    moving-average teacher, with an adaptive mask.

    Alg. 1: local loss CE + mu * L_CSD (Eq. 15), with a moving-average teacher and global prototypes.

    * Teacher (Eq. 12): see :class:`FedCSDServer`.
    * Prototypes (Eqs. 6-7): before local training each sampled client computes, with the
      teacher, the mean logit vector of each class it holds (its unaugmented data, eval
      mode). The per-class means and the number of clients holding each class are summed
      over all workers by an MPI all-reduce; the global prototype of class c is the mean of
      the client means over the clients holding c (Eq. 7 divides the sum by K instead: each
      row only scales, which the cosine of Eq. 8 ignores). A class no client holds has a
      zero row.
    * Loss: :func:`mpifed.local.losses.csd_loss` (similarity score, refined teacher, adaptive mask).
      Paper defaults mu = 0.001, tau = 10 (label skew); Office-Caltech uses mu = 0.5, tau = 4.

    The defaults follow the paper; each choice of the official code (IAMJackYan/FedCSD,
    ``train_ours.py``) is an option:

    * ``similarity_grad``: the gradient flows through the similarity score into the student
      (the paper calls the teacher frozen; default off);
    * ``teacher_train_mode``: the teacher's BatchNorm uses batch statistics (default eval mode);
    * ``mask_from_refined``: the mask (Eq. 13) from the refined teacher logits, as the code
      computes it after the refinement (the paper: from the teacher's own logits);
    * ``weighting: official``: (1 - mu) CE + mu L_CSD, the code's form, with its defaults
      T = 4, mu = 0.5 set through ``tau`` and ``mu`` (the paper's Eq. 15: CE + mu L_CSD);
    * ``prototypes: local``: each client uses the prototypes of its own data, as the code does
      (no all-reduce); the paper's Eq. 7 averages them over the clients (``global``).
    * RandomRotation(15), which the code adds to CIFAR-100's augmentation, is
      ``data.augment.rotation: 15``.

    Switches for the paper's ablations (Table III): ``refine: false`` distils the raw teacher
    logits (no Eqs. 8-10), ``mask: none`` keeps every sample, and ``alpha: 0`` makes the
    teacher the last round's global model (no TMA); Table IV's forcible mask (Eq. 16: only
    samples the teacher classifies correctly) is ``mask: forcible``.
    """

    @dataclass
    class Options:
        mu: float = opt(0.001, "weight of the CSD loss", min=0)
        tau: float = opt(10.0, "distillation temperature", min=0, exclusive_min=True)
        alpha: float = opt(0.9, "teacher moving-average momentum", min=0, max=1)
        similarity_grad: bool = opt(False, "let the gradient flow through the similarity score (official code)")
        teacher_train_mode: bool = opt(False, "run the teacher in train mode (official code; BatchNorm uses batch "
                                              "statistics)")
        mask_from_refined: bool = opt(False, "compute the mask from the refined teacher logits (official code; paper: "
                                             "the teacher's own)")
        weighting: Literal["paper", "official"] = opt("paper", "paper: CE + mu L_CSD (Eq. 15); official: (1 - mu) CE + "
                                                               "mu L_CSD")
        prototypes: Literal["global", "local"] = opt("global", "global: the mean over the round's clients (Eq. 7); "
                                                               "local: each client's own (official code)")
        refine: bool = opt(True, "refine the teacher logits with the prototype similarity (Eqs. 8-10); false: Table "
                                 "III's ablation")
        mask: Literal["adaptive", "forcible", "none"] = opt("adaptive", "adaptive (Eq. 13), forcible (Eq. 16: "
                                                                        "correctly classified by the teacher), or none")

    Server = FedCSDServer
    Client = FedCSDClient
    switches = Switches(on=("algorithm.mu=0.5",), off=("algorithm.mu=0",))

    def messages(self):
        c = self.setup.num_classes
        statistics = {"prototype_sum": (c, c), "holders": (c,)} if self.options.prototypes == "global" else {}
        return super().messages().extend(down={"teacher": (self.setup.num_floats,)}, statistics=statistics)

    def inputs(self):
        c = self.setup.num_classes
        prototypes = {"prototypes": (c, c)}     # the round's (global) or the client's own (local)
        return Inputs(round=prototypes) if self.options.prototypes == "global" else Inputs(client=prototypes)
