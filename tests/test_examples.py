"""The worked examples of docs/methods.md (examples/*.py), one per hook family: each trains as a
plugin in the debug mode, and those that keep state (a client's, the server's) resume exactly."""
import importlib.util

import pytest
import torch

from conftest import REPO, metrics, run_debug, tiny

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("unload_plugins")]

EXAMPLES = {"loss_only.py": "smooth_decay", "client_state.py": "personal_prox", "robust_server.py": "trimmed_mean",
            "own_message.py": "prior_adjust"}


def test_every_example_is_listed_here():
    assert sorted(p.name for p in (REPO / "examples").glob("*.py")) == sorted(EXAMPLES)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_example_trains_and_resumes_exactly(tmp_path, example):
    method = ["--plugin", str(REPO / "examples" / example)]
    sets = ("train.rounds=3", f"algorithm.name={EXAMPLES[example]}", "run.checkpoint_every=1")
    run_debug(tiny(tmp_path, *sets, name="whole") + method)
    whole = metrics(tmp_path / "runs" / "whole")
    assert len(whole) == 3 and all(r["test_acc"] > 0 for r in whole)
    run_debug(tiny(tmp_path, *sets, "train.rounds=2", name="cut") + method)
    run_debug(["--resume", str(tmp_path / "runs" / "cut"), "--set", "train.rounds=3"] + method)
    assert metrics(tmp_path / "runs" / "cut") == whole


def test_the_trimmed_mean_drops_each_coordinates_extremes():
    spec = importlib.util.spec_from_file_location("robust_server_example", REPO / "examples" / "robust_server.py")
    module = importlib.util.module_from_spec(spec)
    from mpifed.registry import ALGORITHMS
    try:
        spec.loader.exec_module(module)
        rows = torch.tensor([[0.0, 10.0], [1.0, 1.0], [2.0, 2.0], [100.0, 3.0]], dtype=torch.float64)
        assert module.trimmed_mean(rows, 0.25).tolist() == [1.5, 2.5]     # drops 0 and 100, then 1 and 10
        assert torch.equal(module.trimmed_mean(rows, 0.0), rows.mean(dim=0))
    finally:
        ALGORITHMS.forget("trimmed_mean")
