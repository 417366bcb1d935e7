"""FedCurv, FedDyn and FedDistill+: their formulas against values computed by hand."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import small_setup
from mpifed.algorithms.base import Batch, ClientContext, Downlink, Fields, Replies, forward, renewed
from mpifed.algorithms.fedcurv import empirical_fisher
from mpifed.algorithms.feddistill import class_logit_distillation, class_mean_logits
from mpifed.settings import config
from mpifed.settings.config import TrainConfig
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.registry import ALGORITHMS

PLAIN = BatchTransform([0.5], [0.5], 0, False, 0, "cpu")


def method(name, setup, **options):
    cls = ALGORITHMS.get(name)
    return cls(cls.Options(**options), setup)


def roles(name, setup, **options):
    algo = method(name, setup, **options)
    return algo.server(None), algo.client()


def data(n, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return ClientData(0, torch.randint(0, 255, (n, 1, 2, 2), generator=g, dtype=torch.uint8), torch.arange(n) % classes)


def context(setup, client_data, weights, global_weights, state, batch_size=4, epochs=1, lr=0.1):
    flat = setup.new_model()
    flat.load(weights)
    cfg = TrainConfig(batch_size=batch_size, local_epochs=epochs, momentum=0.0)
    setup.train = cfg
    return ClientContext(0, 1, lr, flat, global_weights, client_data, PLAIN, torch.Generator().manual_seed(0), cfg,
                         state=Fields("the client state", state))


def down(setup, **extra):
    return Downlink(torch.zeros(setup.num_floats), torch.zeros(0, dtype=torch.int64), extra)


def extra_loss(client, ctx):
    """The client's loss on a batch minus its cross-entropy, with the penalty's setup done by begin_client()."""
    client.begin_client(ctx)
    batch = Batch(PLAIN.eval(data(6).inputs), data(6).labels, torch.arange(6))
    out = forward(ctx.model, batch.x)
    return client.loss(ctx, batch, out) - torch.nn.functional.cross_entropy(out.logits, batch.y)


# ------------------------------------------------------------------- FedCurv
def test_fedcurv_penalty_uses_the_other_clients_only():
    # per coordinate: client 0 F = 1, w = 2; client 1 (this one) F = 3, w = -1; client 2 F = 0.5, w = 4; w = 1.
    # others: 1 (1 - 2)^2 + 0.5 (1 - 4)^2 = 5.5, less the constant 1 * 4 + 0.5 * 16 = 12: -6.5 per coordinate,
    # lambda = 0.5, 15 parameters: -48.75. Gradient: 2 lambda (1 (1 - 2) + 0.5 (1 - 4)) = -2.5 per coordinate.
    setup = small_setup()
    p = setup.num_params

    def full(v):
        return torch.full((p,), float(v))

    fisher, weights = [full(1), full(3), full(0.5)], [full(2), full(-1), full(4)]
    _, client = roles("fedcurv", setup, lam=0.5)
    client.round_start(1, down(setup, fisher=sum(fisher), fisher_weights=sum(f * w for f, w in zip(fisher, weights))))
    ctx = context(setup, data(0), full(1), full(0), {"fisher": fisher[1], "fisher_weights": fisher[1] * weights[1]})
    penalty = extra_loss(client, ctx)
    assert penalty.item() == pytest.approx(-48.75, abs=1e-4)
    ctx.flat.zero_grad()
    penalty.backward()
    assert torch.allclose(ctx.flat.grad, full(-2.5))


def test_fedcurv_first_round_has_no_penalty():
    setup = small_setup()
    p = setup.num_params
    _, client = roles("fedcurv", setup, lam=2.0)
    client.round_start(1, down(setup, fisher=torch.zeros(p), fisher_weights=torch.zeros(p)))
    ctx = context(setup, data(0), torch.randn(p), torch.zeros(p),
                  {"fisher": torch.zeros(p), "fisher_weights": torch.zeros(p)})
    assert extra_loss(client, ctx).item() == 0 and not client.inputs.active
    # the client's own contribution is all there is: no penalty either
    own = {"fisher": torch.rand(p), "fisher_weights": torch.rand(p)}
    client.round_start(2, down(setup, fisher=own["fisher"], fisher_weights=own["fisher_weights"]))
    ctx.state = Fields("the client state", own)
    assert extra_loss(client, ctx).item() == 0


def test_empirical_fisher_is_the_mean_squared_batch_gradient():
    setup = small_setup()
    client_data = data(10)
    ctx = context(setup, client_data, torch.randn(setup.num_floats), torch.zeros(setup.num_floats), {}, batch_size=4)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    expected = torch.zeros(setup.num_params)
    for idx in (order[:4], order[4:8]):          # 6 samples asked for: the first two batches of 4
        out = ctx.model(PLAIN.eval(client_data.inputs[idx]))
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(out, client_data.labels[idx]),
                                    list(ctx.model.parameters()))
        expected += torch.cat([g.flatten() for g in grads]).square() / 2
    assert torch.allclose(empirical_fisher(ctx, 6), expected, atol=1e-7)


def test_fedcurv_uplink_replaces_the_client_contribution_and_the_server_sums_it():
    setup = small_setup()
    p = setup.num_params
    server, client = roles("fedcurv", setup, lam=1.0)
    w = torch.randn(setup.num_floats)
    old = {"fisher": torch.rand(p), "fisher_weights": torch.rand(p)}
    client.round_start(1, down(setup, fisher=torch.zeros(p), fisher_weights=torch.zeros(p)))
    ctx = context(setup, data(8), w, torch.zeros(setup.num_floats), dict(old))
    ctx.new_state = renewed(ctx.state, client.end_client(ctx), "end_client")
    up = client.uplink(ctx)
    fisher = empirical_fisher(context(setup, data(8), w, torch.zeros(setup.num_floats), {}), 500)
    assert torch.allclose(ctx.new_state.fisher, fisher) and torch.allclose(ctx.new_state.fisher_weights, fisher * w[:p])
    assert torch.equal(ctx.state.fisher, old["fisher"])                     # uplink changes nothing
    assert torch.allclose(up["delta_fisher"].float(), fisher - old["fisher"])
    assert torch.allclose(up["delta_fisher_weights"].float(), fisher * w[:p] - old["fisher_weights"])
    # server: U, V start at 0 and add the round's summed changes; clients not sampled keep theirs
    model = {"model": torch.zeros(setup.num_floats, dtype=torch.float64), "weight": torch.ones(1, dtype=torch.float64)}
    server.aggregate(1, w, Replies({**model, "delta_fisher": torch.full((p,), 3.0, dtype=torch.float64),
                                    "delta_fisher_weights": torch.full((p,), 2.0, dtype=torch.float64)}, {}, []))
    server.aggregate(2, w, Replies({**model, "delta_fisher": torch.full((p,), -1.0, dtype=torch.float64),
                                    "delta_fisher_weights": torch.full((p,), 0.5, dtype=torch.float64)}, {}, []))
    sent = server.downlink(3, w)
    assert torch.equal(sent["fisher"], torch.full((p,), 2.0))
    assert torch.equal(sent["fisher_weights"], torch.full((p,), 2.5))


# ------------------------------------------------------------------- FedDyn
def test_feddyn_linear_and_quadratic_terms_and_state_update():
    # theta = 1, server model w = 0, g_k = 2, alpha = 0.1, 15 parameters:
    # -<g, theta> + alpha/2 ||theta - w||^2 = -30 + 0.75 = -29.25; gradient -g + alpha (theta - w) = -1.9;
    # then g_k <- g_k - alpha (theta_k - w) = 1.9
    setup = small_setup()
    p = setup.num_params
    _, client = roles("feddyn", setup, alpha=0.1)
    ctx = context(setup, data(0), torch.ones(p), torch.zeros(p), {"grad": torch.full((p,), 2.0)})
    extra = extra_loss(client, ctx)
    assert extra.item() == pytest.approx(-29.25, abs=1e-5)
    ctx.flat.zero_grad()
    extra.backward()
    assert torch.allclose(ctx.flat.grad, torch.full((p,), -1.9))
    ctx.new_state = renewed(ctx.state, client.end_client(ctx), "end_client")
    up = client.uplink(ctx)
    assert torch.allclose(ctx.new_state.grad, torch.full((p,), 1.9))
    assert torch.equal(up["weight"], torch.ones(1, dtype=torch.float64))     # uniform average (Algorithm 1)
    assert torch.equal(up["model"], torch.ones(p, dtype=torch.float64))


def test_feddyn_server_update_by_hand():
    # m = 4 clients, alpha = 0.5, 2 of them per round.
    # round 1: w = 0, theta = 1 and 3: sum of drifts 4; h = -0.5/4 * 4 = -0.5; w = 2 - (-0.5)/0.5 = 3.
    # round 2: w = 3, theta = 3 and 5: drifts 0 + 2 = 2; h = -0.5 - 0.5/4 * 2 = -0.75; w = 4 + 1.5 = 5.5.
    setup = small_setup(clients=4)
    p = setup.num_params
    server, _ = roles("feddyn", setup, alpha=0.5)

    def replies(*thetas):
        return Replies({"model": sum(torch.full((p,), float(t), dtype=torch.float64) for t in thetas),
                        "weight": torch.tensor([float(len(thetas))], dtype=torch.float64)}, {}, [])
    w = server.aggregate(1, torch.zeros(p), replies(1, 3))
    assert torch.allclose(server.h, torch.full((p,), -0.5, dtype=torch.float64))
    assert torch.allclose(w, torch.full((p,), 3.0))
    w = server.aggregate(2, w, replies(3, 5))
    assert torch.allclose(server.h, torch.full((p,), -0.75, dtype=torch.float64))
    assert torch.allclose(w, torch.full((p,), 5.5))
    restored, _ = roles("feddyn", setup, alpha=0.5)
    restored.load_state_dict(server.state_dict())
    assert torch.equal(restored.h, server.h)


def test_feddyn_reports_the_clients_mean_and_sends_the_server_model():
    # the rounds of test_feddyn_server_update_by_hand: the clients' means are 2 and 4, the server models 3 and 5.5
    setup = small_setup(clients=4)
    p = setup.num_params
    server, _ = roles("feddyn", setup, alpha=0.5, evaluate="clients_mean")
    plain, _ = roles("feddyn", setup, alpha=0.5)

    def replies(*thetas):
        return Replies({"model": sum(torch.full((p,), float(t), dtype=torch.float64) for t in thetas),
                        "weight": torch.tensor([float(len(thetas))], dtype=torch.float64)}, {}, [])
    w = server.aggregate(1, torch.zeros(p), replies(1, 3))
    assert torch.equal(w, plain.aggregate(1, torch.zeros(p), replies(1, 3)))
    assert torch.allclose(w, torch.full((p,), 3.0)) and torch.allclose(server.reported(w), torch.full((p,), 2.0))
    assert plain.reported(w) is w
    restored, _ = roles("feddyn", setup, alpha=0.5, evaluate="clients_mean")
    restored.load_state_dict(server.state_dict())
    w = server.aggregate(2, w, replies(3, 5))
    assert torch.allclose(w, torch.full((p,), 5.5)) and torch.allclose(server.reported(w), torch.full((p,), 4.0))
    assert torch.equal(restored.reported(w), torch.full((p,), 2.0))


def feddyn_step(optimizer, grad_clip):
    """One local step of FedDyn from theta = 1 with w = 0, g_k = 2, alpha = 0.1, weight decay 0.01, lr 0.1."""
    setup = small_setup()
    p = setup.num_params
    _, client = roles("feddyn", setup, alpha=0.1, optimizer=optimizer)
    ctx = context(setup, data(6), torch.ones(p), torch.zeros(p), {"grad": torch.full((p,), 2.0)}, batch_size=6)
    setup.train = ctx.train_cfg = dataclasses.replace(ctx.train_cfg, weight_decay=0.01, grad_clip=grad_clip)
    client.local_round(ctx)
    return ctx.flat.floats[:p].clone()


def grad_at_ones(setup, batch):
    """The cross-entropy gradient of the model at theta = 1 on ``batch`` (no augmentation)."""
    net = setup.new_model()
    net.load(torch.ones(setup.num_params))
    net.zero_grad()
    F.cross_entropy(net.model(PLAIN.eval(batch.inputs)), batch.labels).backward()
    return net.grad


def test_feddyn_official_optimiser_puts_alpha_in_the_decay_outside_the_clipping():
    # official: d = clip(grad CE - g - alpha w) + (alpha + wd) theta; theta <- theta - lr d
    raw = grad_at_ones(small_setup(), data(6)) - 2.0
    clipped = raw * min(1.0, 0.5 / (raw.norm().item() + 1e-6))
    assert clipped.norm() < raw.norm()
    by_hand = 1.0 - 0.1 * (clipped + 0.11)
    assert torch.allclose(feddyn_step("official", 0.5), by_hand, atol=1e-6)
    # without clipping the official step is Algorithm 1's: grad CE - g + alpha (theta - w) + wd theta
    assert torch.allclose(feddyn_step("official", 0.0), 1.0 - 0.1 * (raw + 0.11), atol=1e-6)
    assert torch.allclose(feddyn_step("train", 0.0), feddyn_step("official", 0.0), atol=1e-6)
    assert not torch.allclose(feddyn_step("train", 0.5), by_hand, atol=1e-4)


def test_feddyn_official_optimiser_needs_plain_sgd():
    cfg, _ = config.load([], ["algorithm={name: feddyn, optimizer: official}", "train.momentum=0"])
    assert not ALGORITHMS.get("feddyn").check_config(cfg)
    with pytest.raises(config.ConfigError, match="train.momentum=0"):
        config.load([], ["algorithm={name: feddyn, optimizer: official}", "train.momentum=0.9"])


# ------------------------------------------------------------------- FedNova (FedNTD's ccvr)
def test_fednova_ccvr_corrects_each_gradient_by_the_last_normalized_update():
    # one plain-SGD step (a_k = 1, lr 0.1) from theta = 1 with the client's last update d_k = 2:
    # theta' = theta - lr (grad CE - d_k); the new d_k = (theta - theta') / (lr a_k) = grad CE - d_k
    setup = small_setup()
    p = setup.num_params
    batch = data(6)
    grad = grad_at_ones(setup, batch)
    _, client = roles("fednova", setup, ccvr=True)
    ctx = context(setup, batch, torch.ones(p), torch.ones(p), {"update": torch.full((p,), 2.0)}, batch_size=6)
    up = client.local_round(ctx)
    assert torch.allclose(ctx.flat.floats[:p], 1 - 0.1 * (grad - 2.0), atol=1e-6)
    assert torch.allclose(ctx.new_state.update, grad - 2.0, atol=1e-5)
    assert torch.allclose(up["update"].float(), 6 * 0.1 * (grad - 2.0), atol=1e-5)        # p_k = n_k = 6, a_k = 1
    assert method("fednova", setup, ccvr=True).messages().client_state == {"update": (p,)}   # zeros before it trains
    _, plain = roles("fednova", setup)
    assert method("fednova", setup).messages().client_state == {}
    ctx = context(setup, batch, torch.ones(p), torch.ones(p), {}, batch_size=6)
    plain.local_round(ctx)
    assert torch.allclose(ctx.flat.floats[:p], 1 - 0.1 * grad, atol=1e-6) and len(ctx.new_state) == 0


# ------------------------------------------------------------------- FedDistill+
def test_feddistill_class_means_weighted_by_counts():
    # client A: 2 samples of class 0 with mean logits [1, 0, 0]; client B: 1 of class 0 ([4, 1, 0]) and 3 of
    # class 1 ([0, 2, 0]); nobody has class 2. G[0] = (2 [1, 0, 0] + 1 [4, 1, 0]) / 3 = [2, 1/3, 0]; G[1] = [0, 2, 0].
    rows = torch.zeros(2, 3, 3, dtype=torch.float64)
    rows[0, 0] = torch.tensor([1.0, 0, 0])
    rows[1, 0] = torch.tensor([4.0, 1, 0])
    rows[1, 1] = torch.tensor([0.0, 2, 0])
    counts = torch.tensor([[2.0, 0, 0], [1, 3, 0]], dtype=torch.float64)
    mean, seen = class_mean_logits(rows, counts)
    assert torch.allclose(mean[:2], torch.tensor([[2, 1 / 3, 0], [0, 2, 0]], dtype=torch.float64))
    assert seen.tolist() == [True, True, False]
    # the server keeps a class's previous global logits when no client of the round saw it
    setup = small_setup()
    server, _ = roles("feddistill_plus", setup)
    model = {"model": torch.zeros(setup.num_floats, dtype=torch.float64), "weight": torch.ones(1, dtype=torch.float64)}
    w = torch.zeros(setup.num_floats)
    server.aggregate(1, w, Replies(model, {"class_logits": rows.float(), "class_counts": counts.float()}, []))
    later = torch.zeros(1, 3, 3)
    later[0, 1] = torch.tensor([5.0, 5, 5])
    server.aggregate(2, w, Replies(model, {"class_logits": later, "class_counts": torch.tensor([[0.0, 1, 0]])}, []))
    sent = server.downlink(3, None)
    assert torch.allclose(sent["logits"], torch.tensor([[2, 1 / 3, 0], [5, 5, 5], [0, 0, 0]]))
    assert sent["known"].tolist() == [1, 1, 0]


def test_feddistill_term_by_hand():
    # z = [0, 0], G[0] = [ln 3, 0]: q = [3/4, 1/4], p = [1/2, 1/2];
    # KL(q || p) = 3/4 ln 1.5 + 1/4 ln 0.5 = 0.1308120; a sample of a class without global logits adds 0
    g = torch.tensor([[math.log(3), 0.0], [9.0, -9.0]])
    z = torch.zeros(2, 2)
    both = class_logit_distillation(z, torch.tensor([0, 1]), g, torch.tensor([1.0, 0.0]), 1.0)
    assert both.item() == pytest.approx(0.1308120 / 2, abs=1e-6)
    # tau = 2: q = softmax([ln 3 / 2, 0]) = [0.633975, 0.366025]; tau^2 KL = 0.1453631
    assert class_logit_distillation(z[:1], torch.tensor([0]), g,
                                    torch.ones(2), 2.0).item() == pytest.approx(0.1453631, abs=1e-6)


def test_feddistill_client_rows_are_the_class_means_of_its_training_passes():
    setup = small_setup()
    _, client = roles("feddistill_plus", setup)
    client.round_start(1, down(setup, logits=torch.zeros(3, 3), known=torch.zeros(3)))
    client_data = data(8)
    w = torch.randn(setup.num_floats)
    ctx = context(setup, client_data, w, w.clone(), {}, batch_size=4, epochs=2, lr=1e-30)   # the model stays put
    up = client.local_round(ctx)
    with torch.no_grad():
        logits = ctx.model(PLAIN.eval(client_data.inputs))
    for c in range(3):
        assert torch.allclose(up["class_logits"][c], logits[client_data.labels == c].mean(0), atol=1e-5)
    assert up["class_counts"].tolist() == [2 * 3, 2 * 3, 2 * 2]      # two epochs of labels 0,1,2,0,1,2,0,1
