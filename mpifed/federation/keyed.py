"""Random draws keyed by what they are about, never by the order they are made in: a draw for
(run seed, stream, server round, client id) is the same on every rank, in any rank count, and
after a resume, whatever else was drawn before it.

Each draw is SplitMix64 (Steele et al., 2014) over the key's words, mixed in order: a few
integer operations per value, vectorised over client ids, so a round of a million clients costs
milliseconds and no generator state is kept or checkpointed.
"""
from __future__ import annotations

import numpy as np

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_TWO53 = float(2 ** 53)


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def bits(seed: int, stream: int, server_round: int, ids: np.ndarray | int) -> np.ndarray:
    """64 random bits per id, a pure function of (seed, stream, server_round, id)."""
    with np.errstate(over="ignore"):
        h = _mix(np.uint64(seed % 2 ** 64) + _GAMMA)
        for word in (stream, server_round):
            h = _mix(h ^ (np.uint64(word % 2 ** 64) + _GAMMA))
        return _mix(h ^ (np.asarray(ids, dtype=np.int64).astype(np.uint64) + _GAMMA))


def uniform(seed: int, stream: int, server_round: int, ids: np.ndarray | int) -> np.ndarray:
    """Uniform in [0, 1) per id (53 bits)."""
    return (bits(seed, stream, server_round, ids) >> np.uint64(11)).astype(np.float64) / _TWO53


def normal(seed: int, stream: int, server_round: int, ids: np.ndarray | int) -> np.ndarray:
    """Standard normal per id (Box-Muller over two keyed uniforms)."""
    u1 = 1.0 - uniform(seed, stream, server_round, ids)          # (0, 1]: its log is finite
    u2 = uniform(seed, stream ^ 0x5A5A5A5A, server_round, ids)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def generator(seed: int, stream: int, server_round: int) -> np.random.Generator:
    """A generator for one (seed, stream, round): for draws over a whole set (a selection's sample)."""
    return np.random.default_rng([seed % 2 ** 64, stream, server_round])
