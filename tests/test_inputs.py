"""Declared inputs: what a client role keeps for its loss lives in fixed buffers, and anything else
it would keep (the per-round temperature a captured step would replay stale) is found by the capture check."""
import pytest
import torch

from conftest import small_setup
from mpifed.algorithms.base import Client, ClientContext, Downlink, Inputs, role_problems
from mpifed.algorithms.fedntd import FedNTD, FedNTDClient
from mpifed.algorithms.inputs import Buffer, InputBuffers, UndeclaredInput
from mpifed.settings.config import TrainConfig
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.local.losses import ntd_loss
from mpifed.local.steps import LocalSteps
from mpifed.round.capture_check import check_method


# ------------------------------------------------------------------ the declaration
def test_inputs_are_identifiers_of_known_kinds_declared_once():
    with pytest.raises(ValueError, match="not a Python identifier"):
        Inputs(round={"my tau": ()})
    with pytest.raises(ValueError, match="declare a shape"):
        Inputs(client={"tau": "scalar"})
    with pytest.raises(ValueError, match=r"\['tau'\] declared both per round and per client"):
        Inputs(round={"tau": ()}, client={"tau": ()})
    with pytest.raises(ValueError, match=r"Inputs.round: \['tau'\] declared twice"):
        Inputs(round={"tau": ()}).extend(round={"tau": (2,)})
    with pytest.raises(TypeError, match="Inputs has no part"):
        Inputs().extend(epoch={"tau": ()})
    both = Inputs(round={"tau": ()}).extend(client={"counts": Buffer((3,), torch.float64), "active": bool})
    assert set(both.round) == {"tau"} and set(both.client) == {"counts", "active"}


def test_setting_an_input_writes_into_its_buffer_and_never_moves_it():
    inputs = InputBuffers(Inputs(round={"tau": (), "weights": (3,), "live": int, "scale": float},
                                 client={"sums": Buffer((2,), torch.float64), "active": bool}))
    tau, weights, sums = inputs.tau, inputs.weights, inputs.sums
    assert tau.shape == () and tau.dtype == torch.float32 and sums.dtype == torch.float64
    inputs.tau = 2.5
    inputs.weights = torch.tensor([1.0, 2.0, 3.0])
    inputs.sums += torch.tensor([1.0, 1.0], dtype=torch.float64)
    inputs.live, inputs.scale, inputs.active = 2, 3, True
    assert inputs.tau is tau and tau.item() == 2.5
    assert inputs.weights is weights and weights.tolist() == [1.0, 2.0, 3.0]
    assert inputs.sums is sums and sums.tolist() == [1.0, 1.0]
    assert inputs.scale == 3.0 and type(inputs.scale) is float
    assert inputs.key() == (("live", 2), ("scale", 3.0), ("active", True))
    inputs.reset("client")
    assert sums.tolist() == [0.0, 0.0] and inputs.active is False and inputs.tau.item() == 2.5
    inputs.reset("round")
    assert tau.item() == 0 and weights.tolist() == [0.0, 0.0, 0.0] and inputs.live == 0 and inputs.scale == 0.0


def test_a_wrong_shape_type_or_name_is_a_clear_error():
    inputs = InputBuffers(Inputs(round={"weights": (3,), "live": int}))
    with pytest.raises(ValueError, match=r"inputs.weights is declared with shape \(3,\); got a tensor of shape \(4,\)"):
        inputs.weights = torch.zeros(4)
    with pytest.raises(TypeError, match="inputs.live is declared int; got float"):
        inputs.live = 1.5
    with pytest.raises(UndeclaredInput, match=r"inputs.tau is not declared; the method's inputs\(\) declare "
                                              r"weights \(round\), live \(round\)"):
        inputs.tau = 1.0
    with pytest.raises(UndeclaredInput, match="inputs.tau is not declared"):
        inputs.tau


# ------------------------------------------------------------------ the stale temperature
class ScheduledNTDClient(FedNTDClient):
    """FedNTD with its temperature set per round, kept on self: stale under captured steps."""

    def round_start(self, server_round, down):
        super().round_start(server_round, down)
        self.tau = float(server_round)

    def loss(self, ctx, batch, out):
        return ntd_loss(out.logits, self.teacher.batch_logits(ctx, batch), batch.y, self.tau)


class ScheduledNTD(FedNTD):
    Client = ScheduledNTDClient


class OptionsNTDClient(FedNTDClient):
    def round_start(self, server_round, down):
        super().round_start(server_round, down)
        self.options.tau = float(server_round)


class OptionsNTD(FedNTD):
    Client = OptionsNTDClient


class RoundNTDClient(FedNTDClient):
    """The temperature from the context's round number, read inside the loss."""

    def loss(self, ctx, batch, out):
        return ntd_loss(out.logits, self.teacher.batch_logits(ctx, batch), batch.y, float(ctx.server_round))


class RoundNTD(FedNTD):
    Client = RoundNTDClient


class DeclaredNTDClient(FedNTDClient):
    """The same schedule, declared: a 0-d buffer filled in place each round."""

    def round_start(self, server_round, down):
        super().round_start(server_round, down)
        self.inputs.tau = float(server_round)

    def loss(self, ctx, batch, out):
        return ntd_loss(out.logits, self.teacher.batch_logits(ctx, batch), batch.y, self.inputs.tau)


class DeclaredNTD(FedNTD):
    Client = DeclaredNTDClient

    def inputs(self):
        return Inputs(round={"tau": ()})


def _down(setup):
    return Downlink(torch.zeros(setup.num_floats), torch.zeros(setup.num_ints, dtype=torch.int64), {})


def _context(setup, runner=None, server_round=1):
    g = torch.Generator().manual_seed(0)
    data = ClientData(0, torch.randint(0, 255, (8, 1, 2, 2), dtype=torch.uint8, generator=g), torch.arange(8) % 3)
    return ClientContext(0, server_round, 0.1, setup.new_model(), torch.zeros(setup.num_floats), data,
                         BatchTransform([0.5], [0.5], 0, False, 0, "cpu"), torch.Generator().manual_seed(1),
                         setup.train, runner=runner or LocalSteps())


@pytest.mark.parametrize("method, where", [(ScheduledNTD, "test_inputs.py"), (OptionsNTD, "fedntd.py"),
                                           (RoundNTD, "test_inputs.py")])
def test_a_per_round_value_kept_outside_the_inputs_is_found_by_the_capture_check(method, where):
    """Kept on self, on its options (read by FedNTD's loss), or read from the context in the loss: the
    replayed step leaves the eager one in round 2, and the check names the line of the loss that reads it."""
    result = check_method(method.__name__, method, rounds=3)
    assert not result.ok
    assert "left the eager step in round 2" in result.problem and f"{where}:" in result.problem
    assert "in loss" in result.problem and "inputs()" in result.problem


def test_the_declared_schedule_trains_and_its_buffer_keeps_its_address():
    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_epochs=1)
    client = DeclaredNTD(DeclaredNTD.Options(), setup).client()
    assert role_problems(DeclaredNTD) == [] and DeclaredNTDClient.eager_reason() == ""
    tau = client.inputs.tau
    for server_round in (1, 2, 3):
        client.inputs.reset("round")
        client.round_start(server_round, _down(setup))
        ctx = _context(setup, server_round=server_round)
        client.train(ctx)
        assert client.inputs.tau is tau and tau.item() == server_round and ctx.steps == 2


def test_a_role_that_runs_eagerly_sees_the_whole_context():
    class Epochs(Client):
        def on_batch(self, ctx, batch, out):
            assert isinstance(ctx, ClientContext)

        def loss(self, ctx, batch, out):
            return super().loss(ctx, batch, out) * (1 + ctx.epoch)

    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_epochs=2)
    ctx = _context(setup)
    Epochs(None, setup).train(ctx)
    assert ctx.steps == 4


def test_capture_key_is_reported_as_gone():
    class Keyed(FedNTDClient):
        def capture_key(self, ctx):
            return ()

    algo = type("Algo", (FedNTD,), {"Client": Keyed})
    assert any("Keyed.capture_key is no longer read" in p for p in role_problems(algo))

