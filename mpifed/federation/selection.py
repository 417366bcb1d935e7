"""Client selection (``selection:``): which available clients a round samples.

A selector is a registry entry, as a method is (a plugin file can add one): an ``Options``
dataclass, and :meth:`Selector.select` (server round, the available clients, how many, a keyed
random generator, what the server knows of each client) returning client ids; it may learn from
each round's outcome (:meth:`Selector.observe`) and keeps what a resume needs in ``state``.
Selectors see simulated durations (the virtual clock's), never wall time, so a run selects the
same clients in the debug mode, under MPI and after a resume.

* ``uniform``: k of the available clients, equally likely (without the clock: today's draw,
  bit for bit);
* ``weighted``: k of them with probability proportional to their sample counts, without
  replacement;
* ``pow_d``: Power-of-Choice (Cho et al., AISTATS 2022): d candidates drawn in proportion to their
  sample counts, without replacement; each computes its loss on the current global model (the
  probe, a phase before the round's plan), and the k with the highest losses train;
* ``oort``: Oort (Lai et al., OSDI 2021) with FedScale's published defaults: exploitation by
  statistical utility (samples x the client's training loss; the paper's root mean square of
  per-sample losses is not recorded by mpifed, the mean is) plus a staleness bonus, scaled down by
  (T / t)^2 for a client slower than the pacer's preferred duration T; exploration of clients not
  tried yet (a share 0.9 decaying by 0.98 a round to 0.3), the pacer relaxing T by 5 percentile
  points when 20 rounds brought no more utility than the 20 before.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mpifed.plugin.options import NoOptions, opt
from mpifed.plugin.registry import SELECTORS

__all__ = ["SELECTORS", "Known", "Outcome", "Selector"]


@dataclass
class Known:
    """What the server knows of every client when it selects: sample counts and (with the clock)
    the simulated seconds its full local work would take."""

    sizes: np.ndarray
    expected_seconds: np.ndarray | None = None
    losses: dict[int, float] | None = None      # a probing selector's candidates: their loss on the global model


@dataclass
class Outcome:
    """One sampled client's round: whether it trained, its simulated seconds (inf: dropped out),
    its samples and training loss (None where it did not train)."""

    cid: int
    trained: bool
    seconds: float
    samples: int = 0
    train_loss: float | None = None


class Selector:
    """Uniform by default; ``state`` names the attributes a checkpoint keeps."""

    Options: ClassVar[type] = NoOptions
    state: ClassVar[tuple[str, ...]] = ()
    probes: ClassVar[bool] = False      # picks from candidates' losses on the global model (:meth:`candidates`)

    def __init__(self, options: Any) -> None:
        self.options = options

    def select(self, server_round: int, available: np.ndarray, k: int, rng: np.random.Generator,
               known: Known) -> np.ndarray:
        """The ids of k (at most ``len(available)``) of the ``available`` client ids, sorted."""
        raise NotImplementedError

    def candidates(self, server_round: int, available: np.ndarray, k: int, rng: np.random.Generator,
                   known: Known) -> np.ndarray:
        """A probing selector's candidates, sorted: the clients whose loss on the global model the round
        computes before :meth:`select` picks among them (``known.losses``)."""
        raise NotImplementedError(f"{type(self).__name__} sets probes but does not define candidates()")

    def observe(self, server_round: int, outcomes: list[Outcome]) -> None:
        """Learn from the round just trained (default: nothing)."""

    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.state}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        for name in self.state:
            setattr(self, name, saved[name])


@SELECTORS.register("uniform")
class Uniform(Selector):
    """k of the available clients, equally likely."""

    def select(self, server_round, available, k, rng, known):
        picked = rng.choice(len(available), size=min(k, len(available)), replace=False)
        return np.sort(available[picked])


@SELECTORS.register("weighted")
class Weighted(Selector):
    """k of the available clients, with probability proportional to their sample counts."""

    def select(self, server_round, available, k, rng, known):
        sizes = known.sizes[available].astype(np.float64)
        m = min(k, int(np.count_nonzero(sizes)))
        picked = rng.choice(len(available), size=m, replace=False, p=sizes / sizes.sum())
        return np.sort(available[picked])


@dataclass
class PowDOptions:
    d: int = opt(0, "candidates probed a round (0: twice the clients the round samples)", min=0)


@SELECTORS.register("pow_d")
class PowD(Selector):
    """Power-of-Choice (Cho et al., AISTATS 2022): the k highest local losses of d candidates."""

    Options = PowDOptions
    probes = True

    def candidates(self, server_round, available, k, rng, known):
        d = min(self.options.d or 2 * k, len(available))
        sizes = known.sizes[available].astype(np.float64)
        picked = rng.choice(len(available), size=min(d, int(np.count_nonzero(sizes))), replace=False,
                            p=sizes / sizes.sum())
        return np.sort(available[picked])

    def select(self, server_round, available, k, rng, known):
        losses = known.losses or {}
        ranked = sorted((int(c) for c in available), key=lambda c: (-losses.get(c, -math.inf), c))
        return np.sort(np.array(ranked[:k], dtype=np.int64))


@dataclass
class OortOptions:
    exploration: float = opt(0.9, "share of a round's clients explored (not tried yet) at the start", min=0, max=1)
    exploration_decay: float = opt(0.98, "the exploration share's factor per round", min=0, max=1)
    exploration_min: float = opt(0.3, "the exploration share's floor", min=0, max=1)
    pacer_step: int = opt(20, "rounds between the pacer's checks (W)", min=1)
    pacer_delta: float = opt(5.0, "percentile points the pacer moves the preferred duration by", min=0, max=100)
    round_threshold: float = opt(30.0, "the preferred duration T, as a percentile of the durations seen", min=0,
                                 max=100)
    round_penalty: float = opt(2.0, "alpha of the (T / t)^alpha penalty of a client slower than T", min=0)
    cut_off_util: float = opt(0.05, "candidates for exploitation: utility at least this share of the k-th's", min=0,
                              max=1)
    clip_bound: float = opt(0.9, "utilities above this quantile are clipped to it", min=0, max=1)
    sample_window: float = opt(5.0, "explored candidates: this many times the clients to explore, by size", min=1)


@SELECTORS.register("oort")
class Oort(Selector):
    """Oort (Lai et al., OSDI 2021): utility-guided exploitation, size-guided exploration, a pacer."""

    Options = OortOptions
    state = ("arms", "explore_share", "threshold", "exploit_history", "last_exploited")

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.arms: dict[int, list[float]] = {}    # client -> [utility, seconds, last round, times trained]
        self.explore_share = options.exploration
        self.threshold = options.round_threshold
        self.exploit_history: list[float] = []
        self.last_exploited: list[int] = []

    def select(self, server_round, available, k, rng, known):
        o = self.options
        self._pace(server_round)
        self.explore_share = max(self.explore_share * o.exploration_decay, o.exploration_min)
        preferred = self._preferred()
        tried = np.array(sorted(self.arms), dtype=np.int64)
        untried = available[~np.isin(available, tried)]
        tried = tried[np.isin(tried, available)]
        # exploitation takes the share exploration leaves, and what exploration cannot fill (too few untried)
        exploit = self._exploit(server_round, tried, k - min(int(k * self.explore_share), len(untried)), preferred,
                                rng)
        explore = self._explore(untried, k - len(exploit), preferred, rng, known)
        self.last_exploited = sorted(int(c) for c in exploit)
        return np.sort(np.concatenate([exploit, explore]).astype(np.int64))

    def observe(self, server_round, outcomes):
        for out in outcomes:
            arm = self.arms.setdefault(out.cid, [0.0, math.inf, float(server_round), 0.0])
            arm[1] = out.seconds
            arm[2] = float(server_round)
            if out.trained and out.train_loss is not None:
                arm[0] = out.samples * out.train_loss
                arm[3] += 1
        exploited = [self.arms[c][0] for c in self.last_exploited if c in self.arms]
        self.exploit_history.append(sum(exploited) / max(len(exploited), 1e-4))

    def _preferred(self) -> float:
        """The pacer's preferred duration T: a percentile of the durations seen (inf at the 100th)."""
        seen = sorted(a[1] for a in self.arms.values() if math.isfinite(a[1]))
        if self.threshold >= 100 or not seen:
            return math.inf
        return seen[min(int(len(seen) * self.threshold / 100), len(seen) - 1)]

    def _pace(self, server_round: int) -> None:
        """Relax T when the last W rounds' utility is flat against the W before; tighten it when it jumps."""
        w, history = self.options.pacer_step, self.exploit_history
        if server_round <= 2 * w or server_round % w or len(history) < 2 * w:
            return
        before, now = sum(history[-2 * w:-w]), sum(history[-w:])
        if abs(now - before) <= 0.1 * before:
            self.threshold = min(100.0, self.threshold + self.options.pacer_delta)
        elif abs(now - before) >= 5 * before:
            self.threshold = max(self.options.pacer_delta, self.threshold - self.options.pacer_delta)

    def _exploit(self, server_round: int, tried: np.ndarray, count: int, preferred: float,
                 rng: np.random.Generator) -> np.ndarray:
        count = min(count, len(tried))
        if count <= 0:
            return np.zeros(0, dtype=np.int64)
        o = self.options
        utility = np.array([self.arms[int(c)][0] for c in tried])
        clip = np.sort(utility)[min(int(len(utility) * o.clip_bound), len(utility) - 1)]
        utility = np.minimum(utility, clip)
        low, span = utility.min(), max(utility.max() - utility.min(), 1e-12)
        last = np.array([self.arms[int(c)][2] for c in tried])
        seconds = np.array([self.arms[int(c)][1] for c in tried])
        score = (utility - low) / span + np.sqrt(0.1 * math.log(max(server_round, 2)) / np.maximum(last, 1))
        slow = seconds > preferred
        score[slow] *= (preferred / np.maximum(seconds[slow], 1e-4)) ** o.round_penalty
        order = np.lexsort((tried, -score))            # highest score first, ties by id
        cut = score[order[min(count, len(order) - 1)]] * o.cut_off_util
        pool = np.array([i for n, i in enumerate(order) if score[i] >= cut or n <= 10 * count])
        return tried[rng.choice(pool, size=count, replace=False, p=_shares(score[pool], count))]

    def _explore(self, untried: np.ndarray, count: int, preferred: float, rng: np.random.Generator,
                 known: Known) -> np.ndarray:
        count = min(count, len(untried))
        if count <= 0:
            return np.zeros(0, dtype=np.int64)
        reward = known.sizes[untried].astype(np.float64)
        if known.expected_seconds is not None and math.isfinite(preferred):
            seconds = known.expected_seconds[untried]
            slow = seconds > preferred
            reward[slow] *= (preferred / np.maximum(seconds[slow], 1e-4)) ** self.options.round_penalty
        window = min(len(untried), int(self.options.sample_window * count))
        top = _largest(reward, untried, window)
        return untried[rng.choice(top, size=count, replace=False, p=_shares(reward[top], count))]


def _largest(values: np.ndarray, ids: np.ndarray, count: int) -> np.ndarray:
    """The positions of the ``count`` largest ``values``, largest first, ties by id: a full sort's first
    ``count``, sorting only the values at least the count-th largest (a million clients: milliseconds)."""
    if 0 < count < len(values):
        values_at_least = np.partition(values, len(values) - count)[len(values) - count]
        near = np.flatnonzero(values >= values_at_least)
        return near[np.lexsort((ids[near], -values[near]))][:count]
    return np.lexsort((ids, -values))[:count]


def _shares(weights: np.ndarray, count: int) -> np.ndarray | None:
    """Sampling probabilities from non-negative ``weights``; None (equal chances) where fewer than
    ``count`` of them are above zero."""
    w = np.maximum(weights, 0.0)
    return w / w.sum() if np.count_nonzero(w) >= count else None
