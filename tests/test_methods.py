"""The distillation methods: MPI equals debug, and their server- and worker-side pieces."""
import numpy as np
import pytest
import torch

from conftest import assert_same_model, final_model, metrics, run_debug, run_mpi, tiny
from mpifed.algorithms import get_algorithm
from mpifed.algorithms.base import ServerTools, Setup
from mpifed.config import TrainConfig
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.flat import FlatModel

METHODS = [("fedntd", ()), ("fedgkd", ()), ("fedgkd_vote", ("algorithm.buffer_size=2",)), ("fedcsd", ("algorithm.mu=0.5",)),
           ("fedcad", ()), ("fedlsd", ())]


def method_args(tmp, name, extra, run_name):
    return tiny(tmp, f"algorithm.name={name}", *extra, "train.rounds=3", "data.server_holdout_per_class=3", name=run_name)


@pytest.mark.mpi
@pytest.mark.parametrize("name,extra", METHODS, ids=[m for m, _ in METHODS])
def test_method_mpi_equals_debug(has_mpirun, tmp_path, name, extra):
    run_debug(method_args(tmp_path, name, extra, "debug"))
    run_mpi(3, method_args(tmp_path, name, extra, "mpi"))
    a, b = tmp_path / "runs" / "debug", tmp_path / "runs" / "mpi"
    assert_same_model(final_model(a), final_model(b), atol=1e-6)
    assert [r["test_acc"] for r in metrics(a)] == [r["test_acc"] for r in metrics(b)]


def test_fedcad_with_zero_bounds_is_fedavg(tmp_path):
    run_debug(method_args(tmp_path, "fedcad", ("algorithm.beta=0", "algorithm.gamma=0"), "cad"))
    run_debug(method_args(tmp_path, "fedavg", (), "avg"))
    assert_same_model(final_model(tmp_path / "runs" / "cad"), final_model(tmp_path / "runs" / "avg"), atol=1e-5)


def test_fedgkd_logs_teacher_buffer(tmp_path):
    run_debug(method_args(tmp_path, "fedgkd", ("algorithm.buffer_size=2",), "gkd"))
    assert [r["teacher_models"] for r in metrics(tmp_path / "runs" / "gkd")] == [0, 1, 2]   # round 1 has no teacher


def small_setup(classes=3):
    def new_model():
        return FlatModel(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, classes)))
    flat = new_model()
    return Setup(classes, 4, flat.num_floats, flat.num_params, TrainConfig(), torch.device("cpu"), new_model)


def test_fedgkd_teacher_is_the_average_of_the_last_m_models():
    setup = small_setup()
    algo = get_algorithm("fedgkd")(get_algorithm("fedgkd").Options(buffer_size=2), setup)
    w = [torch.full((setup.num_floats,), float(i)) for i in range(4)]
    assert algo.downlink(0, w[0])["active"].item() == 0          # round 1: no aggregated model yet
    for i in (1, 2, 3):
        algo.after_round(i - 1, w[i])
    down = algo.downlink(3, w[3])
    assert down["active"].item() == 1 and torch.equal(down["teacher"], torch.full_like(w[0], 2.5))
    one = get_algorithm("fedgkd")(get_algorithm("fedgkd").Options(buffer_size=1, distill_first_round=True), setup)
    assert torch.equal(one.downlink(0, w[0])["teacher"], w[0])
    one.after_round(0, w[1])
    assert torch.equal(one.downlink(1, w[1])["teacher"], w[1])   # M = 1: the current global model


def test_fedgkd_vote_weights_follow_validation_losses():
    setup = small_setup()
    cls = get_algorithm("fedgkd_vote")
    algo = cls(cls.Options(buffer_size=3), setup)
    x = torch.randint(0, 255, (12, 1, 2, 2), dtype=torch.uint8)
    y = torch.arange(12) % 3
    tools = ServerTools(setup.new_model(), BatchTransform([0.5], [0.5], 0, False, 0, "cpu"), ClientData(-1, x, y), 5)
    algo.server_start(torch.zeros(setup.num_floats), tools)
    models = [torch.randn(setup.num_floats) for _ in range(2)]
    for i, m in enumerate(models):
        algo.after_round(i, m)
    down = algo.downlink(2, models[-1])
    losses = torch.tensor([torch.nn.functional.cross_entropy(tools.logits(m), y).item() for m in models], dtype=torch.float64)
    expected = 0.1 * torch.softmax(-losses * 3, dim=0)              # beta = 1/M with M = 3
    assert torch.allclose(down["weights"][:2].double(), expected, atol=1e-6) and down["weights"][2] == 0
    assert torch.equal(down["teachers"][:2], torch.stack(models)) and torch.all(down["teachers"][2] == 0)


def test_fedcad_class_weights_from_the_softmax_at_tau():
    from types import SimpleNamespace
    cls = get_algorithm("fedcad")
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])     # one auxiliary sample of class 0, one of class 1
    tools = SimpleNamespace(logits=lambda floats: logits, data=SimpleNamespace(labels=torch.tensor([0, 1])))
    # tau = 2: p_0 = e / (e + 2) = 0.57612, alpha_0 = 0.2 (2 p_0 - 1) + 0.5; p_1 = e^0.5 / (e^0.5 + 2) = 0.45186;
    # class 2 has no auxiliary sample: beta
    expected = {True: [0.530447, 0.480745, 0.3],
                # tau = 1: p_0 = e^2 / (e^2 + 2) = 0.78698, p_1 = e / (e + 2) = 0.57612
                False: [0.614794, 0.530447, 0.3]}
    for at_tau, values in expected.items():
        algo = cls(cls.Options(beta=0.3, gamma=0.7, tau=2.0, weights_at_tau=at_tau), small_setup())
        algo.server_start(None, tools)
        assert torch.allclose(algo.class_weights(None).float(), torch.tensor(values), atol=1e-5)


def test_fedcsd_prototype_reduction_equals_central_prototypes():
    setup = small_setup(classes=4)
    cls = get_algorithm("fedcsd")
    tf = BatchTransform([0.5], [0.5], 0, False, 0, "cpu")
    g = torch.Generator().manual_seed(0)
    clients = []
    for k, classes in enumerate([[0, 1], [1, 2], [0, 1, 2], [2]]):   # class 3 is held by nobody
        y = torch.tensor(classes * 5)
        clients.append(ClientData(k, torch.randint(0, 255, (len(y), 1, 2, 2), generator=g, dtype=torch.uint8), y))
    teacher_w = torch.randn(setup.num_floats, generator=g)

    def worker_algo():
        a = cls(cls.Options(), setup)
        a.round_start(0, {"teacher": teacher_w, "global_ints": torch.zeros(0, dtype=torch.int64)})
        return a

    # two "workers": clients {0, 1} and {2, 3}; their sums added as the all-reduce does
    workers = [worker_algo(), worker_algo()]
    sums = [{k: sum(a.client_statistics(clients[i], tf)[k] for i in ids) for k in ("prototype_sum", "holders")}
            for a, ids in zip(workers, ([0, 1], [2, 3]))]
    total = {k: sums[0][k] + sums[1][k] for k in sums[0]}
    for a in workers:
        a.use_statistics(total)
    # central: per client, mean teacher logits per held class; per class, the mean over its holders
    model = setup.new_model()
    model.load(teacher_w)
    central = torch.zeros(4, 4, dtype=torch.float64)
    for c in range(4):
        means = []
        for d in clients:
            if (d.labels == c).any():
                with torch.no_grad():
                    means.append(model.model.eval()(tf.eval(d.images[d.labels == c])).double().mean(0))
        if means:
            central[c] = torch.stack(means).mean(0)
    assert torch.allclose(workers[0].prototypes.double(), central, atol=1e-5)
    assert torch.equal(workers[0].prototypes, workers[1].prototypes)
    assert torch.all(workers[0].prototypes[3] == 0)


def test_teacher_logit_cache_equals_per_batch_logits():
    from mpifed.algorithms.base import ClientContext
    from mpifed.algorithms.teacher import Teacher
    setup = small_setup()
    teacher = Teacher(setup)
    teacher.load(torch.randn(setup.num_floats))
    x = torch.randint(0, 255, (23, 1, 2, 2), dtype=torch.uint8)
    data = ClientData(5, x, torch.arange(23) % 3)
    plain = BatchTransform([0.5], [0.5], 0, False, 0, "cpu")
    ctx = ClientContext(5, 0, 0.1, setup.new_model(), torch.zeros(1), data, plain, torch.Generator(), batch=torch.tensor([3, 17, 8]))
    expected = teacher.logits(plain.eval(x[ctx.batch]))
    assert torch.allclose(teacher.batch_logits(ctx, plain.eval(x[ctx.batch])), expected, atol=1e-6)
    assert 5 in teacher._cache
    teacher.load(torch.randn(setup.num_floats))        # a new round's teacher drops the cache
    assert not teacher._cache
    flipped = BatchTransform([0.5], [0.5], 0, True, 0, "cpu")
    ctx.transform = flipped
    aug = flipped.train(x[ctx.batch], torch.Generator().manual_seed(1))
    assert torch.equal(teacher.batch_logits(ctx, aug), teacher.logits(aug))   # augmented inputs: no cache
    assert not teacher._cache
