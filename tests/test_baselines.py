import math

import pytest
import torch

from conftest import assert_same_model, final_model, metrics, run_debug, run_mpi_series, small_setup, tiny
from mpifed.algorithms.base import Batch, ClientContext, Fields, Outputs, Replies, Setup, zeros
from mpifed.algorithms.moon import own_initial_model
from mpifed.algorithms.scaffold import effective_steps
from mpifed.settings.config import TrainConfig
from mpifed.data.store import ClientData
from mpifed.local.flat import FlatModel
from mpifed.models.base import SplitNet
from mpifed.registry import ALGORITHMS


def test_effective_steps_match_momentum_displacement():
    lr, beta, g = 0.1, 0.9, 1.0
    for k in (1, 5, 40):
        w, buf = 0.0, None
        for _ in range(k):
            buf = g if buf is None else beta * buf + g
            w -= lr * buf
        assert abs(-w / (lr * g) - effective_steps(k, beta)) < 1e-9
    assert effective_steps(7, 0.0) == 7.0


@pytest.mark.e2e
def test_feddyn_clients_mean_changes_what_is_evaluated_not_what_is_trained(tmp_path):
    common = ("algorithm.name=feddyn", "algorithm.alpha=0.1", "train.participation=0.6")
    run_debug(tiny(tmp_path, *common, name="server"))
    run_debug(tiny(tmp_path, *common, "algorithm.evaluate=clients_mean", name="mean"))
    server, mean = metrics(tmp_path / "runs" / "server"), metrics(tmp_path / "runs" / "mean")
    assert [r["train_loss"] for r in server] == [r["train_loss"] for r in mean]
    assert [r["test_loss"] for r in server] != [r["test_loss"] for r in mean]
    with pytest.raises(AssertionError):
        assert_same_model(final_model(tmp_path / "runs" / "server"), final_model(tmp_path / "runs" / "mean"), atol=1e-4)


# ------------------------------------------------------------------- FedAvgM
def bn_setup():
    """A Setup whose network has float buffers: BatchNorm1d(4) (weight, bias; running mean, var) + Linear(4, 3)."""
    def new_model():
        return FlatModel(SplitNet(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.BatchNorm1d(4)),
                                  torch.nn.Linear(4, 3)))
    flat = new_model()
    return Setup(3, 4, 4, flat.num_floats, flat.num_params, flat.ints.numel(), 4, TrainConfig(),
                 torch.device("cpu"), new_model)


def fedavgm_rounds(**options):
    """Two rounds from w = 0 whose client averages are 1, then 2 everywhere (beta 0.9, server lr 1)."""
    setup = bn_setup()
    cls = ALGORITHMS.get("fedavgm")
    server = cls(cls.Options(beta=0.9, **options), setup).server(None)
    n = setup.num_floats

    def replies(value):
        return Replies({"model": torch.full((n,), float(value), dtype=torch.float64),
                        "weight": torch.ones(1, dtype=torch.float64)}, {}, [])
    w1 = server.aggregate(1, torch.zeros(n), replies(1))
    w2 = server.aggregate(2, w1, replies(2))
    return setup.num_params, w1, w2


def test_fedavgm_momentum_by_hand():
    # undampened: v1 = -1, w1 = 1; v2 = 0.9 (-1) + (1 - 2) = -1.9, w2 = 2.9
    p, w1, w2 = fedavgm_rounds()
    assert torch.allclose(w1, torch.ones_like(w1)) and torch.allclose(w2, torch.full_like(w2, 2.9))
    # dampened (MOON's code): v1 = 0.1 (-1), w1 = 0.1; v2 = 0.9 (-0.1) + 0.1 (0.1 - 2) = -0.28, w2 = 0.38
    p, w1, w2 = fedavgm_rounds(dampening=True)
    assert torch.allclose(w1, torch.full_like(w1, 0.1)) and torch.allclose(w2, torch.full_like(w2, 0.38))
    # buffers averaged: the running statistics take the clients' average, the parameters the momentum
    p, w1, w2 = fedavgm_rounds(dampening=True, buffers="average")
    assert torch.allclose(w2[:p], torch.full((p,), 0.38)) and torch.equal(w1[p:], torch.ones(len(w1) - p))
    assert torch.equal(w2[p:], torch.full((len(w2) - p,), 2.0)) and len(w2) - p == 8


# ------------------------------------------------------------------- MOON
def moon_previous(first_negative, server_round, trained=False, cid=2):
    """The MOON client's negative for a client in round ``server_round`` (None: no contrastive term)."""
    setup = small_setup()
    cls = ALGORITHMS.get("moon")
    client = cls(cls.Options(projection_dim=0, first_negative=first_negative), setup).client()
    flat = setup.new_model()
    ctx = ClientContext(cid, server_round, 0.1, flat, flat.floats.clone(),
                        ClientData(cid, torch.zeros(0, 1, 2, 2), torch.zeros(0, dtype=torch.long)),
                        None, torch.Generator(), setup.train)
    ctx.state = zeros("the client state", cls(cls.Options(), setup).messages().client_state)
    if trained:
        ctx.state = Fields("the client state",
                           {"previous": torch.full((setup.num_floats,), 3.0), "trained": torch.ones(1)})
    client.begin_client(ctx)
    return client.previous.flat.floats.clone() if client.inputs.has_previous else None


def test_moon_negative_of_a_client_that_has_not_trained_yet():
    setup = small_setup()
    for choice in ("none", "random", "initial"):
        assert moon_previous(choice, 1) is None                                   # round 1: no term anywhere
        assert torch.equal(moon_previous(choice, 5, trained=True), torch.full((setup.num_floats,), 3.0))
    assert moon_previous("none", 5) is None
    random = moon_previous("random", 5)
    assert torch.equal(random, own_initial_model(setup, 2)) and torch.equal(moon_previous("random", 8), random)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    own_initial_model(setup, 2)
    assert torch.equal(torch.random.get_rng_state(), state)                      # the global draws are untouched
    assert not torch.equal(own_initial_model(setup, 3), random)
    assert torch.equal(moon_previous("initial", 5), setup.initial_model().floats)


MOON = ("algorithm.name=moon", "algorithm.mu=2", "algorithm.projection_dim=16", "train.participation=0.4",
        "train.rounds=3")
EQUAL = ("data.partition=iid", "train.participation=0.6", "train.rounds=3")   # clients of equal sizes
MPI_RUNS = {"moon-random": (*MOON, "algorithm.first_negative=random"),
            "moon-initial": (*MOON, "algorithm.first_negative=initial"),
            "fednova-ccvr": ("algorithm.name=fednova", "algorithm.ccvr=true", *EQUAL)}


@pytest.fixture(scope="module")
def mpi_runs(has_mpirun, shared_run, tmp_path_factory):
    """{name: (its run of MPI_RUNS with 3 ranks, the run's directory)}, all the runs in one MPI job."""
    tmp = tmp_path_factory.mktemp("mpi")
    runs = [tiny(tmp, *o, f"data.prepared_root={shared_run.data}", name=n) for n, o in MPI_RUNS.items()]
    return {n: (p, tmp / "runs" / n) for n, p in zip(MPI_RUNS, run_mpi_series(3, runs, tmp))}


def mpi_run(mpi_runs, name):
    p, run = mpi_runs[name]
    assert p.returncode == 0, f"the MPI run {name} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return run


@pytest.mark.mpi
@pytest.mark.e2e
@pytest.mark.parametrize("choice", ["random", "initial"])
def test_moon_first_negative_mpi_equals_debug_and_acts(mpi_runs, shared_run, choice):
    mpi = mpi_run(mpi_runs, f"moon-{choice}")
    debug, none = shared_run(*MPI_RUNS[f"moon-{choice}"]), shared_run(*MOON)
    assert_same_model(final_model(debug), final_model(mpi), atol=1e-6)
    assert [r["test_acc"] for r in metrics(debug)] == [r["test_acc"] for r in metrics(mpi)]
    with pytest.raises(AssertionError):
        assert_same_model(final_model(debug), final_model(none), atol=1e-5)


# ------------------------------------------------------------------- FedNova as FedNTD runs it
@pytest.mark.mpi
@pytest.mark.e2e
def test_fednova_ccvr_departs_from_fedavg_with_equal_clients_and_mpi_equals_debug(mpi_runs, shared_run):
    mpi = mpi_run(mpi_runs, "fednova-ccvr")
    fedavg, nova = shared_run("algorithm.name=fedavg", *EQUAL), shared_run("algorithm.name=fednova", *EQUAL)
    debug = shared_run(*MPI_RUNS["fednova-ccvr"])
    assert_same_model(final_model(nova), final_model(fedavg), atol=1e-5)
    with pytest.raises(AssertionError):
        assert_same_model(final_model(debug), final_model(fedavg), atol=1e-4)
    assert_same_model(final_model(debug), final_model(mpi), atol=1e-6)
    assert [r["test_acc"] for r in metrics(debug)] == [r["test_acc"] for r in metrics(mpi)]


# ------------------------------------------------------------------- FedNTD's KD -> NTD (App. H)
@pytest.mark.parametrize("lam, expected", [(1.0, 0.869723), (0.3, 0.819415), (0.0, 0.797855)])
def test_fedntd_moves_from_kd_to_ntd_by_hand(lam, expected):
    # student logits (1, 2, 0), global model's (0, 1, 1), label 1, tau = beta = 1. With e = exp(1):
    # CE = log(1 + e + e^2) - 2 = 0.407606;
    # KD = KL(softmax(0, 1, 1) || softmax(1, 2, 0)) over all classes = 0.390249;
    # NTD = KL(softmax(0, 1) || softmax(1, 0)) over classes 0 and 2 = (e - 1) / (e + 1) = 0.462117;
    # loss = CE + (1 - lam) KD + lam NTD.
    e = math.e
    q, p = [1, e, e], [e, e * e, 1]
    kd = sum(a / sum(q) * math.log((a / sum(q)) / (b / sum(p))) for a, b in zip(q, p))
    assert abs(math.log(1 + e + e * e) - 2 + (1 - lam) * kd + lam * (e - 1) / (e + 1) - expected) < 1e-6
    setup = small_setup()
    cls = ALGORITHMS.get("fedntd")
    client = cls(cls.Options(lam=lam), setup).client()
    client.teacher.batch_logits = lambda ctx, batch: torch.tensor([[0.0, 1.0, 1.0]])
    student = torch.tensor([[1.0, 2.0, 0.0]])
    batch = Batch(None, torch.tensor([1]), torch.tensor([0]))
    assert client.loss(None, batch, Outputs(torch.zeros(1, 4), student)).item() == pytest.approx(expected, abs=1e-6)


# ------------------------------------------------------------------- FedGKD's MSE regulariser (Table 9)
def test_fedgkd_mse_regulariser_by_hand():
    # two samples, labels (1, 0): student logits (1, 2, 0) and (0, 0, 0), teacher's (0, 1, 1) and (2, 0, 0).
    # CE = (log(1 + e + e^2) - 2 + log 3) / 2 = 0.753109; MSE over the 6 logits = (1 + 1 + 1 + 4) / 6;
    # gamma = 0.4: CE + 0.2 * 7/6 = 0.986442.
    setup = small_setup()
    cls = ALGORITHMS.get("fedgkd")
    client = cls(cls.Options(gamma=0.4, loss="mse"), setup).client()
    client.inputs.active = True
    client.teacher.batch_logits = lambda ctx, batch: torch.tensor([[0.0, 1.0, 1.0], [2.0, 0.0, 0.0]])
    student = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    batch = Batch(None, torch.tensor([1, 0]), torch.tensor([0, 1]))
    loss = client.loss(None, batch, Outputs(torch.zeros(2, 4), student))
    ce = (math.log(1 + math.e + math.e ** 2) - 2 + math.log(3)) / 2
    assert loss.item() == pytest.approx(ce + 0.2 * 7 / 6, abs=1e-6)
    assert loss.item() == pytest.approx(0.986442, abs=1e-6)
