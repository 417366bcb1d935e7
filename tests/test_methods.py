"""The methods' server and client roles, piece by piece."""
import pytest
import torch

from conftest import metrics, run_debug, small_setup, tiny
from mpifed.algorithms.base import Batch, ClientContext, Downlink, Fields, Replies, ServerTools, forward
from mpifed.settings.config import TrainConfig
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.registry import ALGORITHMS


@pytest.mark.e2e
def test_fedgkd_logs_teacher_buffer(tmp_path):
    run_debug(tiny(tmp_path, "algorithm.name=fedgkd", "algorithm.buffer_size=2", "train.rounds=3", name="gkd"))
    assert [r["teacher_models"] for r in metrics(tmp_path / "runs" / "gkd")] == [0, 1, 2]   # round 1 has no teacher


def roles(name, setup, tools=None, **options):
    """The server and client roles of method ``name``, built separately as on two ranks."""
    cls = ALGORITHMS.get(name)
    algo = cls(cls.Options(**options), setup)
    return algo.server(tools), algo.client()


def test_fedgkd_teacher_is_the_average_of_the_last_m_models():
    setup = small_setup()
    server, _ = roles("fedgkd", setup, buffer_size=2)
    w = [torch.full((setup.num_floats,), float(i)) for i in range(4)]
    assert server.downlink(1, w[0])["active"].item() == 0          # round 1: no aggregated model yet
    for i in (1, 2, 3):
        aggregated(server, i, w[i - 1], fedavg_replies(w[i]))
    down = server.downlink(4, w[3])
    assert down["active"].item() == 1 and torch.equal(down["teacher"], torch.full_like(w[0], 2.5))
    one, _ = roles("fedgkd", setup, buffer_size=1, distill_first_round=True)
    assert torch.equal(one.downlink(1, w[0])["teacher"], w[0])
    aggregated(one, 1, w[0], fedavg_replies(w[1]))
    assert torch.equal(one.downlink(2, w[1])["teacher"], w[1])   # M = 1: the current global model


def fedavg_replies(model):
    """Replies whose FedAvg average is ``model``."""
    return Replies({"model": model.double(), "weight": torch.ones(1, dtype=torch.float64)}, {}, [])


def aggregated(server, server_round, weights, replies):
    """The new global model of round ``server_round``, the server role told of it, as the round does."""
    new = server.aggregate(server_round, weights, replies)
    server.global_updated(server_round, new)
    return new


def test_fedgkd_vote_weights_follow_validation_losses():
    setup = small_setup()
    x = torch.randint(0, 255, (12, 1, 2, 2), dtype=torch.uint8)
    y = torch.arange(12) % 3
    tools = ServerTools(setup.new_model(), BatchTransform([0.5], [0.5], 0, False, 0, "cpu"), ClientData(-1, x, y), 5)
    server, _ = roles("fedgkd_vote", setup, tools, buffer_size=3)
    models = [torch.randn(setup.num_floats) for _ in range(2)]
    for i, m in enumerate(models):
        aggregated(server, i + 1, m, fedavg_replies(m))
    down = server.downlink(3, models[-1])
    losses = torch.tensor([torch.nn.functional.cross_entropy(tools.logits(m), y).item() for m in models],
                          dtype=torch.float64)
    expected = 0.1 * torch.softmax(-losses * 3, dim=0)              # beta = 1/M with M = 3
    assert torch.allclose(down["teacher_weights"][:2].double(), expected, atol=1e-6) and down["teacher_weights"][2] == 0
    assert torch.equal(down["teachers"][:2], torch.stack(models)) and torch.all(down["teachers"][2] == 0)


def test_fedcad_class_weights_from_the_softmax_at_tau():
    from types import SimpleNamespace
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])     # one auxiliary sample of class 0, one of class 1
    tools = SimpleNamespace(logits=lambda floats: logits, data=SimpleNamespace(labels=torch.tensor([0, 1])))
    # tau = 2: p_0 = e / (e + 2) = 0.57612, alpha_0 = 0.2 (2 p_0 - 1) + 0.5; p_1 = e^0.5 / (e^0.5 + 2) = 0.45186;
    # class 2 has no auxiliary sample: beta
    expected = {True: [0.530447, 0.480745, 0.3],
                # tau = 1: p_0 = e^2 / (e^2 + 2) = 0.78698, p_1 = e / (e + 2) = 0.57612
                False: [0.614794, 0.530447, 0.3]}
    for at_tau, values in expected.items():
        server, _ = roles("fedcad", small_setup(), tools, beta=0.3, gamma=0.7, tau=2.0, weights_at_tau=at_tau)
        assert torch.allclose(server.class_weights(None).float(), torch.tensor(values), atol=1e-5)


def test_fedcsd_prototype_reduction_equals_central_prototypes():
    setup = small_setup(classes=4)
    tf = BatchTransform([0.5], [0.5], 0, False, 0, "cpu")
    g = torch.Generator().manual_seed(0)
    clients = []
    for k, classes in enumerate([[0, 1], [1, 2], [0, 1, 2], [2]]):   # class 3 is held by nobody
        y = torch.tensor(classes * 5)
        clients.append(ClientData(k, torch.randint(0, 255, (len(y), 1, 2, 2), generator=g, dtype=torch.uint8), y))
    teacher_w = torch.randn(setup.num_floats, generator=g)

    def worker_algo():
        _, client = roles("fedcsd", setup)
        client.round_start(1,
                           Downlink(torch.zeros(setup.num_floats), torch.zeros(0, dtype=torch.int64),
                                    {"teacher": teacher_w}))
        return client

    # two "workers": clients {0, 1} and {2, 3}; their sums added as the all-reduce does
    workers = [worker_algo(), worker_algo()]
    sums = [{k: sum(a.statistics(clients[i], tf)[k] for i in ids) for k in ("prototype_sum", "holders")}
            for a, ids in zip(workers, ([0, 1], [2, 3]))]
    total = {k: sums[0][k] + sums[1][k] for k in sums[0]}
    for a in workers:
        a.use_statistics(Fields("the client statistics", total))
    # central: per client, mean teacher logits per held class; per class, the mean over its holders
    model = setup.new_model()
    model.load(teacher_w)
    central = torch.zeros(4, 4, dtype=torch.float64)
    for c in range(4):
        means = []
        for d in clients:
            if (d.labels == c).any():
                with torch.no_grad():
                    means.append(model.model.eval()(tf.eval(d.inputs[d.labels == c])).double().mean(0))
        if means:
            central[c] = torch.stack(means).mean(0)
    assert torch.allclose(workers[0].inputs.prototypes.double(), central, atol=1e-5)
    assert torch.equal(workers[0].inputs.prototypes, workers[1].inputs.prototypes)
    assert torch.all(workers[0].inputs.prototypes[3] == 0)


def test_teacher_logit_cache_equals_per_batch_logits():
    from mpifed.algorithms.teacher import Teacher
    setup = small_setup()
    teacher = Teacher(setup)
    teacher.load(torch.randn(setup.num_floats))
    x = torch.randint(0, 255, (23, 1, 2, 2), dtype=torch.uint8)
    data = ClientData(5, x, torch.arange(23) % 3)
    plain = BatchTransform([0.5], [0.5], 0, False, 0, "cpu")
    ctx = ClientContext(5, 1, 0.1, setup.new_model(), torch.zeros(1), data, plain, torch.Generator(), TrainConfig())
    idx = torch.tensor([3, 17, 8])
    expected = teacher.logits(plain.eval(x[idx]))
    assert torch.allclose(teacher.batch_logits(ctx, Batch(plain.eval(x[idx]), data.labels[idx], idx)),
                          expected, atol=1e-6)
    assert 5 in teacher._cache
    teacher.load(torch.randn(setup.num_floats))        # a new round's teacher drops the cache
    assert not teacher._cache
    flipped = BatchTransform([0.5], [0.5], 0, True, 0, "cpu")
    ctx.transform = flipped
    aug = flipped.train(x[idx], torch.Generator().manual_seed(1))
    assert torch.equal(teacher.batch_logits(ctx, Batch(aug, data.labels[idx], idx)),
                       teacher.logits(aug))   # augmented: no cache
    assert not teacher._cache


def test_fedcsd_local_prototypes_and_official_weighting():
    """``prototypes: local`` uses the client's own class means and no all-reduce; ``weighting: official``
    is (1 - mu) CE + mu L_CSD."""
    from mpifed.local.losses import csd_loss
    setup = small_setup(classes=3)
    cls = ALGORITHMS.get("fedcsd")
    local = cls(cls.Options(prototypes="local"), setup)
    assert local.messages().statistics == {}
    tf = BatchTransform([0.5], [0.5], 0, False, 0, "cpu")
    g = torch.Generator().manual_seed(0)
    data = ClientData(0, torch.randint(0, 255, (9, 1, 2, 2), generator=g, dtype=torch.uint8),
                      torch.tensor([0, 1] * 4 + [0]))
    teacher_w = torch.randn(setup.num_floats, generator=g)
    for weighting in ("paper", "official"):
        client = cls(cls.Options(prototypes="local", weighting=weighting, mu=0.4), setup).client()
        client.round_start(1, Downlink(teacher_w, torch.zeros(0, dtype=torch.int64), {"teacher": teacher_w}))
        ctx = ClientContext(0, 1, 0.1, setup.new_model(), teacher_w, data, tf, torch.Generator(),
                            TrainConfig(local_epochs=1))
        client.begin_client(ctx)
        own = client.client_prototypes(data, tf)[0].float()
        assert torch.equal(client.inputs.prototypes, own) and torch.all(own[2] == 0)      # class 2 not held: a zero row
        idx = torch.arange(9)
        batch = Batch(tf.eval(data.inputs), data.labels, idx)
        out = forward(ctx.model, batch.x)
        ce = torch.nn.functional.cross_entropy(out.logits, batch.y)
        distill = csd_loss(out.logits, client.teacher.batch_logits(ctx, batch), batch.y, own, 10.0)
        expected = (0.6 if weighting == "official" else 1.0) * ce + 0.4 * distill
        assert torch.allclose(client.loss(ctx, batch, out), expected, atol=1e-6)
