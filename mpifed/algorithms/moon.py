"""MOON (Li, He, Song, CVPR 2021): model-contrastive federated learning."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm, Client
from mpifed.algorithms.teacher import Teacher
from mpifed.losses import moon_loss
from mpifed.models.base import ProjectionHead
from mpifed.options import opt
from mpifed.registry import ALGORITHMS


class MoonClient(Client):
    """CE + mu * l_con, l_con contrasting the local representation with the round's global model
    (positive) and the client's own previous local model (negative)."""

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.global_model = Teacher(setup)
        self.previous = Teacher(setup)
        self.has_previous = False

    def round_start(self, rnd, down):
        self.global_model.load(down.weights, down.ints)

    def init_state(self, ctx):
        return {"previous": torch.zeros(self.setup.num_floats, device=self.setup.device),
                "trained": torch.zeros(1, device=self.setup.device)}

    def train(self, ctx):
        self.has_previous = bool(ctx.state["trained"].item())
        if self.has_previous:
            self.previous.load(ctx.state["previous"])
        super().train(ctx)
        ctx.state = {"previous": ctx.flat.floats.detach().clone(), "trained": torch.ones(1, device=self.setup.device)}

    def loss(self, ctx, batch, out):
        ce = F.cross_entropy(out.logits, batch.y)
        if not self.has_previous:
            return ce
        contrast = moon_loss(out.features, self.global_model.batch_features(ctx, batch),
                             self.previous.batch_features(ctx, batch), self.options.tau)
        return ce + self.options.mu * contrast


@ALGORITHMS.register("moon")
class Moon(Algorithm):
    """MOON (Li, He, Song, CVPR 2021): CE + mu * a model-contrastive loss against the global model and
    the client's previous local model.

    Sec. 3.2, Eq. 3: local loss CE + mu * l_con, where for each sample
    l_con = -log( e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} + e^{sim(z, z_prev)/tau}) ),
    sim the cosine, z the local model's representation, z_glob the round's global model's and
    z_prev the client's previous local model's (both frozen, eval mode, no gradient).

    The representation is the output of MOON's projection head (SimCLR's two-layer MLP,
    output ``projection_dim`` = 256, with the classifier on top of it; :class:`ProjectionHead`);
    ``projection_dim: 0`` contrasts the network's own features with its own classifier, as
    FedCSD ("we discard the projection layer") and FedNTD's code do.

    The previous model is the client's own model after the last round it trained in, kept in
    its client state (one model per client: in worker memory within
    ``resources.client_state_mb``, moved between workers as clients are). A client's first
    round has no previous model and no contrastive term, as in MOON's and FedGKD's code (in
    round 1 it would be the global model itself, whose term has no gradient); FedNTD's code
    instead starts every client's previous model at the initial global model. Defaults:
    tau = 0.5 (all three papers), mu = 1 (MOON's code; the papers' tables set it per data
    set: see configs/papers). The server is FedAvg's.
    """

    @dataclass
    class Options:
        mu: float = opt(1.0, "weight of the model-contrastive loss", min=0)
        tau: float = opt(0.5, "temperature of the contrastive softmax", min=0, exclusive_min=True)
        projection_dim: int = opt(256, "output size of MOON's projection head (0: no head, the network's own features)", min=0)

    Client = MoonClient

    def messages(self):
        return super().messages().extend(client_state={"previous": (self.setup.num_floats,), "trained": (1,)})

    @classmethod
    def extend_model(cls, net, options):
        return ProjectionHead(net, options.projection_dim) if options.projection_dim else net
