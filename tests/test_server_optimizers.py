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
