"""Messages are declared once (Algorithm.messages): roles read them by name, a name not declared
fails when the run starts or where it is read, and the protocol's own entries are not the method's."""
import json
import time

import pytest
import torch

from conftest import run_mpi, run_plugin, tiny
from mpifed.algorithms.base import Downlink, Fields, Messages, UndeclaredName, summed
from mpifed.round.protocol import build_layouts


def test_fields_are_read_by_their_declared_names():
    state = Fields("scaffold's client state", {"control": torch.ones(2)})
    assert torch.equal(state.control, torch.ones(2)) and dict(iter(state)).keys() == {"control"}
    with pytest.raises(UndeclaredName, match=r"scaffold's client state has no 'contrl'; the method's messages\(\) "
                                             r"declare \['control'\]"):
        state.contrl
    with pytest.raises(AttributeError, match="read-only"):
        state.control = torch.zeros(2)


def test_the_downlink_holds_the_model_and_the_declared_tensors():
    down = Downlink(torch.zeros(3), torch.zeros(1, dtype=torch.int64), {"teacher": torch.ones(3)}, "fedcsd's downlink")
    assert torch.equal(down.teacher, torch.ones(3)) and torch.equal(down.weights, torch.zeros(3))
    assert [name for name, _ in down] == ["teacher"]
    with pytest.raises(UndeclaredName, match=r"fedcsd's downlink has no 'teachr'.*\['teacher'\]"):
        down.teachr


def test_names_must_be_identifiers_and_not_the_global_model():
    with pytest.raises(ValueError, match=r"Messages.up: \['delta-control'\] are not Python identifiers"):
        Messages(up={"delta-control": summed(1)})
    with pytest.raises(ValueError, match=r"Messages.down: \['weights'\] name the global model"):
        Messages(down={"weights": (3,)})


def test_the_protocol_keeps_its_own_sums_apart_from_the_method():
    messages = Messages(up={"model": summed(4), "weight": summed(1), "_samples": summed(1)})
    layouts = build_layouts(messages, 4, 2, 10, 5, 2, 0, method="counting")
    assert list(layouts.sums.entries) == ["model", "weight", "_samples"]
    assert list(layouts.model_sums.entries) == ["ints", "samples"]
    sums, own = layouts.uplink_views(layouts.uplink_buffer())
    assert set(sums) == {"model", "weight", "_samples"} and own["ints"].shape == (2,)


MISSPELT_DOWN = '''
import torch
from mpifed.algorithms.base import Algorithm, Server
from mpifed.registry import ALGORITHMS


class MisspeltServer(Server):
    def downlink(self, server_round, weights):
        return {"NAME": torch.zeros(SIZE)}


@ALGORITHMS.register("misspelt_down")
class Misspelt(Algorithm):
    Server = MisspeltServer

    def messages(self):
        return super().messages().extend(down={"fisher": (3,)})
'''


@pytest.mark.e2e
def test_a_misspelt_downlink_fails_at_start_up(tmp_path):
    p = run_plugin(tmp_path, MISSPELT_DOWN.replace("NAME", "fishr").replace("SIZE", "3"), "misspelt_down")
    assert p.returncode != 0
    assert ("misspelt_down's downlink from MisspeltServer.downlink: missing ['fisher']; undeclared ['fishr'] "
            "(declared: ['fisher'])") in p.stderr
    assert p.returncode == 2 and "Traceback" not in p.stderr and "round 1/" not in p.stdout   # at start-up
    assert not (tmp_path / "runs" / "run").exists()   # nothing trained: the start is undone


@pytest.mark.e2e
def test_a_downlink_of_the_wrong_size_fails_at_start_up(tmp_path):
    p = run_plugin(tmp_path, MISSPELT_DOWN.replace("NAME", "fisher").replace("SIZE", "5"), "misspelt_down")
    assert p.returncode != 0
    assert ("misspelt_down's downlink from MisspeltServer.downlink: 'fisher' has 5 elements, its declared shape (3,) "
            "has 3") in p.stderr
    assert p.returncode == 2 and "Traceback" not in p.stderr and "round 1/" not in p.stdout
    assert not (tmp_path / "runs" / "run").exists()   # nothing trained: the start is undone


@pytest.mark.mpi
@pytest.mark.e2e
def test_a_misspelt_downlink_ends_an_mpi_job_at_start_up(has_mpirun, tmp_path):
    plugin = tmp_path / "misspelt_down.py"
    plugin.write_text(MISSPELT_DOWN.replace("NAME", "fishr").replace("SIZE", "3"))
    start = time.time()
    p = run_mpi(3, tiny(tmp_path, "algorithm.name=misspelt_down", "comm.timeout_s=600") + ["--plugin", str(plugin)],
                check=False, timeout=120)
    assert p.returncode != 0 and time.time() - start < 60, "the workers must not wait for a round that never comes"
    assert "misspelt_down's downlink from MisspeltServer.downlink: missing ['fisher']" in p.stderr


UNDECLARED_READ = '''
from mpifed.algorithms.base import Algorithm, Client
from mpifed.registry import ALGORITHMS


class ReadingClient(Client):
    def end_client(self, ctx):
        return {"control": ctx.state.contrl}


@ALGORITHMS.register("undeclared_read")
class Reading(Algorithm):
    Client = ReadingClient

    def messages(self):
        return super().messages().extend(client_state={"control": (1,)})
'''


@pytest.mark.e2e
def test_reading_an_undeclared_name_is_a_clear_error(tmp_path):
    p = run_plugin(tmp_path, UNDECLARED_READ, "undeclared_read")
    assert p.returncode != 0
    assert ("undeclared_read's client state has no 'contrl'; the method's messages() declare ['control']") in p.stderr


SAMPLES = '''
import torch
from mpifed.algorithms.base import Algorithm, Client, Server, summed
from mpifed.registry import ALGORITHMS


class CountingClient(Client):
    def uplink(self, ctx):
        return {**super().uplink(ctx), "_samples": torch.ones(1, dtype=torch.float64)}


class CountingServer(Server):
    def aggregate(self, server_round, weights, replies):
        self.counted = int(replies.sums._samples.item())
        self.names = sorted(name for name, _ in replies.sums)
        return super().aggregate(server_round, weights, replies)

    def log(self):
        return {"counted": self.counted, "sum_names": self.names}


@ALGORITHMS.register("counting")
class Counting(Algorithm):
    Client = CountingClient
    Server = CountingServer

    def messages(self):
        return super().messages().extend(up={"_samples": summed(1)})
'''


@pytest.mark.e2e
def test_a_method_may_name_an_entry_as_the_protocol_once_did(tmp_path):
    """The protocol's own sums (formerly ``_ints`` and ``_samples`` among the method's) are apart:
    a method's ``_samples`` is its own, and its sums hold only what it declares."""
    p = run_plugin(tmp_path, SAMPLES, "counting", "train.participation=0.6")
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["counted"] for r in rows] == [r["clients"] for r in rows] == [3, 3]
    assert rows[0]["sum_names"] == ["_samples", "model", "weight"]
