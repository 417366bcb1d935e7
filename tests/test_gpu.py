"""GPU paths (skipped without CUDA): device placement, CUDA training, several workers on one GPU, local
steps that never wait for the host, captured steps, reduced precision, MPS."""
import contextlib
import json
import re
import shutil

import pytest
import torch

from conftest import final_model, metrics, run_debug, run_mpi, tiny, watch_local_steps
from mpifed.registry import ALGORITHMS

pytestmark = [pytest.mark.gpu, pytest.mark.e2e,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_deterministic_mode_gives_identical_gpu_runs(tmp_path):
    for name in ("a", "b"):
        run_debug(tiny(tmp_path, "resources.device=cuda", "resources.deterministic=true",
                       "algorithm.name=fedcsd", name=name))
    a, b = final_model(tmp_path / "runs" / "a"), final_model(tmp_path / "runs" / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cuda_training_matches_cpu_closely(tmp_path):
    run_debug(tiny(tmp_path, "resources.device=cuda", name="gpu"))
    run_debug(tiny(tmp_path, "resources.device=cpu", name="cpu"))
    gpu, cpu = final_model(tmp_path / "runs" / "gpu"), final_model(tmp_path / "runs" / "cpu")
    worst = max((gpu[k].double() - cpu[k].double()).abs().max().item() for k in gpu)
    assert worst < 1e-3, worst
    gpu, cpu = (metrics(tmp_path / "runs" / name)[-1]["test_acc"] for name in ("gpu", "cpu"))
    assert abs(gpu - cpu) <= 0.02


@pytest.mark.mpi
def test_workers_share_the_gpus_and_the_server_stays_on_cpu(has_mpirun, tmp_path):
    p = run_mpi(4, [*tiny(tmp_path, "resources.device=cuda", "algorithm.name=fedcsd"), "--verbose"])
    devices = dict(re.findall(r"rank (\d) \((?:server|worker)\): host \S+ pid \d+ device (\S+)", p.stdout))
    gpus = torch.cuda.device_count()
    assert devices["0"] == "cpu"
    assert [devices[str(r)] for r in (1, 2, 3)] == [f"cuda:{i % gpus}" for i in range(3)]
    assert json.loads((tmp_path / "runs" / "run" / "summary.json").read_text())["status"] == "finished"


@pytest.mark.mpi
def test_server_on_gpu(has_mpirun, tmp_path):
    p = run_mpi(3, [*tiny(tmp_path, "resources.device=cuda", "resources.server_device=cuda", "algorithm.name=fedcad",
                        "data.server_holdout_per_class=3"), "--verbose"])
    assert "rank 0 (server): host" in p.stdout and re.search(r"rank 0 \(server\).*device cuda:0", p.stdout)


# ------------------------------------------------------------------ local steps (issue 27)
AUGMENT = ["data.augment.crop_padding=2", "data.augment.flip=true", "data.augment.rotation=10", "data.augment.cutout=4",
           "data.dataset.channels=3", "data.dataset.size=12", "train.grad_clip=1.0"]
HOLDOUT = {name: ["data.server_holdout_per_class=3"] for name in ALGORITHMS.names()
           if ALGORITHMS.get(name).needs_server_data}


CAPTURING = [name for name in ALGORITHMS.names() if not ALGORITHMS.get(name).Client.eager_reason()]   # as declared


@contextlib.contextmanager
def sync_is_an_error():
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("method", sorted(ALGORITHMS.names()))
def test_no_local_step_waits_for_the_host(method, tmp_path, monkeypatch):
    """Each method's step and batch making (augmentation on) run under
    torch.cuda.set_sync_debug_mode("error"): any wait of the host for the GPU fails the run."""
    watch_local_steps(monkeypatch, sync_is_an_error)
    run_debug(tiny(tmp_path, "resources.device=cuda", f"algorithm.name={method}", "train.rounds=2", *AUGMENT,
                   *HOLDOUT.get(method, [])))


def test_no_text_step_waits_for_the_host(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from textdata import text_run
    watch_local_steps(monkeypatch, sync_is_an_error)
    run_debug(text_run(tmp_path, "resources.device=cuda", "algorithm.name=fedgkd", "train.rounds=2"))


@pytest.mark.parametrize("method", CAPTURING)
def test_captured_steps_agree_with_eager_ones(method, tmp_path):
    extra = ["resources.device=cuda", f"algorithm.name={method}", "train.local_epochs=2", *AUGMENT,
             *HOLDOUT.get(method, [])]
    captured = run_debug(tiny(tmp_path, *extra, "resources.cuda_graphs=on", name="graphs"))
    run_debug(tiny(tmp_path, *extra, "resources.cuda_graphs=off", name="eager"))
    assert "local step captured" in captured.stdout
    graphs, eager = final_model(tmp_path / "runs" / "graphs"), final_model(tmp_path / "runs" / "eager")
    worst = max((graphs[k].double() - eager[k].double()).abs().max().item() for k in graphs)
    assert worst < 1e-3, worst
    graph_acc, eager_acc = (metrics(tmp_path / "runs" / name)[-1]["test_acc"] for name in ("graphs", "eager"))
    assert abs(graph_acc - eager_acc) <= 0.02


def test_an_uncapturable_method_says_so_and_trains_eagerly(tmp_path):
    p = run_debug(tiny(tmp_path, "resources.device=cuda", "resources.cuda_graphs=on", "algorithm.name=fedproto"))
    assert "FedProtoClient's local step is not captured (collects per-client sums after each batch" in p.stdout


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_reduced_precision_trains_close_to_fp32(precision, tmp_path):
    run_debug(tiny(tmp_path, "resources.device=cuda", f"resources.precision={precision}", name=precision))
    run_debug(tiny(tmp_path, "resources.device=cuda", name="fp32"))
    low, full = metrics(tmp_path / "runs" / precision)[-1], metrics(tmp_path / "runs" / "fp32")[-1]
    assert abs(low["test_acc"] - full["test_acc"]) <= 0.05 and abs(low["test_loss"] - full["test_loss"]) <= 0.05


@pytest.mark.mpi
def test_mps_daemon_for_workers_sharing_a_gpu(has_mpirun, tmp_path):
    if shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("nvidia-cuda-mps-control not installed")
    p = run_mpi(4, tiny(tmp_path, "resources.device=cuda", "resources.mps=on"))
    assert "MPS" in p.stderr and "stopped" in p.stderr
    assert json.loads((tmp_path / "runs" / "run" / "summary.json").read_text())["status"] == "finished"
