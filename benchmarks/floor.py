"""The floor: W1's local training and evaluation with no framework, in 1 and in 2 processes.

    python benchmarks/floor.py [--rounds 5] [--config configs/bench/w1.yaml]

The same clients (mpifed's prepared shards of the config), the same network, batch size,
epochs and optimiser (torch.optim.SGD), and a full test evaluation each round; but every
client's data pre-decoded and pre-normalised as float tensors, a tight loop, no
communication and no aggregation beyond averaging the weights in place; evaluation as
mpifed does it (a channels-last copy in inference mode: oneDNN's faster CPU path). ``1 process``
uses all cores' threads; ``2 processes`` split the clients as mpifed assigns them to 2
workers (and the test set in halves), one thread each, in lock-step rounds. Prints the
per-round medians.
"""
from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO  # noqa: E402


def load(config: str, extra: list[str]):
    from mpifed.settings import config as cfgmod
    from mpifed.preparation.build import ensure_prepared
    from mpifed.data.shards import read_client, read_shard
    cfg, _ = cfgmod.load([config], extra)
    m = ensure_prepared(cfg, log=lambda s: None)
    mean = torch.tensor(m.mean).view(1, -1, 1, 1)
    std = torch.tensor(m.std).view(1, -1, 1, 1)

    def decode(images):
        return ((torch.from_numpy(images).float() / 255.0) - mean) / std

    clients = []
    for k in range(m.num_clients):
        s = read_client(m.client_block(k), k)
        clients.append((decode(s.images), torch.from_numpy(s.labels)))
    t = read_shard(m.test_path)
    return cfg, m, clients, (decode(t.images), torch.from_numpy(t.labels))


def model_for(cfg, m):
    from mpifed.models import build_model
    torch.manual_seed(0)
    return build_model(cfg.model.name, cfg.model.options, m.image_shape, m.num_classes)


def local_round(model, global_state, data, cfg):
    """Train each client from the global weights; return the sample-weighted average state."""
    avg = None
    total = 0
    for x, y in data:
        model.load_state_dict(global_state)
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=cfg.train.momentum,
                              weight_decay=cfg.train.weight_decay)
        for _ in range(cfg.train.local_epochs):
            perm = torch.randperm(len(y))
            for i in range(0, len(y), cfg.train.batch_size):
                idx = perm[i:i + cfg.train.batch_size]
                loss = F.cross_entropy(model(x[idx]), y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        n = len(y)
        state = {k: v.detach().clone() * n for k, v in model.state_dict().items()}
        avg = state if avg is None else {k: avg[k] + state[k] for k in avg}
        total += n
    return {k: v / total for k, v in avg.items()}, total


def evaluate(model, x, y, batch):
    """As mpifed evaluates: a channels-last copy of the network, in inference mode."""
    net = copy.deepcopy(model).eval().to(memory_format=torch.channels_last)
    correct = 0
    with torch.inference_mode():
        for i in range(0, len(y), batch):
            guess = net(x[i:i + batch].contiguous(memory_format=torch.channels_last)).argmax(1)
            correct += int((guess == y[i:i + batch]).sum())
    return correct


def one_process(config, extra, rounds, threads, out):
    torch.set_num_threads(threads)
    cfg, m, clients, (tx, ty) = load(config, extra)
    model = model_for(cfg, m)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        state, _ = local_round(model, state, clients, cfg)
        model.load_state_dict(state)
        evaluate(model, tx, ty, cfg.train.eval_batch_size)
        times.append(time.perf_counter() - t0)
    out.put(times)


def worker(rank, config, extra, rounds, barrier, out):
    torch.set_num_threads(1)
    from mpifed.round.plan import assign_clients
    cfg, m, clients, (tx, ty) = load(config, extra)
    mine = assign_clients(np.arange(m.num_clients), m.client_sizes, 2)[rank]
    half = len(ty) // 2
    tx, ty = (tx[:half], ty[:half]) if rank == 0 else (tx[half:], ty[half:])
    model = model_for(cfg, m)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    times = []
    for _ in range(rounds):
        barrier.wait()
        t0 = time.perf_counter()
        state, _ = local_round(model, state, [clients[k] for k in mine], cfg)
        model.load_state_dict(state)
        evaluate(model, tx, ty, cfg.train.eval_batch_size)
        times.append(time.perf_counter() - t0)
        barrier.wait()
    out.put((rank, times))


def floor(config: str, extra: list[str], rounds: int, processes: int) -> list[float]:
    """Per-round seconds of the floor with 1 or 2 processes (max over processes per round)."""
    load(config, extra)  # prepare once, before timing
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    if processes == 1:
        p = ctx.Process(target=one_process, args=(config, extra, rounds, os.cpu_count() or 1, out))
        p.start()
        times = out.get()
        p.join()
        return times
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=worker, args=(r, config, extra, rounds, barrier, out)) for r in range(2)]
    for p in procs:
        p.start()
    per_rank = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    return [max(a, b) for a, b in zip(per_rank[0], per_rank[1])]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(REPO / "configs" / "bench" / "w1.yaml"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--set", nargs="+", default=[])
    a = p.parse_args()
    for n in (1, 2):
        times = floor(a.config, a.set, a.rounds, n)
        print(f"floor, {n} process{'es' if n > 1 else ''}: median {statistics.median(times[1:] or times):.3f} s per "
              f"round (rounds: {', '.join(f'{t:.2f}' for t in times)})", flush=True)


if __name__ == "__main__":
    main()
