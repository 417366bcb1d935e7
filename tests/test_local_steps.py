"""train.local_steps: local work stated in steps a round, the same for every client."""

import json

import pytest
import torch

from conftest import run_debug, small_setup, tiny
from mpifed.algorithms.base import Client, ClientContext
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.settings import config
from mpifed.settings.config import TrainConfig


class Passes(Client):
    """Records the pass (ctx.epoch) and the size of every training batch."""

    def __init__(self, options, setup):
        super().__init__(options, setup)
        self.batches = []

    def on_batch(self, ctx, batch, out):
        self.batches.append((ctx.epoch, len(batch.y)))


def context(setup, n: int) -> ClientContext:
    data = ClientData(0, torch.randint(0, 255, (n, 1, 2, 2), dtype=torch.uint8), torch.arange(n) % 3)
    transform = BatchTransform([0.5], [0.5], 0, False, 0, "cpu")
    return ClientContext(0, 1, 0.1, setup.new_model(), torch.zeros(setup.num_floats), data, transform,
                         torch.Generator().manual_seed(0), setup.train)


@pytest.mark.parametrize("n, batch, per_epoch", [(10, 4, 3), (9, 4, 2), (8, 4, 2), (1, 4, 1), (3, 4, 1), (5, 1, 5)])
def test_batches_per_epoch_counts_what_batches_yields(n, batch, per_epoch):
    setup = small_setup()
    setup.train = TrainConfig(batch_size=batch)
    ctx = context(setup, n)
    assert ctx.batches_per_epoch == per_epoch == len(list(ctx.batches()))


def test_local_steps_stop_mid_pass_and_the_passes_are_counted():
    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_epochs=5, local_steps=7)
    ctx = context(setup, 10)                               # batches of 4, 4, 2 a pass
    client = Passes(None, setup)
    client.local_round(ctx)
    assert ctx.epochs == 3
    assert client.batches == [(0, 4), (0, 4), (0, 2), (1, 4), (1, 4), (1, 2), (2, 4)]
    assert ctx.steps == 7 and ctx.seen == 24


@pytest.mark.parametrize("n", [5, 12, 40])
def test_every_client_takes_the_same_steps_whatever_its_size(n):
    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_steps=6)
    ctx = context(setup, n)
    Passes(None, setup).local_round(ctx)
    assert ctx.steps == 6


def test_without_local_steps_the_epochs_are_train_local_epochs():
    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_epochs=2)
    ctx = context(setup, 10)
    client = Passes(None, setup)
    client.local_round(ctx)
    assert ctx.epochs == 2 and ctx.steps == 6 and [e for e, _ in client.batches] == [0, 0, 0, 1, 1, 1]


def test_local_epochs_is_no_part_of_a_run_under_local_steps():
    def fingerprint(**train):
        return config.math_fingerprint(config.build({"train": train}).to_dict())

    assert fingerprint(local_steps=50, local_epochs=1) == fingerprint(local_steps=50, local_epochs=4)
    assert fingerprint(local_steps=50) != fingerprint(local_steps=40)
    assert fingerprint(local_epochs=1) != fingerprint(local_epochs=4)
    assert fingerprint(local_steps=50) != fingerprint(local_epochs=2)


def test_a_negative_local_steps_is_refused():
    with pytest.raises(config.ConfigError, match="local_steps"):
        config.build({"train": {"local_steps": -1}})


@pytest.mark.parametrize("method", ["fedavg", "scaffold", "fedproto"])
def test_a_run_in_local_steps_trains_each_client_that_many_steps(tmp_path, method):
    """Clients of unequal sizes (Dirichlet 0.5) each take 5 steps a round; the dry run says so."""
    args = tiny(tmp_path, f"algorithm.name={method}", "train.local_steps=5", "train.local_epochs=3")
    assert "2 rounds of 5 local steps" in run_debug([*args, "--dry-run"]).stdout
    run_debug(args)
    rounds = [json.loads(line) for line in (tmp_path / "runs" / "run" / "clients.jsonl").read_text().splitlines()]
    rows = [c for r in rounds for c in r["clients"]]
    sizes = {r["samples"] for r in rows}
    assert len(rows) == 10 and len(sizes) > 1
    assert {r["steps"] for r in rows} == {5}
