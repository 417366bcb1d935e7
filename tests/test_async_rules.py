"""Asynchronous FL's update rules (mpifed.federation.async_rules) and server (.async_server): the
staleness functions and both rules by hand; FedBuff and FedAsync against an independent reference
(its own event queue and the papers' update rules in float64 on a logistic regression) to 1e-6;
the versions kept bounded by max_staleness + 1; a restored server continues bit for bit."""
import heapq

import numpy as np
import pytest
import torch

from mpifed.federation import keyed
from mpifed.federation.async_rules import AGGREGATIONS, staleness_weight
from mpifed.federation.async_server import AsyncServer
from mpifed.federation.clock import Devices
from mpifed.federation.events import DROP, FILL, EventQueue
from mpifed.federation.server_optimizers import SERVER_OPTIMIZERS

DIM, CLIENTS, SAMPLES = 5, 12, 40


def rule(name, **options):
    cls = AGGREGATIONS.get(name)
    return cls(cls.Options(**options))


def sgd(lr=1.0):
    cls = SERVER_OPTIMIZERS.get("sgd")
    return cls(cls.Options(lr=lr), DIM + 1)


def test_the_staleness_functions_follow_xie_et_al_section_4():
    assert staleness_weight("constant", 7, 0.5, 4) == 1.0
    assert staleness_weight("polynomial", 3, 0.5, 4) == pytest.approx(0.5)             # (3 + 1)^-0.5
    assert staleness_weight("polynomial", 0, 0.5, 4) == 1.0
    assert staleness_weight("hinge", 4, 10, 4) == 1.0
    assert staleness_weight("hinge", 6, 10, 4) == pytest.approx(1 / 21)                # 1 / (10 (6 - 4) + 1)
    with pytest.raises(ValueError, match="unknown staleness function 'linear'"):
        staleness_weight("linear", 1, 0.5, 4)


def test_fedbuff_and_fedasync_aggregates_by_hand():
    x = torch.tensor([1.0, 1.0], dtype=torch.float64)
    starts = [torch.tensor([0.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 1.0], dtype=torch.float64)]
    models = [torch.tensor([2.0, 0.0], dtype=torch.float64), torch.tensor([3.0, 1.0], dtype=torch.float64)]
    # staleness 3 and 0: weights 1/2 and 1; (0.5 (2, 0) + 1 (2, 0)) / K=2 = (1.5, 0)
    buff = rule("fedbuff", buffer=2).aggregate(x, starts, models, [3, 0])
    assert buff.tolist() == [2.5, 1.0]
    mix = rule("fedasync", alpha=0.5, staleness="constant").aggregate(x, starts[:1], models[:1], [2])
    assert mix.tolist() == [1.5, 0.5]                                                  # (1 - 0.5) x + 0.5 (2, 0)


def data():
    rng = np.random.default_rng(0)
    w_true = rng.normal(size=DIM)
    xs = rng.normal(size=(CLIENTS, SAMPLES, DIM)) + rng.normal(size=(CLIENTS, 1, DIM))   # each client shifted
    ys = (xs @ w_true + 0.3 * rng.normal(size=(CLIENTS, SAMPLES)) > 0).astype(np.float64)
    return xs, ys


XS, YS = data()


def train(cid, seq, w):
    """One client's local SGD on its logistic regression, float64: 3 epochs of batches of 8 in an order
    keyed by the dispatch sequence number."""
    w = np.array(w, dtype=np.float64)
    rng = np.random.default_rng([11, seq])
    for _ in range(3):
        order = rng.permutation(SAMPLES)
        for b in range(0, SAMPLES, 8):
            idx = order[b:b + 8]
            x, y = XS[cid, idx], YS[cid, idx]
            p = 1 / (1 + np.exp(-(x @ w[:DIM] + w[DIM])))
            g = p - y
            w[:DIM] -= 0.1 * x.T @ g / len(idx)
            w[DIM] -= 0.1 * g.mean()
    return w


def seconds():
    devices = Devices.drawn(CLIENTS, 3, ms_per_sample=10.0, speed_sigma=0.8, kbit_per_s=1000.0, bandwidth_sigma=0.5)
    return (DIM + 1) * 8 * 2 * 8 / 1000 / devices.kbit_per_s + devices.ms_per_sample / 1000 * SAMPLES * 3 * 3


def reference(name, seed, concurrency, steps, max_staleness, lr, dropout, **o):
    """The papers' rules over an event queue of its own: a heap of (end, sequence, client, start version)."""
    durations = seconds()
    heap, now, seq, version = [], 0.0, 0, 0
    x = np.zeros(DIM + 1)
    models = {0: x}
    log = []

    def weight(s):
        if o["staleness"] == "polynomial":
            return (s + 1.0) ** -o["a"]
        return 1.0 if s <= o["b"] else 1.0 / (o["a"] * (s - o["b"]) + 1.0)

    for _ in range(steps):
        took = []
        while len(took) < (o["buffer"] if name == "fedbuff" else 1):
            busy = {c for _, _, c, _ in heap}
            idle = [c for c in range(CLIENTS) if c not in busy]
            while len(heap) < concurrency:
                c = idle.pop(int(keyed.uniform(seed, FILL, seq, 0) * len(idle)))
                heapq.heappush(heap, (now + durations[c], seq, c, version))
                seq += 1
            end, sq, c, v = heapq.heappop(heap)
            now = end
            if keyed.uniform(seed, DROP, sq, c) < dropout or version - v > max_staleness:
                continue
            took.append((train(c, sq, models[v]), models[v], version - v))
        if name == "fedbuff":    # Nguyen et al., Algorithm 1: x + (1/K) sum s(tau) (y - x_tau)
            aggregate = x + sum(weight(s) * (y - start) for y, start, s in took) / len(took)
        else:                    # Xie et al., Algorithm 1: (1 - a_s) x + a_s y
            y, _, s = took[0]
            a = o["alpha"] * weight(s)
            aggregate = (1 - a) * x + a * y
        x = x + lr * (aggregate - x)
        version += 1
        models[version] = x
        log.append((now, [s for _, _, s in took]))
    return x, log


def server(name, seed, concurrency, max_staleness, dropout, **o):
    durations = seconds()
    queue = EventQueue(seed, CLIENTS, concurrency, lambda c: float(durations[c]), dropout=dropout)
    return AsyncServer(rule(name, max_staleness=max_staleness, concurrency=concurrency, **o), queue,
                       torch.zeros(DIM + 1, dtype=torch.float64), max_staleness)


def torch_train(event, start):
    return torch.from_numpy(train(event.cid, event.seq, start.numpy()))


CASES = [("fedbuff", dict(buffer=3, staleness="polynomial", a=0.5), 6, 4, 1.0, 0.0),
         ("fedbuff", dict(buffer=2, staleness="hinge", a=10.0, b=1.0), 8, 3, 0.7, 0.2),
         ("fedasync", dict(alpha=0.6, staleness="polynomial", a=0.5), 5, 16, 1.0, 0.0),
         ("fedasync", dict(alpha=0.9, staleness="hinge", a=10.0, b=4.0), 9, 3, 0.5, 0.1)]


@pytest.mark.parametrize("name,options,concurrency,max_staleness,lr,dropout", CASES)
def test_fedbuff_and_fedasync_match_an_independent_reference(name, options, concurrency, max_staleness, lr, dropout):
    steps = 40
    want, log = reference(name, 7, concurrency, steps, max_staleness, lr, dropout, **options)
    srv = server(name, 7, concurrency, max_staleness, dropout, **options)
    optimizer = sgd(lr)
    for now, staleness in log:
        plan = srv.step(torch_train, optimizer)
        assert plan.sim_time == now and plan.staleness == staleness
        assert len(srv.versions) <= max_staleness + 1
    assert np.abs(srv.model.numpy() - want).max() < 1e-6
    assert srv.version == steps and any(s > 0 for _, ss in log for s in ss)


def test_stale_updates_are_dropped_and_counted():
    srv = server("fedasync", 1, 10, 2, 0.0, alpha=0.6, staleness="polynomial", a=0.5)
    plans = [srv.step(torch_train, sgd()) for _ in range(60)]
    assert sum(len(p.stale) for p in plans) > 0
    assert all(s <= 2 for p in plans for s in p.staleness)
    assert len(srv.versions) <= 3


def test_a_restored_server_continues_bit_for_bit():
    options = dict(buffer=3, staleness="polynomial", a=0.5)
    whole = server("fedbuff", 5, 6, 4, 0.1, **options)
    for _ in range(30):
        whole.step(torch_train, sgd())
    first = server("fedbuff", 5, 6, 4, 0.1, **options)
    for _ in range(12):
        first.step(torch_train, sgd())
    saved = first.state_dict()
    again = server("fedbuff", 5, 6, 4, 0.1, **options)
    again.load_state_dict(saved)
    for _ in range(18):
        again.step(torch_train, sgd())
    assert torch.equal(again.model, whole.model) and again.queue.state_dict() == whole.queue.state_dict()


def test_apply_refuses_models_of_another_plan():
    srv = server("fedbuff", 0, 4, 4, 0.0, buffer=2, staleness="constant")
    plan = srv.plan()
    with pytest.raises(ValueError, match="apply\\(\\) takes the models of the plan of version 1 \\(2 of them\\)"):
        srv.apply(plan, [srv.model], sgd())
