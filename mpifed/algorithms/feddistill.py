"""FedDistill+ (FedDistill of Seo et al., 2020, with model averaging, as FedGen's paper names it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm, Buffer, Client, Inputs, Server, Switches, per_client
from mpifed.local.losses import class_sums
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


def class_logit_distillation(logits: torch.Tensor, targets: torch.Tensor, global_logits: torch.Tensor,
                             known: torch.Tensor, tau: float) -> torch.Tensor:
    """(1/B) sum_i [known(y_i)] tau^2 KL(softmax(G[y_i]/tau) || softmax(z_i/tau)): each sample's
    logits z_i against the global mean logit vector G[y_i] of its class (samples of classes with
    no global logits yet contribute 0)."""
    teacher = global_logits[targets].detach()
    log_p = F.log_softmax(logits / tau, dim=1)
    log_q = F.log_softmax(teacher / tau, dim=1)
    per_sample = tau * tau * (log_q.exp() * (log_q - log_p)).sum(dim=1)
    return (per_sample * known[targets].to(per_sample.dtype)).sum() / len(targets)


def class_mean_logits(rows: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per class y, the clients' mean logits weighted by their counts of y:
    sum_k n_k,y L_k[y] / sum_k n_k,y (``rows``: K x C x C, ``counts``: K x C); and whether y was seen."""
    total = counts.sum(dim=0)
    mean = (counts.unsqueeze(2) * rows).sum(dim=0) / total.clamp(min=1).unsqueeze(1)
    return mean, total > 0


class FedDistillClient(Client):
    """CE + weight * the class-logit distillation; records the mean logits of each class over its
    training passes and sends them (and the counts) as its rows."""

    def round_start(self, server_round, down):
        self.inputs.global_logits = down.logits
        self.inputs.known = down.known > 0
        self.inputs.active = bool(self.inputs.known.any())

    def on_batch(self, ctx, batch, out):
        sums, counts = class_sums(out.logits.float(), batch.y, self.setup.num_classes)
        self.inputs.sums += sums
        self.inputs.counts += counts

    def loss(self, ctx, batch, out):
        ce = F.cross_entropy(out.logits, batch.y)
        if not self.inputs.active:
            return ce
        return ce + self.options.weight * class_logit_distillation(out.logits, batch.y, self.inputs.global_logits,
                                                                   self.inputs.known, self.options.tau)

    def uplink(self, ctx):
        means = self.inputs.sums / self.inputs.counts.clamp(min=1).unsqueeze(1)
        return {**super().uplink(ctx), "class_logits": means, "class_counts": self.inputs.counts}


class FedDistillServer(Server):
    """FedAvg's average of the models; the global logits of each class seen this round become the
    count-weighted mean of the clients' rows (other classes keep theirs)."""

    state = ("logits", "known")

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        c = setup.num_classes
        self.logits = torch.zeros(c, c, device=setup.device)
        self.known = torch.zeros(c, device=setup.device)

    def downlink(self, server_round, weights):
        return {"logits": self.logits, "known": self.known}

    def aggregate(self, server_round, weights, replies):
        mean, seen = class_mean_logits(replies.rows.class_logits.double(), replies.rows.class_counts.double())
        self.logits = torch.where(seen.unsqueeze(1), mean.float(), self.logits)
        self.known = torch.where(seen, 1.0, self.known)
        return super().aggregate(server_round, weights, replies)

    def log(self) -> dict[str, Any]:
        return {"classes_with_global_logits": int(self.known.sum())}


@ALGORITHMS.register("feddistill_plus")
class FedDistillPlus(Algorithm):
    """FedDistill+ (as in FedGen's paper, Zhu, Hong, Zhou, ICML 2021): clients distil towards the global
    per-class mean logits, and the models are averaged as in FedAvg (the "+").

    FedGKD's baseline (paper 004, Sec. 5.1): FedDistill "shares the logits of user-data and adds
    the distillation regularization term for clients. We further develop it with model parameters
    sharing and name it FedDistill+".

    Each client records, over the forward passes of its local training (every epoch, as the
    official codes of FedGen and FedGKD track them, so no extra pass), the sum and count of its
    logit vectors per class y, and uplinks as per-client rows its per-class means L_k[y] (C x C)
    and counts n_k,y (C). The server's global logits of class y are
    G[y] = sum_k n_k,y L_k[y] / sum_k n_k,y over the round's clients that saw y, i.e. the mean
    logit vector of the round's training passes on class y; a class no client of the round saw
    keeps its previous global logits (server state, checkpointed). The local loss is

        CE(z, y) + weight * tau^2 * KL(softmax(G[y] / tau) || softmax(z / tau)),

    batch mean, as FedGKD's code (forward KL, "batchmean", tau^2 factor) and FedGen's code
    (KLDivLoss with softmax(G[y]) as target, tau = 1) write it. Round 1 has no global logits and
    no distillation term; a sample whose class has none yet contributes 0 to it.

    Defaults: weight 1 and tau 1 (FedGen's code: ``reg_alpha = 1``, no temperature). FedGKD
    sets the weight to 0.1 for every data set, with its code's default temperature 1 (the
    value in the paper's text is lost in our copy): configs/papers/fedgkd/methods. Choices where
    the codes differ: FedGen's clients keep accumulating over all their rounds and its server
    averages the round's per-class means uniformly (a client without class y contributing a zero
    row); FedGKD's server averages every client's latest cumulative means except the receiving
    client's own. Here the average is over the round, weighted by the per-class counts, so a
    client that never saw class y does not pull G[y] towards zero.
    """

    @dataclass
    class Options:
        weight: float = opt(1.0, "weight of the distillation term (FedGen's code: 1; FedGKD's tables: 0.1)", min=0)
        tau: float = opt(1.0, "distillation temperature", min=0, exclusive_min=True)

    Client = FedDistillClient
    Server = FedDistillServer
    switches = Switches(on=("algorithm.weight=1",), off=("algorithm.weight=0",))

    def messages(self):
        c = self.setup.num_classes
        return super().messages().extend(down={"logits": (c, c), "known": (c,)},
                                         up={"class_logits": per_client(c, c), "class_counts": per_client(c)})

    def inputs(self):
        c = self.setup.num_classes
        return Inputs(round={"global_logits": (c, c), "known": Buffer((c,), torch.bool), "active": bool},
                      client={"sums": (c, c), "counts": (c,)})
