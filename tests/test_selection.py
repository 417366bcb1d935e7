"""Client selection (mpifed.federation.selection): uniform reproduces today's draw, weighted follows
the sizes, Oort exploits utility, penalises slow clients, explores by size and resumes exactly."""
import math

import numpy as np
import pytest

from mpifed.federation.selection import SELECTORS, Known, Outcome
from mpifed.round.plan import sample_clients


def make(name, **options):
    cls = SELECTORS.get(name)
    return cls(cls.Options(**options))


def rng(seed, server_round):
    return np.random.default_rng([seed, 0xC11E, server_round])


def test_uniform_over_every_client_is_todays_draw():
    known = Known(np.ones(1000, dtype=np.int64))
    for rnd in range(3):
        assert np.array_equal(make("uniform").select(rnd + 1, np.arange(1000), 100, rng(4, rnd), known),
                              sample_clients(4, rnd, 1000, 0.1))
    assert make("uniform").select(1, np.array([3, 9]), 5, rng(0, 0), known).tolist() == [3, 9]   # fewer available


def test_weighted_follows_the_sample_counts():
    sizes = np.array([1] * 90 + [100] * 10)
    picks = np.concatenate([make("weighted").select(1, np.arange(100), 5, rng(0, r), Known(sizes))
                            for r in range(200)])
    assert np.mean(picks >= 90) > 0.8          # the 10 large clients hold 92% of the samples


def _round(oort, server_round, known, k=10, utility=None, seconds=None):
    picked = oort.select(server_round, np.arange(len(known.sizes)), k, rng(0, server_round), known)
    oort.observe(server_round, [Outcome(int(c), True, seconds(c) if seconds else 1.0, int(known.sizes[c]),
                                        utility(c) if utility else 1.0) for c in picked])
    return picked


def _exploited(oort, known, rounds=80, **how):
    """The clients Oort exploited over the second half of ``rounds`` rounds."""
    found = []
    for r in range(1, rounds):
        _round(oort, r, known, **how)
        if r > rounds // 2:
            found += oort.last_exploited
    return np.array(found)


def test_oort_exploits_the_clients_of_high_utility_and_penalises_slow_ones():
    known = Known(np.full(200, 10))
    useful = lambda c: 5.0 if c < 20 else 0.1          # noqa: E731 (clients 0..19 are worth training: 10%)
    oort = make("oort")
    exploited = _exploited(oort, known, utility=useful)
    assert oort.explore_share == pytest.approx(0.3) and np.mean(exploited < 20) > 0.3
    exploited = _exploited(make("oort", round_threshold=50.0), known, utility=useful,
                           seconds=lambda c: 100.0 if c < 10 else 1.0)
    assert np.mean(exploited < 10) < 0.02 < np.mean((exploited >= 10) & (exploited < 20))   # fast and useful win


def test_oort_explores_untried_clients_by_size_first():
    sizes = np.array([1] * 100 + [1000] * 10)
    first = make("oort").select(1, np.arange(110), 10, rng(0, 1), Known(sizes))
    assert np.mean(first >= 100) > 0.5


def test_oorts_state_is_what_a_resume_continues_from():
    known = Known(np.arange(1, 101))
    whole, cut = make("oort"), make("oort")
    for r in range(1, 30):
        _round(whole, r, known, utility=lambda c: math.sin(c) + 2)
        _round(cut, r, known, utility=lambda c: math.sin(c) + 2)
    resumed = make("oort")
    resumed.load_state_dict({k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                             for k, v in cut.state_dict().items()})
    for r in range(30, 40):
        assert np.array_equal(_round(whole, r, known), _round(resumed, r, known))
