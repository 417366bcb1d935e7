"""Server optimisers in real runs: ``sgdm`` equals ``fedavgm``; a run with ``adam`` stopped and resumed
equals the run never stopped, in the debug mode and under ``mpirun -n 3``, whose runs equal the debug
run bit for bit; a method whose aggregation skips the server's step is stopped with the fix."""
import pytest
import torch

from conftest import assert_same_model, final_model, metrics, run_debug, run_mpi_series, tiny
from mpifed.run import checkpoint

pytestmark = pytest.mark.e2e

ADAM = ("server_optimizer.name=adam", "server_optimizer.lr=0.02", "train.participation=0.6")


def adam_run(tmp, *extra, name):
    return tiny(tmp, "train.rounds=4", "run.checkpoint_every=2", *ADAM, *extra, name=name)


@pytest.fixture(scope="module")
def adam_debug(tmp_path_factory):
    """The uninterrupted debug-mode run with adam, and the folder it lives under."""
    tmp = tmp_path_factory.mktemp("adam")
    run_debug(adam_run(tmp, name="full"))
    return tmp


def test_sgdm_is_fedavgm_bit_for_bit(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=3", "server_optimizer.name=sgdm", "server_optimizer.lr=0.7",
                   "server_optimizer.momentum=0.9", name="sgdm"))
    run_debug(tiny(tmp_path, "train.rounds=3", "algorithm.name=fedavgm", "algorithm.beta=0.9",
                   "algorithm.server_lr=0.7", "algorithm.buffers=average", name="fedavgm"))
    runs = tmp_path / "runs"
    assert_same_model(final_model(runs / "sgdm"), final_model(runs / "fedavgm"))
    assert metrics(runs / "sgdm") == metrics(runs / "fedavgm")
    run_debug(tiny(tmp_path, "train.rounds=3", name="fedavg"))
    assert metrics(runs / "fedavg") != metrics(runs / "sgdm")       # the momentum did change the run


def test_adam_stopped_and_resumed_equals_uninterrupted_debug(adam_debug, tmp_path):
    p = run_debug(adam_run(tmp_path, "train.rounds=2", name="cut"))
    assert "server optimizer adam (lr 0.02, beta1 0.9, beta2 0.99, tau 0.001)" in p.stdout + p.stderr
    cut = tmp_path / "runs" / "cut"
    saved = checkpoint.load_run_state(checkpoint.latest(cut / "checkpoints"))["server_optimizer"]
    assert set(saved) == {"m", "v"} and all(isinstance(t, torch.Tensor) for t in saved.values())
    run_debug(["--resume", str(cut), "--set", "train.rounds=4"])
    full = adam_debug / "runs" / "full"
    assert_same_model(final_model(cut), final_model(full))
    assert metrics(cut) == metrics(full)
    run_debug(tiny(tmp_path, "train.rounds=4", "train.participation=0.6", name="fedavg"))
    assert metrics(tmp_path / "runs" / "fedavg") != metrics(full)    # adam did change the run


@pytest.mark.mpi
def test_adam_under_mpirun_equals_debug_and_resumes_exactly(has_mpirun, adam_debug, tmp_path):
    cut = tmp_path / "runs" / "cut"
    done = run_mpi_series(3, [adam_run(tmp_path, name="full"), adam_run(tmp_path, "train.rounds=2", name="cut"),
                              ["--resume", str(cut), "--set", "train.rounds=4"]], tmp_path / "series")
    for p in done:
        assert p.returncode == 0, f"mpirun -n 3 failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    debug = adam_debug / "runs" / "full"
    for run in (tmp_path / "runs" / "full", cut):
        assert_same_model(final_model(run), final_model(debug))
        assert metrics(run) == metrics(debug)


SKIPPING = '''
from mpifed.algorithms.base import Algorithm, Server
from mpifed.registry import ALGORITHMS


class MeanServer(Server):
    def aggregate(self, server_round, weights, replies):
        return (replies.sums.model / replies.sums.weight).float()


@ALGORITHMS.register("skips_the_step")
class SkipsTheStep(Algorithm):
    Server = MeanServer
'''


def test_a_method_that_skips_the_servers_step_is_stopped_with_the_fix(tmp_path, unload_plugins):
    plugin = tmp_path / "skips.py"
    plugin.write_text(SKIPPING)
    p = run_debug(tiny(tmp_path, "algorithm.name=skips_the_step", "server_optimizer.name=adam", name="skips")
                  + ["--plugin", str(plugin)], check=False)
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert "MeanServer.aggregate (round 1) took no step of the server optimiser" in out, out[-2000:]
    assert "self.server_step(weights, its_aggregate)" in out and "own_server_step" in out
    run_debug(tiny(tmp_path, "algorithm.name=skips_the_step", name="default") + ["--plugin", str(plugin)])


def test_a_checkpoint_from_before_server_optimisers_resumes_and_refuses_another_optimiser(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=4", name="full"))
    run_debug(tiny(tmp_path, "train.rounds=2", name="old"))
    old = tmp_path / "runs" / "old"
    path = checkpoint.latest(old / "checkpoints")
    payload = checkpoint.load_run_state(path)
    assert payload.pop("server_optimizer") == {}                   # sgd keeps no state
    checkpoint.save(path.parent, payload["rounds_done"], payload, keep=2)
    p = run_debug(["--resume", str(old), "--set", "train.rounds=4", "server_optimizer.name=adam"], check=False)
    assert p.returncode == 2 and "server_optimizer" in p.stderr, p.stderr
    run_debug(["--resume", str(old), "--set", "train.rounds=4"])
    assert_same_model(final_model(old), final_model(tmp_path / "runs" / "full"))
    assert metrics(old) == metrics(tmp_path / "runs" / "full")
