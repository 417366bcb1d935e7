"""The virtual clock (mpifed.federation.clock, .keyed): keyed draws are pure functions of their key,
round times follow the cost model by hand, deadlines, dropouts, over-commitment and partial work."""
import math

import numpy as np
import pytest

from mpifed.federation import keyed
from mpifed.federation.clock import Availability, Devices, Policy, plan_round, trace_rows
from mpifed.federation.traces import AvailabilityTrace


def test_a_keyed_draw_depends_on_its_key_only():
    ids = np.arange(1000)
    whole = keyed.uniform(7, 1, 3, ids)
    assert np.array_equal(keyed.uniform(7, 1, 3, ids[[5, 999, 0]]), whole[[5, 999, 0]])   # any subset, any order
    assert not np.array_equal(keyed.uniform(8, 1, 3, ids), whole)
    assert not np.array_equal(keyed.uniform(7, 1, 4, ids), whole)
    assert 0.0 <= whole.min() and whole.max() < 1.0 and abs(whole.mean() - 0.5) < 0.05
    z = keyed.normal(7, 1, 3, np.arange(100_000))
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02


def test_a_round_time_is_communication_plus_computation_by_hand():
    devices = Devices(np.array([10.0, 20.0]), np.array([1000.0, 500.0]))   # ms per sample, kbit/s
    t = plan_round(0, 1, np.array([0, 1]), 2, devices, Policy(), {0: 5, 1: 5}, samples_per_step=8, passes=3,
                   bytes_down=1000, bytes_up=500)
    # client 0: 1500 B x 8 / 1000 / 1000 kbit/s = 0.012 s, plus 5 steps x 8 samples x 3 passes x 0.010 s = 1.2 s
    assert t.seconds[0] == pytest.approx(0.012 + 1.2) and t.seconds[1] == pytest.approx(0.024 + 2.4)
    assert t.kept == [0, 1] and t.steps == {0: 5, 1: 5} and t.sim_time == pytest.approx(2.424)


def test_a_deadline_drops_or_cuts_stragglers_and_overcommit_keeps_the_first_k():
    devices = Devices(np.array([1.0, 2.0, 4.0, 8.0]), np.full(4, 1e9))   # no communication time to speak of
    full = dict.fromkeys(range(4), 10)
    policy = Policy(deadline=0.5)
    # per step: 10 samples x 1 pass x ms / 1000 = 0.01, 0.02, 0.04, 0.08 s; 10 steps: 0.1, 0.2, 0.4, 0.8 s
    drop = plan_round(0, 1, np.arange(4), 4, devices, policy, full, samples_per_step=10, passes=1, bytes_down=0,
                      bytes_up=0)
    assert drop.kept == [0, 1, 2] and drop.stragglers == [3] and drop.sim_time == 0.5   # one cut: the deadline
    partial = plan_round(0, 1, np.arange(4), 4, devices, Policy(deadline=0.5, stragglers="partial"), full,
                         samples_per_step=10, passes=1, bytes_down=0, bytes_up=0)
    assert partial.kept == [0, 1, 2, 3] and partial.steps == {0: 10, 1: 10, 2: 10, 3: 6}
    over = plan_round(0, 1, np.arange(4), 2, devices, Policy(overcommit=2.0), full, samples_per_step=10, passes=1,
                      bytes_down=0, bytes_up=0)
    assert over.kept == [0, 1] and over.left_over == [2, 3] and over.sim_time == pytest.approx(0.2)


def test_dropouts_are_keyed_by_round_and_client_and_never_answer():
    devices = Devices(np.ones(1000), np.full(1000, 1e9))
    sampled = np.arange(0, 1000, 3)
    full = dict.fromkeys(sampled.tolist(), 1)
    a = plan_round(5, 2, sampled, len(sampled), devices, Policy(dropout=0.2, deadline=1.0), full, 1, 1, 0, 0)
    b = plan_round(5, 2, sampled[::-1], len(sampled), devices, Policy(dropout=0.2, deadline=1.0), full, 1, 1, 0, 0)
    assert a.dropped == b.dropped and 0.15 < len(a.dropped) / len(sampled) < 0.25
    assert not set(a.dropped) & set(a.kept) and all(math.isinf(a.seconds[c]) for c in a.dropped)
    assert a.sim_time == 1.0        # fewer than k answered: the server waited until the deadline


def test_drawn_devices_are_log_normal_around_their_medians_and_keyed_by_client():
    d = Devices.drawn(20_000, 1, 5.0, 0.5, 1000.0, 0.0)
    assert np.median(d.ms_per_sample) == pytest.approx(5.0, rel=0.05) and np.all(d.kbit_per_s == 1000.0)
    assert np.std(np.log(d.ms_per_sample)) == pytest.approx(0.5, rel=0.05)
    assert np.array_equal(Devices.drawn(20_000, 1, 5.0, 0.5, 1000.0, 0.0).ms_per_sample, d.ms_per_sample)


def test_availability_on_off_periods_and_a_trace():
    on_off = Availability(10_000, 3, on=30.0, off=70.0)
    share = [on_off.mask(t).mean() for t in (0.0, 12.5, 55.0, 1e6)]
    assert all(abs(s - 0.3) < 0.03 for s in share)
    trace = AvailabilityTrace(np.array([100.0, 10.0]), (np.array([[0.0, 20.0]]), np.array([[5.0, 6.0], [8.0, 9.0]])))
    rows = trace_rows(4, 2, "modulo", 0)
    avail = Availability(4, 0, trace=trace, rows=rows)
    assert avail.mask(5.5).tolist() == [True, True, True, True]
    assert avail.mask(7.0).tolist() == [True, False, True, False]
    assert avail.mask(130.0).tolist() == [False, False, False, False]    # 130 mod 100 = 30; 130 mod 10 = 0
    assert sorted(trace_rows(6, 3, "permutation", 4).tolist()) == [0, 0, 1, 1, 2, 2]
