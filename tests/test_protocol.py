"""The round protocol: what a method declares is what travels."""
import contextlib
import time

import numpy as np
import pytest
import torch

from conftest import run_mpi, run_plugin, tiny
from mpifed.algorithms.base import Messages, summed
from mpifed.comm.collectives import Comm
from mpifed.round.plan import RoundPlan
from mpifed.round.protocol import RoundProtocol, Trained, build_layouts

BROKEN = '''
from mpifed.algorithms.base import Algorithm, Client, Server, per_client
from mpifed.registry import ALGORITHMS


class ForgetfulServer(Server):
    def downlink(self, server_round, weights):
        return {} if "SIDE" == "server" else {"hint": weights[:2]}


class ForgetfulClient(Client):
    def uplink(self, ctx):
        up = super().uplink(ctx)
        return up                                     # never adds the declared "head" row


@ALGORITHMS.register("forgetful_SIDE")
class Forgetful(Algorithm):
    Server = ForgetfulServer
    Client = ForgetfulClient

    def messages(self):
        return super().messages().extend(down={"hint": (2,)}, up={"head": per_client(3)})
'''


@pytest.mark.e2e
@pytest.mark.parametrize("side,message", [("server", "downlink: missing ['hint']"),
                                          ("client", "ForgetfulClient.uplink (client 0, round 1) returned ['model', "
                                                     "'weight']")])
def test_a_declared_entry_not_sent_is_an_error(tmp_path, side, message):
    p = run_plugin(tmp_path, BROKEN.replace("SIDE", side), f"forgetful_{side}")
    assert p.returncode != 0 and message in p.stderr


@pytest.mark.mpi
@pytest.mark.e2e
def test_a_declared_entry_not_sent_fails_fast_under_mpi(has_mpirun, tmp_path):
    plugin = tmp_path / "forgetful_client.py"
    plugin.write_text(BROKEN.replace("SIDE", "client"))
    start = time.time()
    p = run_mpi(3, tiny(tmp_path, "algorithm.name=forgetful_client", "comm.timeout_s=600") + ["--plugin", str(plugin)],
                check=False, timeout=120)
    assert p.returncode != 0 and time.time() - start < 60, "a missing entry must end the job, not hang it"
    assert "ForgetfulClient.uplink (client" in p.stderr
    assert "returned ['model', 'weight']" in p.stderr and "'head'" in p.stderr


class RecordingComm(Comm):
    """The single-process group, recording what each buffer broadcast carries."""

    def __init__(self) -> None:
        super().__init__()
        self.broadcasts: list[tuple[str, int]] = []

    def bcast_buffer(self, buf, *, what, root=0):
        self.broadcasts.append((what, buf.nbytes))


class CountingServer:
    """A server side whose global model is the round number (aggregation adds one); with
    ``reports_other`` it evaluates another model (as FedDyn's clients_mean does)."""

    def __init__(self, rounds, evaluate, down, reports_other=False):
        self.rounds, self.evaluate, self.down, self.reports_other = rounds, evaluate, down, reports_other
        self.rnd, self.model, self.sent = 0, torch.zeros(4), False

    def method_hooks(self, plan):
        return contextlib.nullcontext()

    def plan(self):
        if self.rnd == self.rounds:
            return RoundPlan(round=self.rnd, lr=0.0, stop=True)
        return RoundPlan(round=self.rnd, lr=0.1, assignment=[[0]], evaluate=self.evaluate[self.rnd],
                         model_held=self.sent)

    def downlink(self, plan):
        return ({"weights": self.model, "ints": torch.zeros(1, dtype=torch.int64)},
                {"hint": self.model[:3] * 10} if self.down else {})

    def aggregate(self, plan, replies, model_sums):
        self.model, self.sent = self.model + 1, False

    def evaluation_state(self):
        self.sent = not self.reports_other
        return {"weights": -self.model if self.reports_other else self.model,
                "ints": torch.zeros(1, dtype=torch.int64)}

    def evaluated(self, plan, totals):
        pass

    def end_round(self, plan, times, stops):
        self.rnd += 1

    def stopped(self, usage):
        pass


class ReceivingWorker:
    index = 0
    failure = None

    def __init__(self, layouts):
        self.layouts = layouts
        self.received = []

    def start_round(self, plan, down):
        self.received.append((down.weights.clone(), {k: v.clone() for k, v in down}))

    def train(self, plan):
        return Trained(self.layouts.uplink_buffer(), np.zeros(0, np.uint8), [])

    def flush_states(self, resume_rounds):
        pass

    def evaluate(self, weights, ints):
        return self.layouts.evaluation.empty()


@pytest.mark.parametrize("down", [True, False])
def test_after_an_evaluated_round_the_downlink_does_not_send_the_model_again(down):
    """The evaluation broadcasts the aggregated model; the next round's downlink then carries only
    the method's tensors, and every worker still trains from the right model."""
    messages = Messages(down={"hint": (3,)} if down else {}, up={"model": summed(4), "weight": summed(1)})
    layouts = build_layouts(messages, 4, 1, 10, 5, 2, 0)
    evaluate = [True, False, True, True]
    server, worker, comm = CountingServer(4, evaluate, down), ReceivingWorker(layouts), RecordingComm()
    RoundProtocol(layouts, comm, Comm(), server, worker, 1).run()

    model, tail = layouts.model.nbytes, layouts.down.nbytes
    full, rest = [("downlink: broadcast", model + tail)], [("downlink: broadcast", tail)] if down else []
    evaluation = [("evaluation: broadcast of the global model", model)]
    assert comm.broadcasts == full + evaluation + rest + full + evaluation + rest + evaluation
    for rnd, (weights, extra) in enumerate(worker.received):
        assert torch.equal(weights, torch.full((4,), float(rnd)))
        if down:
            assert torch.equal(extra["hint"], torch.full((3,), 10.0 * rnd))


def test_when_the_evaluation_sends_another_model_the_downlink_sends_the_global_one():
    """A method that evaluates another model than the global one (FedDyn's clients_mean): the
    next round's downlink sends the global model, and the workers train from it."""
    messages = Messages(up={"model": summed(4), "weight": summed(1)})
    layouts = build_layouts(messages, 4, 1, 10, 5, 2, 0)
    server = CountingServer(3, [True, True, True], False, reports_other=True)
    worker, comm = ReceivingWorker(layouts), RecordingComm()
    RoundProtocol(layouts, comm, Comm(), server, worker, 1).run()

    full = [("downlink: broadcast", layouts.model.nbytes + layouts.down.nbytes)]
    evaluation = [("evaluation: broadcast of the global model", layouts.model.nbytes)]
    assert comm.broadcasts == (full + evaluation) * 3
    assert len(worker.received) == 3
    for rnd, (weights, _) in enumerate(worker.received):
        assert torch.equal(weights, torch.full((4,), float(rnd)))
