"""Client-level evaluation (data.client_holdout): each client's held-out rows, the global model's
accuracy on them per client, their summary, the MPI run equal to the debug run, and the figure."""
import json

import numpy as np
import pytest
import torch

from conftest import metrics, run_debug, run_mpi, tiny
from mpifed.data.store import holdout_size, holdout_split
from mpifed.local.evaluation import client_figures
from mpifed.data.prepared import Manifest


def test_a_clients_held_out_rows_are_its_own_fixed_and_leave_it_some_to_train():
    assert [holdout_size(n, 0.2) for n in (0, 1, 2, 3, 10, 11)] == [0, 0, 1, 1, 2, 2]
    assert holdout_size(10, 0.0) == 0 and holdout_size(2, 0.9) == 1
    train, held = holdout_split(50, 0.2, cid=7)
    assert len(held) == 10 and len(train) == 40 and not set(train) & set(held)
    assert sorted([*train, *held]) == list(range(50)) and list(train) == sorted(train)
    again_train, again_held = holdout_split(50, 0.2, cid=7)
    assert list(again_held) == list(held) and list(holdout_split(50, 0.2, cid=8)[1]) != list(held)


def test_client_figures_summarise_the_clients_that_hold_rows_out():
    held = np.array([10, 0, 5, 20, 10, 4, 10, 10, 10, 10, 10])
    correct = np.array([5, 0, 5, 4, 10, 1, 10, 10, 10, 10, 10], dtype=np.float64)
    figures = client_figures({"client_correct": torch.from_numpy(correct),
                              "client_loss": torch.from_numpy(np.ones(11))}, held)
    accs = [0.5, 1.0, 0.2, 1.0, 0.25, 1.0, 1.0, 1.0, 1.0, 1.0]           # client 1 holds nothing out
    assert figures["per_client_acc"][:3] == [0.5, None, 1.0]
    assert figures["client_acc"]["mean"] == pytest.approx(np.mean(accs))
    assert figures["client_acc"]["std"] == pytest.approx(np.std(accs))
    assert figures["client_acc"]["min"] == 0.2 and figures["client_acc"]["median"] == 1.0
    assert figures["client_acc"]["worst10"] == pytest.approx(0.2)         # 10% of 10 clients: the worst one
    assert figures["client_loss"] == pytest.approx(11 / held.sum())
    assert client_figures({"client_correct": torch.zeros(2), "client_loss": torch.zeros(2)}, np.zeros(2, int)) == {}


def _client_acc(run):
    return [json.loads(line) for line in (run / "client_acc.jsonl").read_text().splitlines()]


@pytest.mark.e2e
def test_a_run_with_client_holdout_trains_on_the_rest_and_logs_each_client(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=2", "data.client_holdout=0.25", name="held"))
    run, rows = tmp_path / "runs" / "held", metrics(tmp_path / "runs" / "held")
    assert {"mean", "std", "median", "min", "worst10"} == set(rows[-1]["client_acc"])
    assert "per_client_acc" not in rows[-1]                  # in client_acc.jsonl instead
    per_client = _client_acc(run)
    assert [r["round"] for r in per_client] == [1, 2] and len(per_client[-1]["acc"]) == 5
    assert np.mean(per_client[-1]["acc"]) == pytest.approx(rows[-1]["client_acc"]["mean"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_client_acc"] == rows[-1]["client_acc"]
    sizes = Manifest.load(next((tmp_path / "data").glob("*/manifest.json")).parent).client_sizes
    trained = {c["cid"]: c["samples"] for line in (run / "clients.jsonl").read_text().splitlines()
               for c in json.loads(line)["clients"]}
    assert trained == {k: int(n) - holdout_size(int(n), 0.25) for k, n in enumerate(sizes)}


@pytest.mark.mpi
def test_client_evaluation_under_mpi_equals_the_debug_run_and_resumes(has_mpirun, tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=2", "data.client_holdout=0.25", name="debug"))
    run_mpi(3, tiny(tmp_path, "train.rounds=2", "data.client_holdout=0.25", name="mpi"))
    run_debug(tiny(tmp_path, "train.rounds=1", "data.client_holdout=0.25", name="resumed"))
    run_debug(["--resume", str(tmp_path / "runs" / "resumed"), "--set", "train.rounds=2"])
    for other in ("mpi", "resumed"):
        assert metrics(tmp_path / "runs" / other) == metrics(tmp_path / "runs" / "debug"), other
        assert _client_acc(tmp_path / "runs" / other) == _client_acc(tmp_path / "runs" / "debug"), other


@pytest.mark.e2e
def test_the_report_draws_each_clients_accuracy(tmp_path):
    pytest.importorskip("matplotlib")
    from mpifed.entry.report import main as report_main
    run_debug(tiny(tmp_path, "train.rounds=1", "data.client_holdout=0.25", name="held"))
    assert report_main([str(tmp_path / "runs" / "held"), "--out", str(tmp_path / "report"), "--format", "pdf"]) == 0
    assert (tmp_path / "report" / "runs-clients.pdf").stat().st_size > 1000
