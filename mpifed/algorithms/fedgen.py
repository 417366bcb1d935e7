"""FedGen (Zhu, Hong, Zhou, ICML 2021): data-free knowledge distillation through a server-trained
feature generator."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from mpifed.algorithms.base import Algorithm, Client, Inputs, Server, Setup, Switches, per_client
from mpifed.local.flat import FlatModel
from mpifed.local.losses import one_hot
from mpifed.plugin.options import opt
from mpifed.plugin.registry import ALGORITHMS

WEIGHT_FLOOR = 1e-4          # the decayed client weights never fall below this (official code)
GENERATOR_WEIGHT_DECAY = 1e-2
GENERATOR_LR_DECAY = 0.98    # per round (ExponentialLR stepped after each round's generator training)
DIVERSITY_WEIGHT = 1.0       # eta


class FeatureGenerator(nn.Module):
    """G(eps, y): [eps, one_hot(y)] -> Linear -> BatchNorm1d -> ReLU -> Linear -> a feature vector
    (FedGen's generator with a one-hot label input); eps ~ U[0, 1)^noise_dim is drawn by the caller."""

    def __init__(self, noise_dim: int, hidden_dim: int, num_classes: int, feature_dim: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.noise_dim = noise_dim
        self.net = nn.Sequential(nn.Linear(noise_dim + num_classes, hidden_dim), nn.BatchNorm1d(hidden_dim),
                                 nn.ReLU(), nn.Linear(hidden_dim, feature_dim))

    def forward(self, noise: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([noise, one_hot(labels, self.num_classes, noise.dtype)], dim=1))


def diversity_loss(noise: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """exp(-mean_{i,j} d_1(G_i, G_j) d_2(eps_i, eps_j)) over all pairs of the batch, d_1 the mean
    absolute and d_2 the mean squared difference (the official code's ``DiversityLoss('l1')``)."""
    feature_dist = torch.cdist(features, features, p=1) / features.shape[1]    # 4x faster than broadcasting on CPUs
    noise_dist = (noise.unsqueeze(0) - noise.unsqueeze(1)).pow(2).mean(dim=2)
    return torch.exp(-(feature_dist * noise_dist).mean())


def label_weights(counts: torch.Tensor) -> torch.Tensor:
    """[classes, clients] weights of each client's head for samples of each class, from the clients'
    label counts [clients, classes]: (n_{k,y} + 1) / sum_j (n_{j,y} + 1) (the codes start every
    count at 1)."""
    smoothed = counts + 1
    return (smoothed / smoothed.sum(dim=0, keepdim=True)).T


def ensemble_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                  form: str = "weighted") -> torch.Tensor:
    """The generator's teacher loss over the clients' heads on the generated features (``logits``
    [clients, batch, classes]): ``weighted``, sum_k mean_i w[y_i, k] CE(logits[k, i], y_i); or
    ``official``, sum_k (mean_i w[y_i, k]) (mean_i CE(logits[k, i], y_i)), what both official codes
    compute (a [B, 1] weight times a [B] loss broadcasts to B x B before the mean)."""
    k, b, c = logits.shape
    ce = F.cross_entropy(logits.reshape(k * b, c), labels.repeat(k), reduction="none").view(k, b)
    w = weights[labels].T
    if form == "official":
        return (w.mean(dim=1) * ce.mean(dim=1)).sum()
    return (ce * w).mean(dim=1).sum()


def decayed(weight: float, decay: float, done: int) -> float:
    """A client weight after ``done`` rounds (0 in the first round): max(1e-4, weight * decay^done); 0 stays 0."""
    return max(WEIGHT_FLOOR, weight * decay ** done) if weight > 0 else 0.0


def head_size(setup: Setup) -> int:
    return sum(p.numel() for p in setup.new_model().model.classifier.parameters())


def new_generator(options: Any, setup: Setup) -> FlatModel:
    net = FeatureGenerator(options.noise_dim, options.hidden_dim, setup.num_classes, setup.feature_dim)
    return FlatModel(net.to(setup.device))


class FedGenServer(Server):
    """Averages the models as FedAvg; before that, trains the generator for ``generator_steps``
    Adam steps against the round's client heads (count-weighted teacher loss + diversity loss)."""

    def __init__(self, options, setup, tools) -> None:
        super().__init__(options, setup, tools)
        init_seed, draw_seed = np.random.SeedSequence([setup.seed, 0xFED6E]).generate_state(2)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(init_seed))
            self.generator = new_generator(options, setup)
        self.rng = torch.Generator().manual_seed(int(draw_seed))
        self.optimizer = torch.optim.Adam(self.generator.model.parameters(), lr=options.generator_lr,
                                          weight_decay=GENERATOR_WEIGHT_DECAY)
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, gamma=GENERATOR_LR_DECAY)
        self.head = tools.flat.model.classifier
        self.figures: dict[str, float] = {}

    def downlink(self, server_round, weights):
        return {"generator": self.generator.floats}

    def aggregate(self, server_round, weights, replies):
        self.train_generator(replies.rows.head.to(self.setup.device), replies.rows.label_counts.to(self.setup.device))
        return super().aggregate(server_round, weights, replies)

    def head_params(self, rows: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Each client's head parameters, by name, as views of its uplink row."""
        heads = []
        for row in rows:
            params, offset = {}, 0
            for name, p in self.head.named_parameters():
                params[name] = row[offset: offset + p.numel()].view_as(p)
                offset += p.numel()
            heads.append(params)
        return heads

    def train_generator(self, head_rows: torch.Tensor, counts: torch.Tensor) -> None:
        heads = self.head_params(head_rows)
        weights = label_weights(counts)
        qualified = torch.nonzero(counts.sum(dim=0) > 0).flatten().cpu()
        size, device = self.setup.train.batch_size, self.setup.device
        gen = self.generator.model.train()
        teacher_sum = diversity_sum = 0.0
        for _ in range(self.options.generator_steps):
            y = qualified[torch.randint(len(qualified), (size,), generator=self.rng)].to(device)
            noise = torch.rand(size, self.options.noise_dim, generator=self.rng).to(device)
            z = gen(noise, y)
            logits = torch.stack([functional_call(self.head, params, (z,)) for params in heads])
            teacher = ensemble_loss(logits, y, weights, self.options.teacher_loss)
            diversity = diversity_loss(noise, z)
            self.optimizer.zero_grad()
            (teacher + DIVERSITY_WEIGHT * diversity).backward()
            self.optimizer.step()
            teacher_sum = teacher_sum + teacher.detach()
            diversity_sum = diversity_sum + diversity.detach()
        self.scheduler.step()
        steps = max(self.options.generator_steps, 1)
        self.figures = {"generator_teacher_loss": round(float(teacher_sum) / steps, 6),
                        "generator_diversity_loss": round(float(diversity_sum) / steps, 6)}

    def log(self) -> dict[str, Any]:
        return self.figures

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.floats.cpu().clone(), "ints": self.generator.ints.cpu().clone(),
                "optimizer": copy.deepcopy(self.optimizer.state_dict()), "scheduler": self.scheduler.state_dict(),
                "rng": self.rng.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.load(state["generator"].to(self.setup.device), state["ints"].to(self.setup.device))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.rng.set_state(state["rng"])


class FedGenClient(Client):
    """CE + alpha_t CE(head(G(eps, y_hat)), y_hat) + beta_t KL(softmax(head(G(eps', y))) || softmax(logits));
    sends its head and the label counts of the batches it trained on."""

    def __init__(self, options, setup) -> None:
        super().__init__(options, setup)
        self.generator = new_generator(options, setup)
        self.generator.model.eval()

    def round_start(self, server_round, down):
        self.generator.load(down.generator)
        regularise = server_round > 1         # round 1's generator is untrained
        done = server_round - 1
        self.inputs.alpha = decayed(self.options.alpha, self.options.decay, done) if regularise else 0.0
        self.inputs.beta = decayed(self.options.beta, self.options.decay, done) if regularise else 0.0

    def on_batch(self, ctx, batch, out):
        self.inputs.label_counts += one_hot(batch.y, self.setup.num_classes, torch.float32).sum(dim=0)

    @torch.no_grad()
    def generate(self, labels: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        noise = torch.rand(len(labels), self.options.noise_dim, generator=rng, device=rng.device).to(self.setup.device)
        return self.generator.model(noise, labels)

    def loss(self, ctx, batch, out):
        loss = F.cross_entropy(out.logits, batch.y)
        if self.inputs.alpha > 0:
            sampled = torch.randint(self.setup.num_classes, (self.setup.train.batch_size,), generator=ctx.generator,
                                    device=ctx.generator.device).to(self.setup.device)
            generated = ctx.model.head(self.generate(sampled, ctx.generator))
            loss = loss + self.inputs.alpha * F.cross_entropy(generated, sampled)
        if self.inputs.beta > 0:
            target = F.softmax(ctx.model.head(self.generate(batch.y, ctx.generator)), dim=1).detach()
            loss = loss + self.inputs.beta * F.kl_div(F.log_softmax(out.logits, dim=1), target, reduction="batchmean")
        return loss

    def uplink(self, ctx):
        head = torch.cat([p.detach().reshape(-1) for p in ctx.model.classifier.parameters()])
        return {**super().uplink(ctx), "head": head, "label_counts": self.inputs.label_counts}


@ALGORITHMS.register("fedgen")
class FedGen(Algorithm):
    """FedGen (Zhu, Hong, Zhou, ICML 2021): a server-side generator of features, trained against the
    clients' classifiers, regularises local training; models averaged as in FedAvg.

    Equation numbers are those of the arXiv version (2105.10056); the paper's text is not among
    ../shared/papers, so the details below follow the official code.

    Server (Alg. 1; the generator's objective, Eq. 4): after local training each client sends
    its head (the classifier's parameters) and its label counts, one row per client. The server
    trains G(eps, y) -> feature space (the classifier's input) for ``generator_steps`` Adam
    steps: each step draws a batch of labels uniformly from those some round client holds
    and eps ~ U[0, 1)^noise_dim, and minimises a count-weighted teacher loss over the clients'
    cross-entropies CE_{k,i} = CE(head_k(G(eps_i, y_i)), y_i), with w_{y,k} = (n_{k,y} + 1) /
    sum_j (n_{j,y} + 1), plus the diversity loss exp(-mean_{i,j} |G_i - G_j|_1 |eps_i - eps_j|_2^2)
    (dimension-averaged distances) with weight 1. Then the models are averaged as FedAvg does,
    and the generator goes down with the next round's global model.

    The teacher loss (``teacher_loss``; Eq. 4 writes the loss of the clients' averaged logits,
    which neither official code computes):

    * ``weighted`` (default): sum_k mean_i w_{y_i,k} CE_{k,i}, each sample's cross-entropy
      weighted by its own label's client weight (the per-sample reading of the codes' weights);
    * ``official``: sum_k (mean_i w_{y_i,k}) (mean_i CE_{k,i}), what both official codes compute:
      in zhuangdizhu/FedGen (``FLAlgorithms/servers/serverpFedGen.py``, lines 147 and 151-152) and
      CGCL-codes/FedGKD (``pcode/masters/master_fedgen.py``, lines 101 and 106, a copy) the [B, 1]
      weight times the [B] unreduced NLL broadcasts to B x B, whose mean is the product of the
      two means, so a sample's weight no longer follows its own label. FedGKD's tables ran
      FedGen this way (configs/papers/fedgkd/methods/fedgen.yaml).

    Client (the regularised local objective, Eq. 5, and the official code's latent term): from
    round 2 on (round 1's generator is untrained), each batch adds
    alpha_t * CE(head(G(eps, y_hat)), y_hat) on ``train.batch_size`` generated features with labels
    y_hat drawn uniformly from all classes (FedGen's ``available_labels``), and
    beta_t * KL(softmax(head(G(eps', y))) || softmax(logits)) on the batch's own labels y (the
    official code's ``generative_beta`` term; the target is detached). The generator is frozen
    on clients (eval mode: BatchNorm running statistics), so the first term trains only the head.
    Both weights decay per round: w_t = max(1e-4, w * decay^t), t the 0-based round.

    Choices, where the paper is silent, from the official code (github.com/zhuangdizhu/FedGen:
    ``serverpFedGen.py``, ``userpFedGen.py``, ``generator.py``, ``model_config.py``) and FedGKD's
    reimplementation used for its Table 3 (github.com/CGCL-codes/FedGKD, ``master_fedgen.py``,
    ``worker_fedgen.py``, ``generator.py``): one hidden layer of ``hidden_dim`` = 512 and
    ``noise_dim`` = 64 (both codes' CIFAR generator); ``generator_steps`` = 50 per round (10 x 5
    teacher iterations) with batches of ``train.batch_size`` (both codes pass the training batch
    size); Adam lr 1e-4 (FedGKD's code, FedGen's for EMNIST; 3e-4 for its MNIST), betas
    (0.9, 0.999), weight decay 1e-2, learning rate x 0.98 after every round; no adversarial
    student term (ensemble_beta = 0 in every configuration); the label counts are those of the
    batches the client trained on this round (as both codes count them), plus one in
    the weights; the generated batch equals the training batch (gen_ratio 1, FedGen's default
    sizes); the decay 0.98 from round 1 (FedGen's ``exp_lr_scheduler``; FedGKD's code counts
    rounds from 1).

    Defaults alpha = beta = 1. FedGen's code uses alpha = 10 and beta = 10 (MNIST, CelebA) or 1
    (EMNIST), with plain SGD at lr 0.01. Under SGD with momentum 0.9, the optimiser of every
    paper setting here, alpha = beta = 10 diverge: on the methods benchmark (lr 0.01) the
    head's weight norm grows from 6 to 200 within ten steps of round 2 and the loss turns NaN
    (each generated feature has norm ~11, so the generated-feature term alone takes steps far
    beyond the head's stable size). FedGKD, which runs FedGen with momentum 0.9, tunes alpha over
    {0.1, 1, 10} and never picks 10; its reimplementation drops the beta term (``beta: 0``) and
    sets alpha per data set (0.1 CIFAR-10, 1 CIFAR-100, 0.1 Tiny-ImageNet, whose generator is
    2048 wide with 2048 noise dimensions; see configs/papers/fedgkd). With plain SGD
    (``train.momentum: 0``), FedGen's own values are ``alpha: 10, beta: 10``. FedGen's
    ``early_stop`` (no regulariser after 20 local epochs) is not implemented (no table runs
    more than 20). The server's draws come from its own generator seeded by ``run.seed``, so MPI
    and debug runs agree.
    """

    @dataclass
    class Options:
        alpha: float = opt(1.0, "weight of the generated-feature cross-entropy (FedGen's generative_alpha; its code: "
                                "10 with plain SGD, which diverges with momentum)", min=0)
        beta: float = opt(1.0, "weight of the KL term towards the generator's features of the batch's labels "
                               "(FedGen's generative_beta; its code: 1-10 with plain SGD; FedGKD's code: 0)", min=0)
        decay: float = opt(0.98, "per-round decay of alpha and beta", min=0, max=1)
        noise_dim: int = opt(64, "dimension of the generator's uniform noise", min=1)
        hidden_dim: int = opt(512, "width of the generator's hidden layer", min=1)
        generator_steps: int = opt(50, "server Adam steps on the generator per round", min=0)
        generator_lr: float = opt(1e-4, "the generator's Adam learning rate", min=0, exclusive_min=True)
        teacher_loss: Literal["weighted", "official"] = opt(
            "weighted", "generator's teacher loss per client: mean_i w_i CE_i (weighted) or mean_i w_i * mean_i CE_i "
                        "(official: both official codes' broadcasting)")

    Server = FedGenServer
    Client = FedGenClient
    switches = Switches(on=("algorithm.alpha=1", "algorithm.beta=1"), off=("algorithm.alpha=0", "algorithm.beta=0"))

    def messages(self):
        s = self.setup
        with torch.device("meta"):
            generator = FeatureGenerator(self.options.noise_dim, self.options.hidden_dim, s.num_classes, s.feature_dim)
        floats = sum(t.numel() for t in [*generator.parameters(), *generator.buffers()] if t.is_floating_point())
        return super().messages().extend(down={"generator": (floats,)},
                                         up={"head": per_client(head_size(s)),
                                             "label_counts": per_client(s.num_classes)})

    def inputs(self):
        # this round's alpha_t and beta_t (0 in round 1: its generator is untrained); a client's label counts
        return Inputs(round={"alpha": float, "beta": float}, client={"label_counts": (self.setup.num_classes,)})
