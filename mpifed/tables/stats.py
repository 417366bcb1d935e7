"""Paired comparisons of two methods over seeds: the mean difference, its 95% interval, wins, p.

Runs with the same seed share the partition, the initial model and the client sampling, so a
method's advantage is best measured seed by seed: d_s = method_s - reference_s. Over the n
seeds both have, :func:`paired` gives the mean of d, its two-sided 95% confidence interval
from Student's t with n - 1 degrees of freedom (mean ± t_{0.975, n-1} · sd / √n), the seeds
where the method is ahead, and the paired t-test's two-sided p-value. A claim that the method
differs from the reference is ``supported`` only when the interval excludes zero.

A table that tests several claims at once adjusts their p-values with :func:`holm` (Holm's
step-down method, which keeps the chance of any false claim in the family at most 5%).

Beside the t-interval, which leans on the differences being normal, the exact paired sign-flip
(permutation) test's two-sided p does not (:func:`sign_flip_p`: under "no difference" each d_s is
as likely -d_s, so the 2^n sign patterns are equally likely). With n seeds it cannot go below
2 / 2^n (:func:`smallest_sign_flip_p`): 0.0625 at n = 5, so five seeds support a claim only through
the t-test's normality; six are the fewest that can reach 0.05.

The percentile bootstrap interval of the mean difference (:func:`bootstrap_interval`) describes
how the mean moves over resamples of the seeds; it is not a test: at n = 5 a percentile bootstrap
covers well below 95% (about 83% on normal data), so it corroborates nothing at a few seeds.
"""
from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from scipy import stats as _scipy

LEVEL = 0.95
EXACT_UP_TO = 16          # seeds; beyond, the sign-flip p from random patterns
PATTERNS = 100_000        # random sign patterns beyond EXACT_UP_TO
BOOTSTRAP_EXACT_UP_TO = 7  # seeds; up to here every one of the n^n ordered resamples (823,543 at n = 7)
RESAMPLES = 10_000        # random bootstrap resamples beyond BOOTSTRAP_EXACT_UP_TO


@dataclass(frozen=True)
class Paired:
    """A paired comparison over ``n`` seeds (differences in the metric's unit)."""

    n: int
    mean: float
    low: float
    high: float
    wins: int          # seeds where the method is above the reference
    losses: int        # seeds where it is below
    p: float           # paired t-test, two-sided
    p_sign_flip: float = math.nan                  # paired sign-flip test, two-sided
    boot: tuple[float, float] = (math.nan, math.nan)   # percentile bootstrap 95% interval of the mean (a description)

    def distribution_free(self, digits: int = 2) -> str:
        """``sign-flip p = 0.062 (n = 5: never below 0.062); bootstrap range of the mean [+0.51, +1.90]``:
        the test, with its floor where n seeds cannot reach p < 0.05 whatever their values, then the
        bootstrap's description of the mean (not a test)."""
        f = f"{{:+.{digits}f}}"
        floor = smallest_sign_flip_p(self.n)
        never = f" (n = {self.n}: never below {floor:.3f})" if floor >= 0.05 else ""
        return (f"sign-flip p = {self.p_sign_flip:.3f}{never}; bootstrap range of the mean "
                f"[{f.format(self.boot[0])}, {f.format(self.boot[1])}]")

    @property
    def verdict(self) -> str:
        """``higher`` or ``lower`` when the 95% interval excludes zero, else ``inconclusive``."""
        if self.low > 0:
            return "higher"
        if self.high < 0:
            return "lower"
        return "inconclusive"

    def text(self, digits: int = 2, verdict: bool = True) -> str:
        """``+1.23 [+0.40, +2.06], 5/5 seeds, p = 0.012: higher`` (without ``: higher`` when not ``verdict``)."""
        f = f"{{:+.{digits}f}}"
        p = "p < 0.001" if self.p < 0.001 else f"p = {self.p:.3f}"
        return (f"{f.format(self.mean)} [{f.format(self.low)}, {f.format(self.high)}], {self.wins}/{self.n} seeds, "
                f"{p}" + (f": {self.verdict}" if verdict else ""))


def paired(method: dict[int, float], reference: dict[int, float]) -> Paired | None:
    """The comparison of ``method`` with ``reference`` (values by seed) over the seeds both have;
    None with fewer than two such seeds (no interval can be given)."""
    seeds = sorted(set(method) & set(reference))
    if len(seeds) < 2:
        return None
    d = [method[s] - reference[s] for s in seeds]
    n = len(d)
    mean = statistics.fmean(d)
    sd = statistics.stdev(d)
    if sd == 0:
        low = high = mean
        p = 1.0 if mean == 0 else 0.0
    else:
        half = float(_scipy.t.ppf(0.5 + LEVEL / 2, n - 1)) * sd / math.sqrt(n)
        low, high = mean - half, mean + half
        p = float(2 * _scipy.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))
    return Paired(n, mean, low, high, sum(x > 0 for x in d), sum(x < 0 for x in d), p, sign_flip_p(d),
                  bootstrap_interval(d))


def sign_flip_p(d: list[float]) -> float:
    """The two-sided p of the paired sign-flip test of the differences ``d``: up to
    :data:`EXACT_UP_TO` seeds, the share of all 2^n sign patterns whose mean is at least as far from
    0 as the observed one; beyond, (b + 1) / (m + 1) over m = :data:`PATTERNS` seeded random
    patterns of which b are as far (Phipson and Smyth, 2010: the observed pattern counts, so p is
    never 0)."""
    x = np.asarray(d, dtype=np.float64)
    observed = abs(x.mean())
    exact = len(x) <= EXACT_UP_TO
    if exact:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(x))))
    else:
        signs = np.random.default_rng(0).choice((1.0, -1.0), size=(PATTERNS, len(x)))
    far = int(np.sum(np.abs(signs @ x) / len(x) >= observed - 1e-12 * max(1.0, observed)))
    return far / len(signs) if exact else (far + 1) / (len(signs) + 1)


def smallest_sign_flip_p(n: int) -> float:
    """The smallest two-sided sign-flip p that ``n`` differences can give (all of one sign): 2 / 2^n."""
    return min(1.0, 2.0 / 2 ** n)


def bootstrap_interval(d: list[float], level: float = LEVEL) -> tuple[float, float]:
    """The percentile bootstrap range of the mean of ``d``: the (1 - level) / 2 and (1 + level) / 2
    quantiles of the resample means, each the smallest mean whose share of resamples at or below it
    reaches that level (the inverted-CDF rule). Up to :data:`BOOTSTRAP_EXACT_UP_TO` seeds every one
    of the n^n ordered resamples, equally weighted (3,125 at n = 5); beyond, :data:`RESAMPLES` seeded
    random ones. A description of the mean, not a test (see the module's docstring)."""
    x = np.asarray(d, dtype=np.float64)
    n = len(x)
    if n <= BOOTSTRAP_EXACT_UP_TO:
        picks = np.indices((n,) * n, dtype=np.int8).reshape(n, -1).T
    else:
        picks = np.random.default_rng(0).integers(0, n, size=(RESAMPLES, n))
    means = x[picks].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    return float(low), float(high)


def holm(ps: list[float]) -> list[float]:
    """Holm's adjusted p-values, in the order given: the i-th smallest p times (m - i + 1), made
    non-decreasing in that order and capped at 1 (m = len(ps), the whole family)."""
    m = len(ps)
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: ps[i])):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted
