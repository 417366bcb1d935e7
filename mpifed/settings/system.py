"""The ``system:`` config section: the simulated federation's devices, availability and round policy
(the virtual clock of :mod:`mpifed.federation.clock`), and heterogeneous local work.

Off by default: without it every sampled client trains its full local work at no simulated cost,
and a run's numbers are those of a run without the section.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mpifed.plugin.options import opt


@dataclass
class SystemConfig:
    clock: bool = opt(False, "simulate each client's round time (compute and communication, never measured) and plan "
                             "the round with it on the server before it trains (docs/federations.md)")
    speed_ms: float = opt(10.0, "clock: the median client's compute time in ms per sample of one forward pass "
                                "(a forward and backward pass counts 3; without system.device_trace)",
                          min=0, exclusive_min=True)
    speed_sigma: float = opt(0.0, "clock: log-normal spread of the clients' speeds around speed_ms (0: all alike)",
                             min=0)
    bandwidth: float = opt(10000.0, "clock: the median client's bandwidth in kbit/s, for the method's declared "
                                    "downlink and uplink (without system.device_trace)", min=0, exclusive_min=True)
    bandwidth_sigma: float = opt(0.0, "clock: log-normal spread of the clients' bandwidths (0: all alike)", min=0)
    device_trace: str | None = opt(None, "clock: FedScale client_device_capacity pickle or its CSV form "
                                         "(client_id,computation,communication): each client's ms per sample and "
                                         "kbit/s, instead of speed_ms and bandwidth")
    availability_trace: str | None = opt(None, "clock: FedScale client_behave_trace pickle or its CSV form "
                                               "(client_id,finish_time,active,inactive): when each client can be "
                                               "sampled, instead of system.availability")
    trace_mapping: Literal["modulo", "permutation"] = opt("modulo", "which trace row a client takes: its id modulo "
                                                                    "the rows, or a permutation of the rows drawn "
                                                                    "from run.seed")
    availability: Literal["always", "on-off"] = opt("always", "clock, without an availability trace: every client "
                                                              "always available, or each on for on_period and off for "
                                                              "off_period simulated seconds (its own phase)")
    on_period: float = opt(3600.0, "availability on-off: simulated seconds a client is available", min=0,
                           exclusive_min=True)
    off_period: float = opt(3600.0, "availability on-off: simulated seconds a client is away", min=0,
                            exclusive_min=True)
    dropout: float = opt(0.0, "clock: probability that a sampled client never answers in a round", min=0, max=1)
    deadline: float = opt(0.0, "clock: a round's deadline in simulated seconds (0: none)", min=0)
    overcommit: float = opt(1.0, "clock: sample this many times the round's clients and keep the first to finish "
                                 "(FedScale: 1.3)", min=1)
    stragglers: Literal["drop", "partial"] = opt("drop", "clock: a client that would end after the deadline is left "
                                                         "out (drop) or kept with the local steps it finished by then "
                                                         "(partial)")
    local_work: Literal["fixed", "uniform", "straggler"] = opt(
        "fixed", "each client's local steps in a round: the full local work (fixed); a number drawn uniformly "
                 "from 1 to the full steps (uniform); or for a straggler_share of the round's clients a draw from 1 "
                 "to one below the full steps, the rest the full work (straggler)")
    straggler_share: float = opt(0.5, "local_work straggler: the share of a round's clients that do less", min=0,
                                 max=1)
    time_budget: float = opt(0.0, "clock: end the run with the first round (or asynchronous server step) that "
                                  "brings the simulated clock to this many seconds, evaluating it (0: none; "
                                  "train.rounds stays the most rounds)", min=0, math=False)

    @property
    def simulated(self) -> bool:
        """Whether the round's plan differs from today's: the clock, or heterogeneous local work."""
        return self.clock or self.local_work != "fixed"

    def check(self) -> list[str]:
        errors = []
        if not self.clock:
            needs = [f"{key} ({value})" for key, value, off in (
                ("device_trace", self.device_trace, None), ("availability_trace", self.availability_trace, None),
                ("availability", self.availability, "always"), ("dropout", self.dropout, 0.0),
                ("deadline", self.deadline, 0.0), ("overcommit", self.overcommit, 1.0),
                ("time_budget", self.time_budget, 0.0)) if value != off]
            if needs:
                errors.append(f"clock: {', '.join(needs)} act(s) on the simulated clock, which is off; set "
                              f"system.clock=true, or leave them at their defaults")
        if self.availability_trace and self.availability != "always":
            errors.append("availability: an availability_trace says when each client is available; leave "
                          "system.availability at always, or drop the trace")
        return errors
