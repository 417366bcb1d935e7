"""Paired comparisons of two methods over seeds: the mean difference, its 95% interval, wins, p.

Runs with the same seed share the partition, the initial model and the client sampling, so a
method's advantage is best measured seed by seed: d_s = method_s - reference_s. Over the n
seeds both have, :func:`paired` gives the mean of d, its two-sided 95% confidence interval
from Student's t with n - 1 degrees of freedom (mean ± t_{0.975, n-1} · sd / √n), the seeds
where the method is ahead, and the paired t-test's two-sided p-value. A claim that the method
differs from the reference is ``supported`` only when the interval excludes zero.

A table that tests several claims at once adjusts their p-values with :func:`holm` (Holm's
step-down method, which keeps the chance of any false claim in the family at most 5%).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy import stats as _scipy

LEVEL = 0.95


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
    return Paired(n, mean, low, high, sum(x > 0 for x in d), sum(x < 0 for x in d), p)


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
