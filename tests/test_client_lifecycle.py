"""A client's local round: its hooks run in one order, its state changes in one place."""

import pytest
import torch

from conftest import run_plugin, small_setup
from mpifed.algorithms.base import Client, ClientContext, Fields
from mpifed.settings.config import TrainConfig
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform


class Recording(Client):
    """Records the hooks it sees; keeps a count of its rounds as its state."""

    def __init__(self, options, setup):
        super().__init__(options, setup)
        self.calls = []

    def begin_client(self, ctx):
        self.calls.append("begin")
        self.seen = 0

    def on_batch(self, ctx, batch, out):
        assert not torch.is_grad_enabled() and out.logits.shape == (len(batch.y), 3)
        self.calls.append("batch")
        self.seen += len(batch.y)

    def loss(self, ctx, batch, out):
        self.calls.append("loss")
        return super().loss(ctx, batch, out)

    def end_client(self, ctx):
        self.calls.append("end")
        return {"rounds": ctx.state.rounds + 1}

    def uplink(self, ctx):
        self.calls.append("uplink")
        return {**super().uplink(ctx), "seen": torch.tensor([float(self.seen)])}


def test_local_round_runs_the_hooks_in_order_and_keeps_the_new_state_apart():
    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_epochs=2)
    data = ClientData(0, torch.randint(0, 255, (8, 1, 2, 2), dtype=torch.uint8), torch.arange(8) % 3)
    old = Fields("the client state", {"rounds": torch.ones(1)})
    ctx = ClientContext(0, 1, 0.1, setup.new_model(), torch.zeros(setup.num_floats), data,
                        BatchTransform([0.5], [0.5], 0, False, 0, "cpu"), torch.Generator().manual_seed(0), setup.train,
                        state=old)
    client = Recording(None, setup)
    up = client.local_round(ctx)
    assert client.calls == ["begin"] + ["batch", "loss"] * 4 + ["end", "uplink"]
    assert up["seen"].item() == 16 and ctx.steps == 4
    assert ctx.state is old and old.rounds.item() == 1 and ctx.new_state.rounds.item() == 2
    assert Recording.eager_reason() == "collects per-client sums after each batch (on_batch)"


MISSPELT = '''
from mpifed.algorithms.base import Algorithm, Client
from mpifed.registry import ALGORITHMS


class MisspeltClient(Client):
    def end_client(self, ctx):
        return {"contrl": ctx.state.control + 1}


@ALGORITHMS.register("misspelt_state")
class Misspelt(Algorithm):
    Client = MisspeltClient

    def messages(self):
        return super().messages().extend(client_state={"control": (1,)})
'''


@pytest.mark.e2e
def test_a_new_state_not_declared_is_an_error(tmp_path):
    p = run_plugin(tmp_path, MISSPELT, "misspelt_state")
    assert p.returncode != 0
    assert ("MisspeltClient.end_client returned ['contrl'] as misspelt_state's client state; the method's messages() "
            "declare ['control']") in p.stderr
