"""Server optimisers (mpifed.federation.server_optimizers): each step against Reddi et al.'s
Algorithm 2 by hand, sgd at lr 1 the aggregate itself, sgdm FedAvgM's arithmetic bit for bit."""
import math

import pytest
import torch

from conftest import small_setup
from mpifed.algorithms.base import Replies
from mpifed.federation.server_optimizers import SERVER_OPTIMIZERS
from mpifed.registry import ALGORITHMS


def make(name, num_params=2, **options):
    cls = SERVER_OPTIMIZERS.get(name)
    return cls(cls.Options(**options), num_params)


def test_sgd_at_lr_1_returns_the_aggregate_itself_and_moves_part_of_the_way_below():
    x, avg = torch.tensor([1.0, 2.0, 5.0]), torch.tensor([3.0, 0.0, 7.0])
    assert make("sgd").step(x, avg) is avg
    half = make("sgd", lr=0.5).step(x, avg)
    assert half.tolist() == [2.0, 1.0, 7.0]      # the parameters half way; the buffer (index 2) takes the aggregate


def test_the_adaptive_steps_follow_algorithm_2_by_hand():
    x, avg = torch.tensor([1.0, 1.0], dtype=torch.float64), torch.tensor([1.5, 0.0], dtype=torch.float64)
    d = avg - x                                   # Delta = (0.5, -1)
    b1, b2, tau, lr = 0.9, 0.99, 1e-3, 0.1
    m = (1 - b1) * d
    v0 = torch.full_like(d, tau ** 2)
    expected = {"adagrad": v0 + d * d, "adam": b2 * v0 + (1 - b2) * d * d,
                "yogi": v0 - (1 - b2) * d * d * torch.sign(v0 - d * d)}
    for name, v in expected.items():
        opt = make(name, lr=lr)
        new = opt.step(x, avg)
        assert torch.allclose(new, x + lr * m / (v.sqrt() + tau), rtol=0, atol=1e-15), name
        assert torch.equal(opt.v, v) and torch.equal(opt.m, m)
    # a second round with the same Delta: Yogi's v grows by (1 - b2) Delta^2 while v < Delta^2
    yogi = make("yogi", lr=lr)
    yogi.step(x, avg)
    before = yogi.v.clone()
    yogi.step(x, avg)
    assert torch.allclose(yogi.v, before + (1 - b2) * d * d)
    assert math.isclose(float(yogi.m[0]), b1 * (1 - b1) * 0.5 + (1 - b1) * 0.5)


def test_sgdm_is_fedavgm_with_averaged_buffers_bit_for_bit():
    setup = small_setup()
    fedavgm = ALGORITHMS.get("fedavgm")
    server = fedavgm(fedavgm.Options(beta=0.9, server_lr=0.7, buffers="average"), setup).server(None)
    opt = make("sgdm", num_params=setup.num_params, lr=0.7, momentum=0.9)
    torch.manual_seed(0)
    w_ref = w_opt = torch.randn(setup.num_floats)
    for _ in range(4):
        models = torch.randn(3, setup.num_floats)
        sums = {"model": (models.double() * 2).sum(0), "weight": torch.tensor([6.0], dtype=torch.float64)}
        w_ref = server.aggregate(1, w_ref, Replies(sums, {}, []))
        average = (sums["model"] / sums["weight"]).to(torch.float32)
        w_opt = opt.step(w_opt, average)
        assert torch.equal(w_ref, w_opt)


@pytest.mark.parametrize("name", ["sgdm", "adagrad", "adam", "yogi"])
def test_an_optimisers_state_is_what_a_resume_continues_from(name):
    x, avg = torch.tensor([1.0, 2.0]), torch.tensor([1.5, 1.0])
    whole, first = make(name), make(name)
    whole.step(x, avg)
    first.step(x, avg)
    resumed = make(name)
    resumed.load_state_dict({k: v.clone() for k, v in first.state_dict().items()})
    assert torch.equal(whole.step(x, avg), resumed.step(x, avg))


# ---------------------------------------------------------------- through the server's aggregation
def bn_setup():
    """A Setup whose model has BatchNorm: float buffers (running mean and variance) after the parameters."""
    from mpifed.algorithms.base import Setup
    from mpifed.local.flat import FlatModel
    from mpifed.models.base import SplitNet
    from mpifed.settings.config import TrainConfig

    def new_model():
        body = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.BatchNorm1d(4))
        return FlatModel(SplitNet(body, torch.nn.Linear(4, 3)))
    flat = new_model()
    return Setup(3, 4, 4, flat.num_floats, flat.num_params, flat.ints.numel(), 4, TrainConfig(), torch.device("cpu"),
                 new_model)


def server_of(method, setup, optimizer=None, **options):
    from mpifed.algorithms.base import ServerTools
    from mpifed.data.transforms import BatchTransform
    cls = ALGORITHMS.get(method)
    tools = ServerTools(setup.new_model(), BatchTransform([0.5], [0.5], 0, False, 0, "cpu"), None, 5, optimizer)
    return cls(cls.Options(**options), setup).server(tools)


def replies(setup, seed):
    g = torch.Generator().manual_seed(seed)
    models = torch.randn(3, setup.num_floats, generator=g, dtype=torch.float64)
    weights = torch.tensor([2.0, 3.0, 5.0], dtype=torch.float64)
    return Replies({"model": (models * weights[:, None]).sum(0), "weight": weights.sum().reshape(1)}, {}, [])


def test_sgd_at_lr_1_through_the_server_is_todays_fedavg_bit_for_bit():
    setup = bn_setup()
    w = torch.randn(setup.num_floats)
    plain, stepped = server_of("fedavg", setup), server_of("fedavg", setup, make("sgd", setup.num_params))
    for seed in range(3):
        r = replies(setup, seed)
        mean = (r.sums.model / r.sums.weight).to(torch.float32)
        assert torch.equal(plain.aggregate(seed + 1, w, r), mean)
        assert torch.equal(stepped.aggregate(seed + 1, w, r), mean)


@pytest.mark.parametrize("name", ["adagrad", "adam", "yogi"])
def test_one_adaptive_step_through_the_server_follows_algorithm_2_and_the_buffers_take_the_mean(name):
    setup = bn_setup()
    p, lr, b1, b2, tau = setup.num_params, 0.05, 0.9, 0.99, 1e-3
    assert setup.num_floats > p                                   # the BatchNorm statistics follow the parameters
    server = server_of("fedavg", setup, make(name, setup.num_params, lr=lr))
    w = torch.randn(setup.num_floats, generator=torch.Generator().manual_seed(9))
    r = replies(setup, 0)
    new = server.aggregate(1, w, r)
    mean = (r.sums.model / r.sums.weight).to(torch.float32)
    d = (mean - w)[:p].double()                                   # Reddi et al., Alg. 2: Delta, then m, v from tau^2
    m = (1 - b1) * d
    v0 = torch.full_like(d, tau ** 2)
    v = {"adagrad": v0 + d * d, "adam": b2 * v0 + (1 - b2) * d * d,
         "yogi": v0 - (1 - b2) * d * d * torch.sign(v0 - d * d)}[name]
    expected = w[:p].double() + lr * m / (v.sqrt() + tau)
    assert torch.allclose(new[:p].double(), expected, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(new[:p], mean[:p])
    assert torch.equal(new[p:], mean[p:])


def test_fedgkds_buffer_and_fedcsds_teacher_hold_the_stepped_model():
    setup = small_setup()
    w = torch.randn(setup.num_floats)
    gkd = server_of("fedgkd", setup, make("adam", setup.num_params, lr=0.1))
    new = gkd.aggregate(1, w, replies(setup, 0))
    gkd.global_updated(1, new)                                    # what the round calls after aggregate
    assert torch.equal(gkd.buffer[-1], new)
    csd = server_of("fedcsd", setup, make("adam", setup.num_params, lr=0.1))
    csd.start(w)
    before = csd.ema.clone()
    new = csd.aggregate(1, w, replies(setup, 0))
    a = csd.options.alpha
    assert torch.equal(csd.ema, a * before + (1 - a) * new)


def test_fednova_steps_from_its_normalised_model():
    setup = small_setup()
    w = torch.randn(setup.num_floats)
    g = torch.Generator().manual_seed(1)
    sums = {"update": torch.randn(setup.num_params, generator=g, dtype=torch.float64),
            "tau": torch.tensor([12.0], dtype=torch.float64), "buffers": torch.zeros(0, dtype=torch.float64),
            "weight": torch.tensor([3.0], dtype=torch.float64)}
    nova = server_of("fednova", setup).aggregate(1, w, Replies(sums, {}, []))
    half = server_of("fednova", setup, make("sgd", setup.num_params, lr=0.5)).aggregate(1, w, Replies(sums, {}, []))
    assert torch.allclose(half, w + 0.5 * (nova - w))


@pytest.mark.parametrize("method", ["fedavgm", "feddyn"])
def test_methods_with_their_own_server_step_refuse_another_optimiser(method):
    from mpifed.plugin.options import ConfigError
    from mpifed.settings import config
    config.load([], [f"algorithm.name={method}", "server_optimizer.name=sgd", "server_optimizer.lr=1"])
    with pytest.raises(ConfigError, match=rf"server_optimizer: algorithm '{method}' takes its own server step"):
        config.load([], [f"algorithm.name={method}", "server_optimizer.name=adam"])
    with pytest.raises(ConfigError, match="set server_optimizer=sgd with lr 1"):
        config.load([], [f"algorithm.name={method}", "server_optimizer.lr=0.5"])


def test_sgdm_through_the_server_is_fedavgm_with_averaged_buffers_bit_for_bit():
    setup = bn_setup()
    sgdm = server_of("fedavg", setup, make("sgdm", setup.num_params, lr=0.7, momentum=0.9))
    fedavgm = server_of("fedavgm", setup, beta=0.9, server_lr=0.7, buffers="average")
    w_sgdm = w_fedavgm = torch.randn(setup.num_floats)
    for seed in range(4):
        w_sgdm, w_fedavgm = sgdm.aggregate(seed + 1, w_sgdm, replies(setup, seed)), fedavgm.aggregate(
            seed + 1, w_fedavgm, replies(setup, seed))
        assert torch.equal(w_sgdm, w_fedavgm)


def test_the_default_is_no_part_of_a_runs_identity_and_another_choice_is():
    from mpifed.settings import config
    default = config.math_fingerprint(config.load([], [])[1])
    assert "server_optimizer" not in default      # runs made before server optimisers keep their identity
    assert "server_optimizer" not in config.math_fingerprint(config.load([], ["server_optimizer.lr=1"])[1])
    adam = config.math_fingerprint(config.load([], ["server_optimizer.name=adam"])[1])
    assert adam["server_optimizer"]["name"] == "adam"
    half = config.math_fingerprint(config.load([], ["server_optimizer.lr=0.5"])[1])
    assert half["server_optimizer"] == {"name": "sgd", "lr": 0.5}
