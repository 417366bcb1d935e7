"""The server's plan for one round: which clients train, on which worker, at which rate."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

SAMPLING = 0xC11E     # the stream of each round's client sampling draw

@dataclass
class RoundPlan:
    """Broadcast to every worker at the start of a round (a small pickled object)."""

    round: int                  # 0-based (the logs number it: number)
    lr: float
    assignment: list[list[int]] = field(default_factory=list)   # client ids per worker
    evaluate: bool = False
    checkpoint: bool = False    # the server writes a checkpoint after this round (workers first flush client state)
    stop: bool = False
    resume_rounds: tuple[int, ...] = ()   # the rounds a resume could start at (client-state versions they need stay)
    # (client, from worker, to worker): client state to move
    moves: list[tuple[int, int, int]] = field(default_factory=list)
    model_held: bool = False    # every rank holds the global model already (the evaluation or probe before sent it)
    last_trained: dict[int, int] = field(default_factory=dict)  # assigned client -> the round it last trained in
                                                                 # (methods with client state; absent: never)
    steps: dict[int, int] = field(default_factory=dict)   # client -> its local step limit (system:; absent: the
                                                          # full local work)
    seed_key: int | None = None   # keys the clients' training seeds in place of the round (an asynchronous
                                  # client's dispatch sequence number: aggregation fedbuff, fedasync)

    @property
    def number(self) -> int:
        """The round as logs, metrics and messages number it: 1 for the first."""
        return self.round + 1


def clients_per_round(num_clients: int, participation: float) -> int:
    return max(1, int(round(participation * num_clients)))


def sample_clients(seed: int, rnd: int, num_clients: int, participation: float) -> np.ndarray:
    """The clients of round ``rnd``: a seeded draw that depends only on (seed, round), not on ranks."""
    m = clients_per_round(num_clients, participation)
    if m >= num_clients:
        return np.arange(num_clients)
    rng = np.random.default_rng([seed, SAMPLING, rnd])
    return np.sort(rng.choice(num_clients, size=m, replace=False))


def assign_clients(clients: np.ndarray, sizes: np.ndarray, workers: int) -> list[list[int]]:
    """Split clients over workers balancing their sample counts (largest first to the least loaded)."""
    load = np.zeros(workers, dtype=np.int64)
    out: list[list[int]] = [[] for _ in range(workers)]
    for cid in sorted((int(c) for c in clients), key=lambda c: (-int(sizes[c]), c)):
        w = int(np.argmin(load))
        out[w].append(cid)
        load[w] += int(sizes[cid])
    return [sorted(a) for a in out]


def state_moves(assignment: list[list[int]], holders: dict[int, int]) -> list[tuple[int, int, int]]:
    """(client, holder, new worker) for each assigned client whose state another worker holds."""
    return [(cid, holders[cid], w) for w, clients in enumerate(assignment) for cid in clients
            if cid in holders and holders[cid] != w]


def client_seed(seed: int, rnd: int, cid: int) -> int:
    """Seed of one client's local training in one round (same on whichever worker trains it)."""
    return int(np.random.SeedSequence([seed, rnd, cid, 0x7EA1]).generate_state(1, dtype=np.uint64)[0] >> 1)
