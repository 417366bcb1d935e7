"""FedCurv (Shoham et al., 2019): an EWC penalty from the other clients' Fisher information."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm, Client, ClientContext, Inputs, Server, Switches, forward, summed
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


def empirical_fisher(ctx: ClientContext, samples: int) -> torch.Tensor:
    """Diagonal empirical Fisher of the local model: the mean over mini-batches of the squared
    gradient of the batch's mean cross-entropy, over the first batches of a fresh shuffled epoch
    until ``samples`` samples are seen (parameters only; the model's buffers are left as they were)."""
    flat, p = ctx.flat, ctx.flat.num_params
    buffers, ints = flat.floats[p:].clone(), flat.ints.clone()
    total = torch.zeros(p, device=flat.floats.device)
    batches = seen = 0
    for batch in ctx.batches():
        flat.zero_grad()
        F.cross_entropy(forward(ctx.model, batch.x).logits, batch.y).backward()
        total += flat.grad.square()
        batches += 1
        seen += len(batch.y)
        if seen >= samples:
            break
    flat.floats[p:].copy_(buffers)
    flat.ints.copy_(ints)
    return total / max(batches, 1)


class FedCurvClient(Client):
    """CE + lambda (P.w^2 - 2 Q.w), with P and Q the server's sums less the client's own last
    contribution; after training, its Fisher diagonal F_k and F_k * w_k replace that contribution.
    The penalty's constant sum_j F_j w_j^2 is left out (it changes no gradient, and would need a
    third sum on the wire), so the logged train_loss can be negative."""

    def round_start(self, server_round, down):
        self.inputs.fisher_sum, self.inputs.fisher_weights_sum = down.fisher, down.fisher_weights

    def begin_client(self, ctx):
        self.inputs.p = self.inputs.fisher_sum - ctx.state.fisher
        self.inputs.q = self.inputs.fisher_weights_sum - ctx.state.fisher_weights
        self.inputs.active = bool(self.inputs.p.any())

    def loss(self, ctx, batch, out):
        ce = super().loss(ctx, batch, out)
        if not self.inputs.active:
            return ce
        views = ctx.flat.param_views
        penalty = sum((p * w * w).sum() - 2 * (q * w).sum()
                      for w, p, q in zip(ctx.model.parameters(), views(self.inputs.p), views(self.inputs.q)))
        return ce + self.options.lam * penalty

    def end_client(self, ctx):
        fisher = empirical_fisher(ctx, self.options.fisher_samples)
        return {"fisher": fisher, "fisher_weights": fisher * ctx.flat.floats[: self.setup.num_params]}

    def uplink(self, ctx):
        old, new = ctx.state, ctx.new_state
        return {**super().uplink(ctx), "delta_fisher": (new.fisher - old.fisher).double(),
                "delta_fisher_weights": (new.fisher_weights - old.fisher_weights).double()}


class FedCurvServer(Server):
    """FedAvg's average; keeps U = sum_j F_j and V = sum_j F_j w_j over every client's latest
    report (by adding the round's changes) and sends them down."""

    state = ("fisher", "fisher_weights")

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        zeros = torch.zeros(setup.num_params, dtype=torch.float64, device=setup.device)
        self.fisher, self.fisher_weights = zeros, zeros.clone()

    def downlink(self, server_round, weights):
        return {"fisher": self.fisher.float(), "fisher_weights": self.fisher_weights.float()}

    def aggregate(self, server_round, weights, replies):
        self.fisher = self.fisher + replies.sums.delta_fisher
        self.fisher_weights = self.fisher_weights + replies.sums.delta_fisher_weights
        return super().aggregate(server_round, weights, replies)


@ALGORITHMS.register("fedcurv")
class FedCurv(Algorithm):
    """FedCurv (Shoham et al., 2019, "Overcoming forgetting in federated learning on non-IID data"):
    an EWC penalty keeps each local model near where the other clients' data want it.

    Client k minimises the paper's local objective (arXiv:1910.07796; not among ../shared/papers,
    so no equation number is cited here)
    L_k(w) + lambda sum_{j != k} sum_i F_j,i (w_i - w_j,i)^2, with F_j the diagonal Fisher
    information of client j's last local model w_j. Expanding the square,

        sum_{j != k} F_j (w - w_j)^2 = P w^2 - 2 Q w + sum_{j != k} F_j w_j^2,
        P = U - F_k,  Q = V - F_k w_k,  U = sum_j F_j,  V = sum_j F_j w_j

    (elementwise), and the last sum does not depend on w: only U and V travel down, and the
    client removes its own last contribution (F_k, F_k w_k), kept in its client state. The
    logged training loss omits that constant. The server keeps U and V over every client's
    latest report (checkpointed): each client uplinks the change of its contribution, summed
    over the round, so clients that are not sampled keep theirs, as in FedNTD's code. There is
    no factor 1/2 before lambda (the paper's and FedNTD's code's form).

    Fisher: the empirical Fisher diagonal, estimated after local training as the mean over
    mini-batches of the squared gradient of the batch's mean log-likelihood (cross-entropy) on
    a fresh shuffled epoch of the client's own training data, the first ceil(fisher_samples / B)
    batches, in training mode (augmentation, dropout; buffers such as BatchNorm statistics are
    restored afterwards). Batch-level, as FedNTD's code computes it: its lambda (1.0, with
    ``size`` 500 samples) was tuned for this scale, and it costs one backward pass per batch
    instead of one per sample; a sample-level estimate would be about B times larger in the
    gradient-noise part. (FedNTD's code stops once more than ``size`` samples are seen, one batch
    later than here; and its server subtracts each client's own contribution from the round's
    shared sums in place, so later clients of a round lose the earlier ones' too: not reproduced.)

    First round: no client has reported a Fisher yet, so U = V = 0 and there is no penalty;
    a client whose own contribution is all there is gets none either.
    """

    @dataclass
    class Options:
        lam: float = opt(1.0, "weight lambda of the EWC penalty (FedNTD's code: 1.0)", min=0)
        fisher_samples: int = opt(500, "training samples (whole batches) of the Fisher estimate (FedNTD's "
                                       "code: 500)", min=1)

    Client = FedCurvClient
    Server = FedCurvServer
    switches = Switches(on=("algorithm.lam=1",), off=("algorithm.lam=0",))

    def messages(self):
        p = (self.setup.num_params,)
        return super().messages().extend(down={"fisher": p, "fisher_weights": p},
                                         up={"delta_fisher": summed(*p), "delta_fisher_weights": summed(*p)},
                                         client_state={"fisher": p, "fisher_weights": p})

    def inputs(self):
        # the server's sums; P and Q, those sums less this client's own last contribution
        p = (self.setup.num_params,)
        return Inputs(round={"fisher_sum": p, "fisher_weights_sum": p}, client={"p": p, "q": p, "active": bool})
