"""The round protocol and the client-state store: what a method declares is what travels."""
import time

import numpy as np
import pytest
import torch

from conftest import run_mpi, run_plugin, tiny
from mpifed.algorithms.base import Messages, summed
from mpifed.round.client_state import ClientStates, discard_from
from mpifed.comm.collectives import Comm
from mpifed.round.plan import RoundPlan
from mpifed.round.protocol import Layout, RoundProtocol, Trained, build_layouts

BROKEN = '''
from mpifed.algorithms.base import Algorithm, Client, Server, per_client
from mpifed.registry import ALGORITHMS


class ForgetfulServer(Server):
    def downlink(self, rnd, weights):
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


def state_layout():
    return Layout("client state", {"w": ((4,), np.float32), "flag": ((1,), np.float32)})


def state(v):
    return {"w": torch.full((4,), float(v)), "flag": torch.ones(1)}


def versions(root, cid):
    return sorted(p.name for p in (root / str(cid)).iterdir()) if (root / str(cid)).is_dir() else []


def test_states_stay_in_memory_within_the_budget_and_reach_disk_at_flush(tmp_path):
    store = ClientStates(tmp_path, state_layout(), budget_mb=1)
    for cid in range(3):
        store.put(cid, 0, state(cid), keep_from=1)
    assert not tmp_path.exists() or not any(tmp_path.iterdir()), "no disk write per client per round"
    assert store.get(2, 0)["w"].tolist() == [2.0] * 4 and store.get(7, None) is None
    store.flush(keep_from=1)
    assert [versions(tmp_path, c) for c in range(3)] == [["r0.bin"]] * 3
    fresh = ClientStates(tmp_path, state_layout(), budget_mb=1)     # a resumed worker reads them back
    assert fresh.get(1, 0)["w"].tolist() == [1.0] * 4


def test_states_beyond_the_budget_spill_to_disk(tmp_path):
    store = ClientStates(tmp_path, state_layout(), budget_mb=0)
    store.put(5, 3, state(9), keep_from=4)
    assert versions(tmp_path, 5) == ["r3.bin"]
    assert store.get(5, 3)["w"].tolist() == [9.0] * 4


def test_a_state_moves_between_workers_with_its_round(tmp_path):
    a = ClientStates(tmp_path, state_layout(), budget_mb=1)
    b = ClientStates(tmp_path, state_layout(), budget_mb=1)
    a.put(3, 2, state(7), keep_from=3)
    message = a.export(3, 2)
    assert 3 not in a._memory                 # handed over, not copied
    b.adopt(3, message)
    assert b.get(3, 2)["w"].tolist() == [7.0] * 4
    b.flush(keep_from=3)
    assert versions(tmp_path, 3) == ["r2.bin"]    # the version is the round the client last trained in


def test_old_versions_are_pruned_and_a_resume_discards_newer_ones(tmp_path):
    store = ClientStates(tmp_path, state_layout(), budget_mb=0)
    for rnd in (1, 3, 6):
        store.put(0, rnd, state(rnd), keep_from=4)     # the oldest checkpoint on disk is after round 4
    assert versions(tmp_path, 0) == ["r3.bin", "r6.bin"]   # r3 is what a resume at round 4 needs
    discard_from(tmp_path, 4)
    assert versions(tmp_path, 0) == ["r3.bin"]


def test_a_short_state_file_is_reported(tmp_path):
    from mpifed.round.client_state import ClientStateError
    store = ClientStates(tmp_path, state_layout(), budget_mb=0)
    store.put(0, 1, state(1), keep_from=2)
    (tmp_path / "0" / "r1.bin").write_bytes(b"short")
    with pytest.raises(ClientStateError, match="r1.bin is not a client state of this run"):
        store.get(0, 1)


def test_a_state_file_changed_in_place_fails_its_checksum(tmp_path):
    from mpifed.round.client_state import ClientStateError
    store = ClientStates(tmp_path, state_layout(), budget_mb=0)
    store.put(0, 1, state(1), keep_from=2)
    path = tmp_path / "0" / "r1.bin"
    raw = bytearray(path.read_bytes())
    raw[-8:-4] = np.array([1e30], dtype=np.float32).tobytes()    # one float set to 1e30, same size
    path.write_bytes(bytes(raw))
    with pytest.raises(ClientStateError, match="r1.bin is damaged .*SHA-256"):
        ClientStates(tmp_path, state_layout(), budget_mb=0).get(0, 1)


def test_a_missing_state_is_an_error_not_zeros_or_an_older_state(tmp_path):
    from mpifed.round.client_state import ClientStateError
    store = ClientStates(tmp_path, state_layout(), budget_mb=0)
    store.put(0, 1, state(1), keep_from=1)
    store.put(0, 4, state(4), keep_from=1)                   # r1 is kept (a resume at round 1 needs it)
    (tmp_path / "0" / "r4.bin").unlink()
    fresh = ClientStates(tmp_path, state_layout(), budget_mb=0)
    with pytest.raises(ClientStateError, match="client 0's state after round 5 is missing"):
        fresh.get(0, 4)                                      # never the older r1
    assert fresh.get(0, 1)["w"].tolist() == [1.0] * 4


def test_a_state_file_of_an_earlier_mpifed_is_read(tmp_path):
    layout = state_layout()
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "r0.bin").write_bytes(layout.pack(state(5)).tobytes())   # no header
    assert ClientStates(tmp_path, layout, budget_mb=0).get(2, 0)["w"].tolist() == [5.0] * 4


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

    def __init__(self, layouts):
        self.layouts = layouts
        self.received = []

    def start_round(self, plan, down):
        self.received.append((down.weights.clone(), {k: v.clone() for k, v in down}))

    def train(self, plan):
        return Trained(self.layouts.uplink_buffer(), np.zeros(0, np.uint8), [])

    def flush_states(self, keep_from):
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
