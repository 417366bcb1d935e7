"""FedProto's and FedGen's formulas against values computed by hand."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import small_setup
from mpifed.algorithms.base import Batch, ClientContext, Downlink, Replies, ServerTools, forward
from mpifed.algorithms.fedgen import decayed, diversity_loss, ensemble_loss, label_weights
from mpifed.algorithms.fedproto import global_prototypes, prototype_loss
from mpifed.settings.config import TrainConfig
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.registry import ALGORITHMS

PLAIN = BatchTransform([0.5], [0.5], 0, False, 0, "cpu")
NO_INTS = torch.zeros(0, dtype=torch.int64)


def algorithm(name, setup, **options):
    cls = ALGORITHMS.get(name)
    return cls(cls.Options(**options), setup)


def client_data(cid, labels, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor(labels)
    return ClientData(cid, torch.randint(0, 255, (len(y), 1, 2, 2), generator=g, dtype=torch.uint8), y)


# ------------------------------------------------------------------- FedProto
def test_prototype_regulariser_by_hand():
    features = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 5.0]])
    labels = torch.tensor([0, 1, 2])
    prototypes = torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]])
    known = torch.tensor([1.0, 1.0, 0.0])            # class 2 has no global prototype: contributes 0
    # (1^2 + 2^2) + (2^2 + 3^2) + 0, averaged over 3 samples x 2 dimensions
    assert prototype_loss(features, labels, prototypes, known).item() == 18.0 / 6


def test_global_prototypes_are_count_weighted_means():
    sums = torch.tensor([[2.0, 4.0], [0.0, 0.0], [3.0, 6.0]], dtype=torch.float64)
    counts = torch.tensor([2.0, 0.0, 3.0], dtype=torch.float64)
    protos, known = global_prototypes(sums, counts)
    assert torch.equal(protos, torch.tensor([[1.0, 2.0], [0.0, 0.0], [1.0, 2.0]]))
    assert torch.equal(known, torch.tensor([1.0, 0.0, 1.0]))


def test_fedproto_round_trip_client_sums_server_prototypes_client_loss():
    setup = small_setup(classes=3)
    setup.train = TrainConfig(local_epochs=2, batch_size=4)
    algo = algorithm("fedproto", setup, lam=0.5)
    server, w = algo.server(None), setup.new_model().floats.clone()
    assert torch.all(server.downlink(1, w)["known"] == 0)          # round 1: no prototypes
    datasets = [client_data(0, [0, 1, 0, 1, 0, 0]), client_data(1, [1, 1, 0], seed=1)]
    sums = {"feature_sum": 0, "count": 0, "model": 0, "weight": 0}
    features = []
    for d in datasets:
        client = algo.client()
        client.round_start(1, Downlink(w, NO_INTS, server.downlink(1, w)))
        ctx = ClientContext(d.cid, 1, 0.0, setup.new_model(), w, d, PLAIN,
                            torch.Generator().manual_seed(0), setup.train)
        ctx.flat.load(w)
        up = client.local_round(ctx)                            # lr 0: the features stay those of w
        assert torch.equal(up["count"], torch.bincount(d.labels, minlength=3).double())   # the last epoch only
        sums = {k: sums[k] + up[k] for k in sums}
        features.append(ctx.model.features(PLAIN.eval(d.inputs)).detach())
    server.aggregate(1, w, Replies(sums, {}, []))
    feats, labels = torch.cat(features), torch.cat([d.labels for d in datasets])
    expected = torch.stack([feats[labels == c].mean(0) for c in (0, 1)])
    down = server.downlink(2, w)
    assert torch.allclose(down["prototypes"][:2], expected, atol=1e-6)
    assert torch.equal(down["known"], torch.tensor([1.0, 1.0, 0.0]))        # nobody holds class 2
    # the local loss: CE + lambda * mean_{i,dim} (f(x_i) - C_{y_i})^2, class-2 samples contributing 0
    client = algo.client()
    client.round_start(2, Downlink(w, NO_INTS, down))
    ctx = ClientContext(0, 2, 0.1, setup.new_model(), w, datasets[0], PLAIN, torch.Generator(), setup.train)
    x, y = PLAIN.eval(datasets[0].inputs[:3]), torch.tensor([0, 1, 2])
    out = forward(ctx.model, x)
    target = torch.cat([expected, out.features[2:].detach()])
    by_hand = F.cross_entropy(out.logits, y) + 0.5 * ((out.features - target) ** 2).sum() / (3 * setup.feature_dim)
    assert torch.allclose(client.loss(ctx, Batch(x, y, torch.arange(3)), out), by_hand, atol=1e-6)


# ------------------------------------------------------------------- FedGen
def test_label_weights_by_hand():
    counts = torch.tensor([[3.0, 0.0], [1.0, 1.0]])      # 2 clients x 2 classes; each count + 1
    # class 0: (4, 2) / 6; class 1: (1, 2) / 3
    assert torch.allclose(label_weights(counts), torch.tensor([[2 / 3, 1 / 3], [1 / 3, 2 / 3]]))


def test_ensemble_teacher_loss_by_hand():
    ln3 = math.log(3)
    logits = torch.tensor([[[0.0, 0.0], [0.0, 0.0]],          # client 0: CE = ln 2 for both samples
                           [[ln3, 0.0], [0.0, ln3]]])         # client 1: label 0 -> ln(4/3), then ln 4
    y = torch.tensor([0, 0])
    weights = torch.tensor([[2 / 3, 1 / 3], [1 / 3, 2 / 3]])   # class 0: client 0 has 2/3
    expected = 2 / 3 * math.log(2) + 1 / 3 * (math.log(4 / 3) + math.log(4)) / 2
    assert abs(ensemble_loss(logits, y, weights).item() - expected) < 1e-6


def test_official_teacher_loss_is_the_product_of_the_means():
    # y = (0, 1); client weights: class 0 (0.75, 0.25), class 1 (0.2, 0.8).
    # client 0: CE = ln 2 for both samples; client 1: ln(4/3) for label 0, ln 4 for label 1.
    ln2, ln3 = math.log(2), math.log(3)
    logits = torch.tensor([[[0.0, 0.0], [0.0, 0.0]], [[ln3, 0.0], [ln3, 0.0]]])
    y = torch.tensor([0, 1])
    weights = torch.tensor([[0.75, 0.25], [0.2, 0.8]])
    ce1 = (math.log(4 / 3), math.log(4))
    weighted = (0.75 * ln2 + 0.2 * ln2) / 2 + (0.25 * ce1[0] + 0.8 * ce1[1]) / 2               # 0.919723
    official = (0.75 + 0.2) / 2 * ln2 + (0.25 + 0.8) / 2 * (ce1[0] + ce1[1]) / 2              # 0.768664
    assert abs(ensemble_loss(logits, y, weights, "weighted").item() - weighted) < 1e-6
    assert abs(ensemble_loss(logits, y, weights, "official").item() - official) < 1e-6
    # the official codes' own expression: a [B, 1] weight times a [B] loss, then the mean
    for k in range(2):
        nll = F.cross_entropy(logits[k], y, reduction="none")
        assert abs((nll * weights[y][:, k].reshape(-1, 1)).mean().item()
                   - weights[y][:, k].mean().item() * nll.mean().item()) < 1e-7


def test_diversity_loss_by_hand():
    noise = torch.tensor([[0.0], [1.0]])
    features = torch.tensor([[0.0, 0.0], [2.0, 4.0]])
    # pairs (0,1) and (1,0): mean |dG| = 3, mean (d eps)^2 = 1; the diagonal is 0; mean over 4 pairs
    assert abs(diversity_loss(noise, features).item() - math.exp(-1.5)) < 1e-7


def test_client_weights_decay_per_round_with_a_floor():
    assert decayed(0.1, 0.98, 0) == 0.1
    assert abs(decayed(10.0, 0.98, 3) - 10 * 0.98 ** 3) < 1e-12
    assert decayed(1e-3, 0.5, 10) == 1e-4
    assert decayed(0.0, 0.98, 5) == 0.0


def fedgen_setup():
    setup = small_setup(classes=3)
    setup.train = TrainConfig(batch_size=4)
    return setup


def test_fedgen_client_regulariser_by_hand():
    setup = fedgen_setup()
    algo = algorithm("fedgen", setup, alpha=2.0, beta=3.0, decay=0.5, noise_dim=2, hidden_dim=5)
    server = algo.server(ServerTools(setup.new_model(), PLAIN, None, 5))
    generator = server.generator.floats + 0.1 * torch.randn(server.generator.num_floats)
    client = algo.client()
    client.round_start(1, Downlink(torch.zeros(1), NO_INTS, {"generator": generator}))
    assert client.inputs.alpha == 0 and client.inputs.beta == 0              # round 1: no regulariser
    client.round_start(3, Downlink(torch.zeros(1), NO_INTS, {"generator": generator}))
    assert (client.inputs.alpha, client.inputs.beta) == (2.0 * 0.25, 3.0 * 0.25)
    ctx = ClientContext(0, 3, 0.1, setup.new_model(), torch.zeros(1), client_data(0, [0, 1, 2]), PLAIN,
                        torch.Generator().manual_seed(7), setup.train)
    client.begin_client(ctx)
    x, y = PLAIN.eval(ctx.data.inputs), ctx.data.labels
    out = forward(ctx.model, x)
    client.on_batch(ctx, Batch(x, y, torch.arange(3)), out)
    loss = client.loss(ctx, Batch(x, y, torch.arange(3)), out)
    # the same draws by hand: 4 labels uniform over all classes, their noise, then the batch's noise
    g = torch.Generator().manual_seed(7)
    sampled = torch.randint(3, (4,), generator=g)
    gen = server.generator.model.eval()
    server.generator.load(generator)
    with torch.no_grad():
        z_hat = gen(torch.rand(4, 2, generator=g), sampled)
        z_own = gen(torch.rand(3, 2, generator=g), y)
    head = ctx.model.classifier
    p_gen = torch.softmax(head(z_own), dim=1)
    kl = (p_gen * (p_gen.log() - torch.log_softmax(out.logits, dim=1))).sum() / 3
    by_hand = F.cross_entropy(out.logits, y) + 0.5 * F.cross_entropy(head(z_hat), sampled) + 0.75 * kl
    assert torch.allclose(loss, by_hand, atol=1e-6)
    assert torch.equal(client.inputs.label_counts, torch.ones(3))


def fedgen_rows(setup, counts):
    g = torch.Generator().manual_seed(3)
    heads = torch.randn(len(counts), setup.feature_dim * setup.num_classes + setup.num_classes, generator=g)
    return {"head": heads, "label_counts": torch.tensor(counts)}


@pytest.mark.parametrize("form", ["weighted", "official"])
def test_fedgen_server_trains_on_the_count_weighted_heads(form):
    setup = fedgen_setup()
    algo = algorithm("fedgen", setup, noise_dim=2, hidden_dim=5, generator_steps=1, teacher_loss=form)
    server = algo.server(ServerTools(setup.new_model(), PLAIN, None, 5))
    rows = fedgen_rows(setup, [[3.0, 1.0, 0.0], [0.0, 2.0, 0.0]])      # class 2: nobody's
    rng = server.rng.get_state()
    before = server.generator.floats.clone()
    w = setup.new_model().floats
    server.aggregate(1, w, Replies({"model": w.double(), "weight": torch.ones(1, dtype=torch.float64)}, rows, []))
    # the step's loss by hand: labels drawn from the held classes {0, 1}, client heads as linear maps
    g = torch.Generator().set_state(rng)
    y = torch.tensor([0, 1])[torch.randint(2, (4,), generator=g)]
    noise = torch.rand(4, 2, generator=g)
    gen = algo.client().generator
    gen.load(before)
    z = gen.model.train()(noise, y)
    d, c = setup.feature_dim, setup.num_classes
    total = 0.0
    for k, (head, n) in enumerate(zip(rows["head"], rows["label_counts"])):
        logits = z @ head[: c * d].view(c, d).T + head[c * d:]
        ce = -torch.log_softmax(logits, dim=1)[torch.arange(4), y]
        weight = torch.tensor([(n[int(label)] + 1) / (rows["label_counts"][:, int(label)] + 1).sum() for label in y])
        total = total + ((weight * ce).mean() if form == "weighted" else weight.mean() * ce.mean())
    assert abs(server.log()["generator_teacher_loss"] - total.item()) < 1e-5
    assert not torch.equal(server.generator.floats, before)


def test_fedgen_server_resumes_exactly():
    setup = fedgen_setup()
    algo = algorithm("fedgen", setup, noise_dim=2, hidden_dim=5, generator_steps=3)
    tools = ServerTools(setup.new_model(), PLAIN, None, 5)
    w = setup.new_model().floats
    replies = Replies({"model": w.double(), "weight": torch.ones(1, dtype=torch.float64)},
                      fedgen_rows(setup, [[1.0, 2.0, 3.0], [4.0, 0.0, 1.0]]), [])
    first = algo.server(tools)
    first.aggregate(1, w, replies)
    resumed = algo.server(tools)
    resumed.load_state_dict(first.state_dict())
    first.aggregate(2, w, replies)
    resumed.aggregate(2, w, replies)
    assert torch.equal(first.generator.floats, resumed.generator.floats)
