"""FedCAD (He et al.; paper 002) and its baseline FedLSD: class-wise adaptive self-distillation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mpifed.algorithms.base import Algorithm, Client, Inputs, Server, Switches
from mpifed.algorithms.teacher import Teacher
from mpifed.local.losses import cad_class_weights, cad_loss
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


class FedCADServer(Server):
    """Alg. 1, line 3: the class weights alpha_y (Eq. 6) from the global model on the auxiliary set."""

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        self.weights = torch.zeros(setup.num_classes)

    def class_weights(self, weights: torch.Tensor) -> torch.Tensor:
        tau = self.options.tau if self.options.weights_at_tau else 1.0
        probs = torch.softmax(self.tools.logits(weights).double() / tau, dim=1)
        return cad_class_weights(probs, self.tools.data.labels, self.options.beta, self.options.gamma,
                                 self.setup.num_classes)

    def downlink(self, server_round, weights):
        self.weights = self.class_weights(weights).float().cpu()
        return {"class_weights": self.weights}

    def log(self) -> dict[str, Any]:
        return {"class_weights": [round(float(w), 6) for w in self.weights]}


class FedCADClient(Client):
    """Per sample (1 - alpha_y) CE + alpha_y distillation from the round's global model (Eq. 5)."""

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.teacher = Teacher(setup)

    def round_start(self, server_round, down):
        self.inputs.class_weights = down.class_weights
        self.teacher.load(down.weights, down.ints)

    def loss(self, ctx, batch, out):
        return cad_loss(out.logits, self.teacher.batch_logits(ctx, batch), batch.y, self.inputs.class_weights,
                        self.options.tau, self.options.tau_squared, self.options.scale_ce)


@ALGORITHMS.register("fedcad")
class FedCAD(Algorithm):
    """FedCAD (He et al.; paper 002): self-distillation from the global model with class-wise weights
    alpha_y estimated on the server's auxiliary data.

    Local loss (1 - alpha_y) CE + alpha_y L_d per sample (Eq. 5), L_d Alg. 1's cross-entropy
    -sum_k p^g_k log p_k with the global model's and the local model's softmax at temperature tau.

    Before each round (Alg. 1, line 3) the server runs the global model on its auxiliary
    set (``data.server_holdout_per_class``: 32 per class in the paper, drawn from the
    training data and given to no client) and computes alpha_y with
    :func:`mpifed.local.losses.cad_class_weights` (Eq. 6), then broadcasts the C weights. Eq. 6
    uses the paper's p^g, the global model's softmax at temperature tau (Eq. 2);
    ``weights_at_tau: false`` uses the plain softmax instead (as Lukasik et al., the source
    of Eq. 6, do), which gives larger weights to the classes the global model gets right.
    The teacher is the round's global model. tau = 2 as the paper sets for FedLSD.
    beta = 0.3, gamma = 0.7 from the paper's grid {0, 0.3, 0.5, 0.7}: the paper reports no
    chosen pair; this one keeps every class distilled (beta > 0) and spans the widest range
    the grid allows above it. With beta = gamma = 0 the method is FedAvg; with
    beta = gamma = alpha, FedLSD.

    L_d carries no tau^2 factor, as Alg. 1 writes it (an earlier version of mpifed multiplied a
    KL by tau^2, which at tau = 2 weighs distillation 4x against the cross-entropy);
    ``tau_squared: true`` restores that scaling. The KL and the cross-entropy differ by the
    teacher's entropy, a constant: their gradients are equal.
    """

    needs_server_data = "an auxiliary set to estimate the class-wise weights (paper: 32 samples per class)"

    @dataclass
    class Options:
        beta: float = opt(0.3, "lower bound of the class weights", min=0, max=1)
        gamma: float = opt(0.7, "upper bound of the class weights", min=0, max=1)
        tau: float = opt(2.0, "distillation temperature", min=0, exclusive_min=True)
        weights_at_tau: bool = opt(True, "Eq. 6 from the global model's softmax at temperature tau (the paper's p^g); "
                                         "false: at temperature 1")
        tau_squared: bool = opt(False, "multiply the distillation term by tau^2 (Hinton et al.); the paper's Alg. 1 "
                                       "does not")
        scale_ce: bool = opt(True, "(1 - alpha_y) CE as Eq. 5; false: CE + alpha_y L_d (an ablation: FedAvg's full CE "
                                   "step)")

        def check(self) -> list[str]:
            return [f"beta ({self.beta}) must not exceed gamma ({self.gamma})"] if self.beta > self.gamma else []

    Server = FedCADServer
    Client = FedCADClient
    switches = Switches(on=("data.server_holdout_per_class=3",),
                        off=("algorithm.beta=0", "algorithm.gamma=0", "data.server_holdout_per_class=3"),
                        reference=("algorithm.name=fedavg", "data.server_holdout_per_class=3"))

    def messages(self):
        return super().messages().extend(down={"class_weights": (self.setup.num_classes,)})

    def inputs(self):
        return Inputs(round={"class_weights": (self.setup.num_classes,)})


class FedLSDServer(FedCADServer):
    def class_weights(self, weights: torch.Tensor) -> torch.Tensor:
        return torch.full((self.setup.num_classes,), self.options.alpha)


@ALGORITHMS.register("fedlsd")
class FedLSD(FedCAD):
    """FedLSD (FedCAD's baseline; Lee et al.'s local self-distillation): FedCAD with a constant
    alpha for every class.

    beta = gamma = alpha, so no auxiliary data is needed. alpha = 0.3
    from the grid {0.1, 0.3, 0.5} that FedCAD tunes it over; tau = 2 as FedCAD sets it; the same
    distillation term as FedCAD (Alg. 1's cross-entropy at tau, no tau^2)."""

    needs_server_data = ""

    @dataclass
    class Options:
        alpha: float = opt(0.3, "constant distillation weight", min=0, max=1)
        tau: float = opt(2.0, "distillation temperature", min=0, exclusive_min=True)
        tau_squared: bool = opt(False, "multiply the distillation term by tau^2 (Hinton et al.); FedCAD's Alg. 1 does "
                                       "not")
        scale_ce: bool = opt(True, "(1 - alpha) CE as FedLSD's loss; false: CE + alpha L_d (an ablation: FedAvg's full "
                                   "CE step)")

    Server = FedLSDServer
    switches = Switches(on=("algorithm.alpha=0.3",), off=("algorithm.alpha=0",))
