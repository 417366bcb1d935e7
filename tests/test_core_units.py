"""Flat model state, SGD, round planning, placement, IDX files, checkpoints."""
import copy
import gzip
import subprocess
import sys

import numpy as np
import pytest
import torch

from mpifed.run import checkpoint
from mpifed.data.sets.idx import read_idx, write_idx
from mpifed.local.flat import FlatModel
from mpifed.models import build_model
from mpifed.local.optim import FlatSGD
from mpifed.options import NoOptions
from mpifed.round.placement import PlacementError, choose_device, choose_threads
from mpifed.round.plan import assign_clients, client_seed, sample_clients, state_moves
from mpifed.round.protocol import Layout, ProtocolError


def bn_model():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))


def test_flat_model_views_cover_parameters_and_buffers():
    torch.manual_seed(0)
    ref = bn_model()
    flat = FlatModel(copy.deepcopy(ref))
    n_params = sum(p.numel() for p in ref.parameters())
    assert flat.num_params == n_params and flat.num_floats == n_params + 8  # running mean and var
    assert flat.ints.tolist() == [0]  # num_batches_tracked, carried exactly in the int part
    flat.model.train()(torch.randn(5, 1, 8, 8))
    assert flat.ints.tolist() == [1]
    assert not torch.equal(flat.floats[n_params:], torch.cat([ref[1].running_mean, ref[1].running_var]))
    new = torch.arange(flat.num_floats, dtype=torch.float32)
    flat.load(new, torch.tensor([7]))
    assert torch.equal(flat.model[0].weight.flatten(), new[: flat.model[0].weight.numel()])
    assert flat.model[1].num_batches_tracked.item() == 7


@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 1e-4)])
def test_flat_sgd_matches_torch_sgd_exactly(momentum, wd):
    torch.manual_seed(0)
    a = build_model("fedavg_cnn", NoOptions(), (1, 28, 28), 10)
    b = copy.deepcopy(a)
    flat = FlatModel(a)
    ours = FlatSGD(flat, 0.05, momentum, wd)
    theirs = torch.optim.SGD(b.parameters(), lr=0.05, momentum=momentum, weight_decay=wd)
    for _ in range(4):
        x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
        ours.zero_grad()
        torch.nn.functional.cross_entropy(a(x), y).backward()
        ours.step()
        theirs.zero_grad()
        torch.nn.functional.cross_entropy(b(x), y).backward()
        theirs.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_layout_round_trip_and_strict_packing():
    pk = Layout("test", {"a": ((3,), np.float32), "b": ((2, 2), np.int64), "c": ((1,), np.float64)})
    buf = pk.pack({"a": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([[1, 2], [3, 4]]), "c": torch.tensor([0.5])})
    v = pk.views(buf)
    assert v["a"].tolist() == [1, 2, 3] and v["b"].tolist() == [[1, 2], [3, 4]] and v["c"].tolist() == [0.5]
    with pytest.raises(ProtocolError, match=r"missing \['c'\]"):
        pk.pack({"a": torch.zeros(3),
                 "b": torch.zeros(2, 2)})          # a declared entry left out: an error, no zero fill
    with pytest.raises(ProtocolError, match="undeclared"):
        pk.pack({"a": torch.zeros(3), "b": torch.zeros(2, 2), "c": torch.zeros(1), "zzz": torch.zeros(1)})
    with pytest.raises(ProtocolError, match="has 4 elements"):
        pk.pack({"a": torch.zeros(4), "b": torch.zeros(2, 2), "c": torch.zeros(1)})


def test_state_moves_follow_the_holders():
    # client 3 last trained on worker 0 and is now on worker 1; client 5 stays on worker 1; 7 never trained
    assert state_moves([[1], [3, 5, 7]], {3: 0, 5: 1, 1: 0}) == [(3, 0, 1)]


def test_sampling_depends_on_seed_and_round_only():
    a = sample_clients(3, 5, 100, 0.1)
    assert len(a) == 10 and np.array_equal(a, sample_clients(3, 5, 100, 0.1))
    assert not np.array_equal(a, sample_clients(3, 6, 100, 0.1))
    assert np.array_equal(sample_clients(3, 5, 7, 1.0), np.arange(7))


def test_assignment_balances_samples():
    sizes = np.array([100, 90, 80, 10, 10, 10, 5, 5])
    out = assign_clients(np.arange(8), sizes, 3)
    assert sorted(c for w in out for c in w) == list(range(8))
    loads = [sizes[w].sum() for w in out]
    assert max(loads) - min(loads) <= 25
    assert assign_clients(np.arange(2), sizes, 4)[2:] == [[], []]  # fewer clients than workers


def test_client_seed_is_stable_and_distinct():
    assert client_seed(0, 1, 2) == client_seed(0, 1, 2)
    assert len({client_seed(0, r, c) for r in range(5) for c in range(5)}) == 25


def test_device_placement_with_faked_gpus():
    assert choose_device(False, 0, "auto", "cpu", 0) == "cpu"
    chosen = [choose_device(False, i, "auto", "cpu", 4) for i in range(6)]
    assert chosen == ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0", "cuda:1"]
    assert choose_device(False, 3, "cpu", "cpu", 4) == "cpu"
    assert choose_device(True, -1, "auto", "cpu", 4) == "cpu"
    assert choose_device(True, -1, "auto", "cuda", 4) == "cuda:0"
    with pytest.raises(PlacementError, match="no GPU"):
        choose_device(False, 0, "cuda", "cpu", 0)
    with pytest.raises(PlacementError, match="no GPU"):
        choose_device(True, -1, "auto", "cuda", 0)


def test_threads_share_the_cores():
    assert choose_threads(0, 11, cores=2) == 1
    assert choose_threads(0, 3, cores=16) == 5
    assert choose_threads(4, 11, cores=2) == 4


def test_idx_round_trip_and_truncation(tmp_path):
    x = np.random.default_rng(0).integers(0, 255, (5, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / "a-idx3-ubyte.gz", x)
    assert np.array_equal(read_idx(tmp_path / "a-idx3-ubyte.gz"), x)
    raw = gzip.decompress((tmp_path / "a-idx3-ubyte.gz").read_bytes())
    (tmp_path / "b").write_bytes(raw[:-10])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "b")
    (tmp_path / "c").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="not an IDX"):
        read_idx(tmp_path / "c")


def test_checkpoint_round_trip_keep_and_corruption(tmp_path):
    for r in (1, 2, 3):
        checkpoint.save(tmp_path, r, {"r": r, "w": torch.ones(3) * r}, keep=2)
    assert [p.name for p in checkpoint.all_checkpoints(tmp_path)] == ["round_000002.ckpt", "round_000003.ckpt"]
    assert checkpoint.load(checkpoint.latest(tmp_path))["r"] == 3
    path = checkpoint.latest(tmp_path)
    raw = path.read_bytes()
    path.write_bytes(raw[:-5])
    with pytest.raises(checkpoint.CheckpointError, match="truncated"):
        checkpoint.load(path)
    path.write_bytes(raw[:-5] + b"xxxxx")
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        checkpoint.load(path)
    path.write_bytes(b"garbage")
    with pytest.raises(checkpoint.CheckpointError, match="bad header"):
        checkpoint.load(path)


def test_setup_counts_the_integer_state():
    """Setup.num_ints is the length of the model's flat integer state (BatchNorm's counters), so
    nobody builds a model to count it."""
    from types import SimpleNamespace

    from mpifed.settings import config
    from mpifed.round.startup import make_algorithm
    cfg = config.load(overrides=["model.name=resnet8"])[0]
    manifest = SimpleNamespace(input_shape=(3, 32, 32), num_classes=10, num_clients=10, vocab_size=0)
    _, setup = make_algorithm(cfg, manifest, torch.device("cpu"))
    counters = [b for b in setup.new_model().model.buffers() if b.dtype == torch.int64]
    assert setup.num_ints == sum(b.numel() for b in counters) and counters


def test_default_placement_leaves_the_compiler_stack_unloaded():
    """torch.use_deterministic_algorithms imports torch._inductor (about 1.5 s and 170 MB a rank);
    a rank placed with the default (deterministic off) must not call it, and a switch in the
    same process (the re-entrant main) must still take effect."""
    code = ("import sys, torch\n"
            "from mpifed import config\n"
            "from mpifed.round.startup import place\n"
            "from mpifed.round.placement import set_deterministic\n"
            "place(config.load()[0], None, 0, 1)\n"
            "print('torch._inductor' in sys.modules)\n"
            "set_deterministic(True)\n"
            "print(torch.are_deterministic_algorithms_enabled())\n"
            "set_deterministic(False)\n"
            "print(torch.are_deterministic_algorithms_enabled())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "False"]
