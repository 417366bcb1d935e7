"""An asynchronous run's server from its config (``aggregation: fedbuff`` or ``fedasync``): the event
queue on the virtual clock of the run's :class:`~mpifed.round.timeline.Timeline`, the rule, the bound on
the versions kept."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mpifed.federation.async_rules import AGGREGATIONS
from mpifed.federation.async_server import AsyncServer
from mpifed.federation.events import EventQueue
from mpifed.settings.config import Config

if TYPE_CHECKING:
    from mpifed.round.timeline import Timeline


def asynchronous(cfg: Config) -> bool:
    """Whether the config's aggregation is an asynchronous server's."""
    return AGGREGATIONS.get(cfg.aggregation.name).asynchronous


def make_async_server(cfg: Config, timeline: Timeline, floats: torch.Tensor,
                      down: dict[str, torch.Tensor]) -> AsyncServer:
    """The asynchronous server of ``cfg`` from the global float state ``floats`` (version 0) and the method's
    down tensors made for it, ``down``: each client's duration the clock's for its full local work,
    availability and dropout the clock's."""
    options = cfg.aggregation.options
    seconds = timeline.known.expected_seconds
    availability = timeline.availability
    queue = EventQueue(cfg.run.seed, timeline.num_clients, options.concurrency, lambda cid: float(seconds[cid]),
                       None if availability is None or availability.always else availability.mask,
                       cfg.system.dropout, options.idle_wait)
    rule = AGGREGATIONS.get(cfg.aggregation.name)(options)
    return AsyncServer(rule, queue, floats, options.max_staleness, down)
