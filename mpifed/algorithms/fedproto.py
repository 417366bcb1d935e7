"""FedProto (Tan et al., AAAI 2022): a regulariser towards global per-class feature prototypes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm, Buffer, Client, Inputs, Server, Switches, summed
from mpifed.local.losses import class_sums
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


def prototype_loss(features: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor,
                   known: torch.Tensor) -> torch.Tensor:
    """FedProto's regulariser on a batch: the mean over samples and feature dimensions of
    (f(x_i) - C_{y_i})^2, C the global prototypes [classes, d]; a sample whose class has no
    global prototype (``known[y] == 0``) contributes 0 but still counts in the mean (the official
    code's ``MSELoss`` with the sample's own features as target)."""
    mask = known[labels].to(features.dtype).unsqueeze(1)
    return ((features - prototypes[labels].to(features.dtype)) * mask).pow(2).mean()


def global_prototypes(feature_sums: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The global prototypes (sum of the round's features of class c / their number) and which
    classes have one (a class no client saw gets a zero row and ``known = 0``)."""
    known = counts > 0
    protos = feature_sums / counts.clamp(min=1).unsqueeze(1)
    return protos.to(torch.float32), known.to(torch.float32)


class FedProtoClient(Client):
    """CE + lambda * the prototype regulariser; sends the per-class sums of the features of its
    last local epoch's training batches, and their counts."""

    def round_start(self, server_round, down):
        self.inputs.prototypes, self.inputs.known = down.prototypes, down.known
        self.inputs.active = self.options.lam > 0 and bool(down.known.any())

    def on_batch(self, ctx, batch, out):
        if ctx.epoch == ctx.epochs - 1:
            sums, counts = class_sums(out.features.double(), batch.y, self.setup.num_classes)
            self.inputs.feature_sums += sums
            self.inputs.counts += counts

    def loss(self, ctx, batch, out):
        ce = F.cross_entropy(out.logits, batch.y)
        if not self.inputs.active:
            return ce
        return ce + self.options.lam * prototype_loss(out.features, batch.y, self.inputs.prototypes, self.inputs.known)

    def uplink(self, ctx):
        return {**super().uplink(ctx), "feature_sum": self.inputs.feature_sums, "count": self.inputs.counts}


class FedProtoServer(Server):
    """Averages the models as FedAvg; the global prototypes of the next round are the round's
    per-class feature sums divided by their counts."""

    state = ("prototypes", "known")

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        self.prototypes = torch.zeros(setup.num_classes, setup.feature_dim)
        self.known = torch.zeros(setup.num_classes)

    def downlink(self, server_round, weights):
        return {"prototypes": self.prototypes, "known": self.known}

    def aggregate(self, server_round, weights, replies):
        self.prototypes, self.known = global_prototypes(replies.sums.feature_sum.cpu(), replies.sums.count.cpu())
        return super().aggregate(server_round, weights, replies)

    def log(self) -> dict[str, Any]:
        return {"prototype_classes": int(self.known.sum())}


@ALGORITHMS.register("fedproto")
class FedProto(Algorithm):
    """FedProto (Tan et al., AAAI 2022) as FedCSD runs it: CE + lambda * the squared distance of each
    sample's features to the global prototype of its class; models averaged as in FedAvg and the
    averaged global model evaluated, as FedCSD's tables do (not FedProto's per-client models with
    nearest-prototype inference).

    FedProto's local prototype of class j is the mean of the client's representations f(x)
    (the classifier's input) over its samples of class j; the server's global prototype is
    their average weighted by the clients' sample counts; the local objective adds
    lambda * L_R, the squared distance between each sample's representation and its class's
    global prototype. The paper's text is not among ../shared/papers; as the official code
    (github.com/yuetan031/FedProto, ``update_weights_het``) does: L_R is the mean squared error over
    the batch and the feature dimensions, samples of classes without a global prototype
    contributing 0; the local prototypes are the features computed on the last local epoch's
    training batches (train mode, augmented; under ``train.local_steps``, the last pass, cut short
    where the steps end); a global prototype comes from the last round's
    clients only (a class none of them held has none); the first round has no prototypes and
    trains as FedAvg. Clients send the per-class feature sums and counts, summed over clients,
    so the global prototype is the sample-weighted mean of the paper's aggregation (the official
    code averages the clients' prototypes without weights).

    The prototype layer is the classifier's input (``features``) on every network. The official
    code's ``CNNCifar`` (``lib/models/models.py``) returns instead relu(fc0(x)), the first of its
    two hidden fully connected layers (120 wide, where the classifier's input is fc1's 84), on
    the LeNet shape that mpifed's ``lenet5`` and ``femnist_cnn`` have. That class is never built:
    the official CIFAR-10 runs (``exps/federated_main.py``) use ResNet-18, and its MNIST and FEMNIST
    CNNs (``CNNMnist``, ``CNNFemnist``) return relu(fc1(x)), the input of their classifier fc2, as
    mpifed does. FedCSD, whose tables are the only ones here that run FedProto (a ResNet-50, the
    FEMNIST CNN and AlexNet), does not release its FedProto code. So nothing shows a table made
    with the fc0 layer, and the classifier's input is kept, with no option for it.

    Evaluation: FedProto's paper keeps one model per client (it targets heterogeneous
    architectures) and classifies by the nearest global prototype. FedCSD's tables report one
    global accuracy for every method, so mpifed averages the models as FedAvg does and
    evaluates the averaged global model with its classifier; the personalised, prototype-
    distance inference is not implemented. lambda = 1: FedCSD's best value ("the optimal mu ...
    for FedProto is 1", Sec. V-A), which is also the official code's default ``ld``.
    """

    @dataclass
    class Options:
        lam: float = opt(1.0, "lambda, the weight of the prototype regulariser (FedCSD: 1)", min=0)

    Server = FedProtoServer
    Client = FedProtoClient
    switches = Switches(on=("algorithm.lam=1",), off=("algorithm.lam=0",))

    def messages(self):
        c, d = self.setup.num_classes, self.setup.feature_dim
        return super().messages().extend(down={"prototypes": (c, d), "known": (c,)},
                                         up={"feature_sum": summed(c, d), "count": summed(c)})

    def inputs(self):
        c, d = self.setup.num_classes, self.setup.feature_dim
        return Inputs(round={"prototypes": (c, d), "known": (c,), "active": bool},
                      client={"feature_sums": Buffer((c, d), torch.float64), "counts": Buffer((c,), torch.float64)})
