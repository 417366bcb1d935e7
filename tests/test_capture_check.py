"""The behavioural capture check: a captured local step (traced and replayed, the CPU stand-in for a CUDA
graph) must equal the eager step; every registered method passes, and each way of passing a Python value
into the step behind its declared inputs is caught, with its line and round."""
import re

import pytest
import torch
import torch.nn.functional as F

from conftest import command, small_setup
from mpifed.algorithms.base import Client, ClientContext
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.local.steps import LocalSteps
from mpifed.local.trace import HostRead, StaleCapture
from mpifed.registry import ALGORITHMS
from mpifed.round.capture_check import check_method
from mpifed.settings.config import TrainConfig


@pytest.mark.parametrize("name", sorted(ALGORITHMS.names()))
def test_every_registered_method_captures_its_step_as_it_runs_eagerly(name):
    """A copied or new method is checked here with nothing added: lr decaying each round, clients of
    different sizes, two a round, more rounds than the method's warm-up."""
    result = check_method(name, ALGORITHMS.get(name))
    assert result.ok, result.problem
    assert result.rounds >= 4


# the seven idioms that pass a Python value into the step behind the declared inputs, and the declared form
IDIOMS = '''
import numpy as np
import torch.nn.functional as F

from mpifed.algorithms.base import Algorithm, Client, Inputs
from mpifed.registry import ALGORITHMS

SCALE = 1.0


class Holder:
    scale = 1.0


class Schedule:
    def at(self, server_round):
        return 1.0 + server_round


def scaled(name, client, inputs=None):
    algo = type(name, (Algorithm,), {"Client": client})
    if inputs is not None:
        algo.inputs = lambda self: inputs
    ALGORITHMS.register(name)(algo)


class SelfAttribute(Client):
    def round_start(self, server_round, down):
        self.scale = 1.0 + server_round

    def loss(self, ctx, batch, out):
        return F.cross_entropy(out.logits, batch.y) * self.scale  # line:idiom_self


class HelperAttribute(Client):
    def __init__(self, options, setup):
        super().__init__(options, setup)
        self.holder = Holder()

    def round_start(self, server_round, down):
        self.holder.scale = 1.0 + server_round

    def loss(self, ctx, batch, out):
        return F.cross_entropy(out.logits, batch.y) * self.holder.scale  # line:idiom_helper


class HelperMethod(Client):
    def __init__(self, options, setup):
        super().__init__(options, setup)
        self.schedule = Schedule()

    def loss(self, ctx, batch, out):
        return F.cross_entropy(out.logits, batch.y) * self.schedule.at(ctx.server_round)  # line:idiom_method


class NumpyFill(Client):
    def __init__(self, options, setup):
        super().__init__(options, setup)
        self.scale = np.ones(1)

    def round_start(self, server_round, down):
        self.scale.fill(1.0 + server_round)

    def loss(self, ctx, batch, out):
        return F.cross_entropy(out.logits, batch.y) * float(self.scale[0])  # line:idiom_numpy


class ModuleGlobal(Client):
    def round_start(self, server_round, down):
        global SCALE
        SCALE = 1.0 + server_round

    def loss(self, ctx, batch, out):
        return F.cross_entropy(out.logits, batch.y) * SCALE  # line:idiom_global


class VarsUpdate(Client):
    def round_start(self, server_round, down):
        vars(self).update(scale=1.0 + server_round)

    def loss(self, ctx, batch, out):
        return F.cross_entropy(out.logits, batch.y) * self.scale  # line:idiom_vars


class ObjectSetattr(Client):
    def round_start(self, server_round, down):
        object.__setattr__(self, "scale", 1.0 + server_round)

    def loss(self, ctx, batch, out):
        return F.cross_entropy(out.logits, batch.y) * self.scale  # line:idiom_setattr


class Declared(Client):
    def round_start(self, server_round, down):
        self.inputs.scale = 1.0 + server_round

    def loss(self, ctx, batch, out):
        return F.cross_entropy(out.logits, batch.y) * self.inputs.scale


scaled("idiom_self", SelfAttribute)
scaled("idiom_helper", HelperAttribute)
scaled("idiom_method", HelperMethod)
scaled("idiom_numpy", NumpyFill)
scaled("idiom_global", ModuleGlobal)
scaled("idiom_vars", VarsUpdate)
scaled("idiom_setattr", ObjectSetattr)
scaled("idiom_declared", Declared, Inputs(round={"scale": ()}))
'''


def test_check_method_flags_each_idiom_with_its_line_and_round_and_passes_the_declared_form(tmp_path):
    path = tmp_path / "idioms.py"
    path.write_text(IDIOMS)
    lines = {m.group(1): i for i, text in enumerate(IDIOMS.splitlines(), start=1)
             for m in [re.search(r"# line:(\w+)", text)] if m}
    p = command(tmp_path, "mpifed", "check-method", str(path), "--rounds", "2", check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "idiom_declared: the captured step equals the eager step over 2 rounds" in p.stdout
    failures = {m.group(1): m.group(0) for m in re.finditer(r"method (\w+): .*", p.stderr)}
    assert sorted(failures) == sorted(lines)
    for name, line in lines.items():
        text = failures[name]
        assert f"{path}:{line} in loss" in text, text
        assert "left the eager step in round 2" in text and "inputs()" in text, text


def test_check_method_refuses_a_file_without_a_method(tmp_path):
    path = tmp_path / "nothing.py"
    path.write_text("x = 1\n")
    p = command(tmp_path, "mpifed", "check-method", str(path), check=False)
    assert p.returncode == 2 and "registers nothing" in p.stderr


# ------------------------------------------------------------------ the run's own check (resources.cuda_graphs)
class Stale(Client):
    """A per-round scale read from the context in the loss: what a captured step would replay stale."""

    def loss(self, ctx, batch, out):
        return F.cross_entropy(out.logits, batch.y) * (1.0 + ctx.server_round)


class HostReading(Client):
    def loss(self, ctx, batch, out):
        loss = F.cross_entropy(out.logits, batch.y)
        return loss * float(loss.detach())


def _context(setup, runner, server_round, flat=None, samples=12):
    """A client's context in ``server_round``; a worker's one model (``flat``) across rounds, as a graph needs."""
    g = torch.Generator().manual_seed(0)
    data = ClientData(0, torch.randint(0, 255, (samples, 1, 2, 2), dtype=torch.uint8, generator=g),
                      torch.randint(0, 3, (samples,), generator=g))
    return ClientContext(0, server_round, 0.1, flat or setup.new_model(), torch.zeros(setup.num_floats), data,
                         BatchTransform([0.5], [0.5], 0, False, 0, "cpu"), torch.Generator().manual_seed(1),
                         setup.train, runner=runner)


class Counting(Client):
    """Counts the steps that run its loss in Python: eager ones and the one capture traces (a replay does not)."""

    calls = 0

    def loss(self, ctx, batch, out):
        type(self).calls += 1
        return super().loss(ctx, batch, out)


def test_the_first_replay_of_a_graph_in_a_later_round_is_checked_against_an_eager_step():
    """The code path of resources.cuda_graphs on a GPU, with the traced step: round 1 warms up and captures;
    the first replay of round 2 (only that one) runs an eager step from the same state first, and a replay
    that leaves it is refused with the round and the line."""
    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_epochs=2)
    runner, flat = LocalSteps(graphs=True, backend="trace"), setup.new_model()
    Stale(None, setup).train(_context(setup, runner, 1, flat))     # 6 steps: 3 warm-up, capture, 2 replays
    with pytest.raises(StaleCapture, match=r"Stale's captured step left the eager step in round 2 \(captured in "
                                           r"round 1.*test_capture_check.py:\d+ in loss.*inputs\(\)"):
        Stale(None, setup).train(_context(setup, runner, 2, flat))


def test_a_right_step_costs_one_eager_step_a_graph_a_round():
    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_epochs=2)
    runner, flat = LocalSteps(graphs=True, backend="trace"), setup.new_model()
    for server_round in (1, 2, 3):
        Counting(None, setup).train(_context(setup, runner, server_round, flat))    # 6 steps a round
    # round 1: 3 warm-up steps and the traced one; rounds 2 and 3: one eager step before the first replay
    assert Counting.calls == 4 + 1 + 1


def test_a_host_read_in_the_step_is_its_own_error():
    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_epochs=1)
    with pytest.raises(HostRead, match=r"reads a tensor's value on the host \(_local_scalar_dense\) at "
                                       r".*test_capture_check.py:\d+ in loss"):
        HostReading(None, setup).train(_context(setup, LocalSteps(graphs=True, backend="trace"), 1))


def test_check_method_says_when_a_method_does_not_run_at_all(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("from mpifed.algorithms.base import Algorithm, Client\nfrom mpifed.registry import ALGORITHMS\n\n\n"
                    "class Broken(Client):\n    def loss(self, ctx, batch, out):\n"
                    "        return out.no_such_thing\n\n\n"
                    "@ALGORITHMS.register('broken')\nclass BrokenMethod(Algorithm):\n    Client = Broken\n")
    p = command(tmp_path, "mpifed", "check-method", str(path), check=False)
    assert p.returncode == 2 and "method broken did not run on the check's tiny data" in p.stderr
    assert "AttributeError" in p.stderr and "Traceback" not in p.stderr
    assert command(tmp_path, "mpifed", "check-method", str(path), "--rounds", "1", check=False).returncode == 2
