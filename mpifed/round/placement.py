"""Where each rank runs: its device and its number of torch threads.

Workers on a node are numbered 0, 1, ... among themselves (from an MPI shared-memory
split, so the server does not take a GPU slot); worker ``i`` gets ``cuda:(i % gpus)``
of the GPUs visible to it (``CUDA_VISIBLE_DEVICES`` is respected by torch). Several
workers per GPU happen naturally when workers outnumber GPUs.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any


class PlacementError(ValueError):
    """A device setting the node cannot satisfy (no GPU for ``cuda``)."""


@dataclass(frozen=True)
class NodeSlot:
    host: str
    ranks_on_node: int
    worker_index: int      # among the workers on this node (-1 for the server)


def node_slot(world_comm: Any, is_server: bool) -> NodeSlot:
    """This rank's place on its node (a single process is alone on its node)."""
    host = socket.gethostname()
    if world_comm is None:
        return NodeSlot(host, 1, 0)
    from mpi4py import MPI
    node = world_comm.Split_type(MPI.COMM_TYPE_SHARED, key=world_comm.Get_rank())
    roles = node.allgather(is_server)
    mine = node.Get_rank()
    node.Free()
    workers_before = sum(1 for r in roles[:mine] if not r)
    return NodeSlot(host, len(roles), -1 if is_server else workers_before)


def choose_device(is_server: bool, worker_index: int, device: str, server_device: str, gpu_count: int) -> str:
    """The torch device string for a rank (``gpu_count`` GPUs visible on its node)."""
    if is_server:
        if server_device == "cuda":
            if gpu_count == 0:
                raise PlacementError("resources.server_device=cuda but no GPU is visible on the server's node "
                                     "(check CUDA_VISIBLE_DEVICES and the job's GPU request), or set "
                                     "resources.server_device=cpu")
            return "cuda:0"
        return "cpu"
    if device == "cpu" or (device == "auto" and gpu_count == 0):
        return "cpu"
    if gpu_count == 0:
        raise PlacementError("resources.device=cuda but no GPU is visible on this node (check CUDA_VISIBLE_DEVICES "
                             "and the job's GPU request), or set resources.device=auto (the CPU where there is no GPU)")
    return f"cuda:{max(worker_index, 0) % gpu_count}"


def choose_threads(setting: int, ranks_on_node: int, cores: int | None = None) -> int:
    """Torch threads per rank: the setting, or the cores this rank may use shared out among
    the node's ranks (so that ranks x threads does not exceed the cores)."""
    if setting > 0:
        return setting
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, ranks_on_node))


def set_deterministic(enabled: bool) -> None:
    """Turn torch's deterministic algorithms on or off, touching torch only on a change.

    ``torch.use_deterministic_algorithms`` imports the compiler stack (torch._inductor) on
    every call, which costs each rank about 1.5 s and 170 MB; torch's default is off, so a
    run that keeps it off never pays that.
    """
    import torch

    if torch.are_deterministic_algorithms_enabled() != enabled:
        torch.use_deterministic_algorithms(enabled)
