"""MOON (Li, He, Song, CVPR 2021): model-contrastive federated learning."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm, Client, Inputs, Setup, Switches
from mpifed.algorithms.teacher import Teacher
from mpifed.local.losses import moon_loss
from mpifed.models.base import ProjectionHead
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS


def own_initial_model(setup: Setup, cid: int) -> torch.Tensor:
    """Client ``cid``'s own randomly initialised network (float state): a fresh draw from torch's
    generator seeded by (run.seed, cid), so it is the same on every rank, in every round and on
    resume; the global random state is left as it was."""
    seed = int(np.random.SeedSequence([setup.seed, cid, 0x600D]).generate_state(1, dtype=np.uint64)[0] >> 1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return setup.new_model().floats.detach().clone()


class MoonClient(Client):
    """CE + mu * l_con, l_con contrasting the local representation with the round's global model
    (positive) and the client's own previous local model (negative)."""

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.global_model = Teacher(setup)
        self.previous = Teacher(setup)
        self.initial = self._initial_model() if options.first_negative == "initial" else None

    def round_start(self, server_round, down):
        self.global_model.load(down.weights, down.ints)


    def begin_client(self, ctx):
        trained = bool(ctx.state.trained.item())
        self.inputs.has_previous = trained or (self.options.first_negative != "none" and ctx.server_round > 1)
        if trained:
            self.previous.load(ctx.state.previous)
        elif self.inputs.has_previous:
            self.previous.load(self.stand_in(ctx.cid))

    def end_client(self, ctx):
        return {"previous": ctx.flat.floats.detach().clone(), "trained": torch.ones(1, device=self.setup.device)}

    def stand_in(self, cid: int) -> torch.Tensor:
        """The negative of a client that has not trained yet (``first_negative``)."""
        if self.options.first_negative == "random":
            return own_initial_model(self.setup, cid)
        return self.initial

    def _initial_model(self) -> torch.Tensor:
        """The run's initial global model (float state); the global random state is left as it was."""
        with torch.random.fork_rng(devices=[]):
            return self.setup.initial_model().floats.detach().clone()

    def loss(self, ctx, batch, out):
        ce = F.cross_entropy(out.logits, batch.y)
        if not self.inputs.has_previous:
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
    ``resources.client_state_mb``, moved between workers as clients are). In round 1 no client
    has one and there is no contrastive term (MOON's code: its pool of previous models is empty;
    in FedNTD's code the negative is the global model itself, whose term has no gradient).
    Under partial participation a client can first train in a later round; what it contrasts
    against then is ``first_negative``:

    * ``none`` (default): nothing, no contrastive term in the client's first round, as FedGKD's
      code (``pcode/workers/worker_moon.py``: no buffered model, only the positive logit);
    * ``random``: the client's own randomly initialised network, as MOON's code
      (QinbinLi/MOON ``main.py``: every client's network is drawn at the start and the pool of
      previous models copies all of them after each round, line 538, so a never-trained
      client's entry is its initial network). Here the network is drawn from torch's generator
      seeded by (run.seed, client id): the same on every rank and after a resume, which keeps MPI
      equal to the debug mode and resume exact (MOON's code draws them one after another from
      one stream, so its numbers are not these);
    * ``initial``: the initial global model, as FedNTD's code (``algorithms/moon/Server.py``,
      ``_init_prev_locals``: every client's previous model starts as the initial global
      model).

    Defaults: tau = 0.5 (all three papers), mu = 1 (MOON's code; the papers' tables set it per
    data set: see configs/papers). The server is FedAvg's.
    """

    extra_forwards = 2   # the global and the previous local model's forwards (the virtual clock's compute)

    @dataclass
    class Options:
        mu: float = opt(1.0, "weight of the model-contrastive loss", min=0)
        tau: float = opt(0.5, "temperature of the contrastive softmax", min=0, exclusive_min=True)
        projection_dim: int = opt(256, "output size of MOON's projection head (0: no head, the network's own "
                                       "features)", min=0)
        first_negative: Literal["none", "random", "initial"] = opt(
            "none", "the negative of a client that has not trained yet (rounds 2+): none (no contrastive term; "
                    "FedGKD's code), its own random initial network (MOON's code) or the initial global model "
                    "(FedNTD's code)")

    Client = MoonClient
    switches = Switches(on=("algorithm.mu=2", "algorithm.projection_dim=16", "train.participation=0.6"),
                        off=("algorithm.mu=0", "algorithm.projection_dim=0", "train.participation=0.6"),
                        reference=("algorithm.name=fedavg", "train.participation=0.6"))

    def messages(self):
        return super().messages().extend(client_state={"previous": (self.setup.num_floats,), "trained": (1,)})

    def inputs(self):
        return Inputs(client={"has_previous": bool})     # contrast with the previous model (loaded in place)

    @classmethod
    def extend_model(cls, net, options):
        return ProjectionHead(net, options.projection_dim) if options.projection_dim else net
