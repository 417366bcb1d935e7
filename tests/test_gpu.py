"""GPU paths (skipped without CUDA): device placement, CUDA training, several workers on one GPU."""
import json
import re

import pytest
import torch

from conftest import final_model, metrics, run_debug, run_mpi, tiny

pytestmark = [pytest.mark.gpu, pytest.mark.e2e, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_deterministic_mode_gives_identical_gpu_runs(tmp_path):
    for name in ("a", "b"):
        run_debug(tiny(tmp_path, "resources.device=cuda", "resources.deterministic=true", "algorithm.name=fedcsd", name=name))
    a, b = final_model(tmp_path / "runs" / "a"), final_model(tmp_path / "runs" / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_cuda_training_matches_cpu_closely(tmp_path):
    run_debug(tiny(tmp_path, "resources.device=cuda", name="gpu"))
    run_debug(tiny(tmp_path, "resources.device=cpu", name="cpu"))
    gpu, cpu = final_model(tmp_path / "runs" / "gpu"), final_model(tmp_path / "runs" / "cpu")
    worst = max((gpu[k].double() - cpu[k].double()).abs().max().item() for k in gpu)
    assert worst < 1e-3, worst
    assert abs(metrics(tmp_path / "runs" / "gpu")[-1]["test_acc"] - metrics(tmp_path / "runs" / "cpu")[-1]["test_acc"]) <= 0.02


@pytest.mark.mpi
def test_workers_share_the_gpus_and_the_server_stays_on_cpu(has_mpirun, tmp_path):
    p = run_mpi(4, tiny(tmp_path, "resources.device=cuda", "algorithm.name=fedcsd"))
    devices = dict(re.findall(r"rank (\d) \((?:server|worker)\): host \S+ pid \d+ device (\S+)", p.stdout))
    gpus = torch.cuda.device_count()
    assert devices["0"] == "cpu"
    assert [devices[str(r)] for r in (1, 2, 3)] == [f"cuda:{i % gpus}" for i in range(3)]
    assert json.loads((tmp_path / "runs" / "run" / "summary.json").read_text())["status"] == "finished"


@pytest.mark.mpi
def test_server_on_gpu(has_mpirun, tmp_path):
    p = run_mpi(3, tiny(tmp_path, "resources.device=cuda", "resources.server_device=cuda", "algorithm.name=fedcad",
                        "data.server_holdout_per_class=3"))
    assert "rank 0 (server): host" in p.stdout and re.search(r"rank 0 \(server\).*device cuda:0", p.stdout)
