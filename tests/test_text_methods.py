"""Every method trains on text (dict batches through the same worker path as images); under mpirun
the text runs equal the debug runs for one method of each kind of message (plain model averaging,
server statistics and a teacher, per-client rows, client state)."""
import math

import numpy as np
import pytest

from conftest import assert_same_model, final_model, metrics, run_mpi_series
from textdata import text_run
from mpifed.registry import ALGORITHMS

pytest.importorskip("transformers")
pytestmark = pytest.mark.e2e

EXTRA = ["train.participation=0.75", "train.optimizer=sgd", "train.lr=0.05"]   # FedNova needs SGD


@pytest.mark.parametrize("method", ALGORITHMS.names())
def test_every_method_trains_on_text(shared_run, method):
    rows = metrics(shared_run(f"algorithm.name={method}", *EXTRA, args=text_run))
    assert rows and all(math.isfinite(r["train_loss"]) and 0 <= r["test_acc"] <= 1 for r in rows)


MPI_METHODS = ["fedavg", "fedcsd", "feddistill_plus", "moon"]


@pytest.fixture(scope="module")
def mpi_runs(has_mpirun, tmp_path_factory):
    """{method: (its text run with 3 ranks, the run's directory)}, all the runs in one MPI job."""
    tmp = tmp_path_factory.mktemp("mpi")
    runs = [text_run(tmp, f"algorithm.name={m}", *EXTRA, name=m) for m in MPI_METHODS]
    return {m: (p, tmp / "runs" / m) for m, p in zip(MPI_METHODS, run_mpi_series(3, runs, tmp))}


@pytest.mark.mpi
@pytest.mark.parametrize("method", MPI_METHODS)
def test_method_on_text_mpi_equals_debug(mpi_runs, shared_run, method):
    p, mpi = mpi_runs[method]
    assert p.returncode == 0, f"the MPI run of {method} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    debug = shared_run(f"algorithm.name={method}", *EXTRA, args=text_run)
    assert_same_model(final_model(mpi), final_model(debug), atol=1e-6)
    a, b = metrics(mpi), metrics(debug)
    assert [r["test_acc"] for r in a] == [r["test_acc"] for r in b]
    assert np.allclose([r["test_loss"] for r in a], [r["test_loss"] for r in b], rtol=1e-6)
