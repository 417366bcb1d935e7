"""Every method trains on text (dict batches through the same worker path as images); under mpirun
the text runs equal the debug runs for one method of each kind of message (plain model averaging,
server statistics and a teacher, per-client rows, client state)."""
import math

import numpy as np
import pytest

from conftest import assert_same_model, final_model, metrics, run_debug, run_mpi
from textdata import text_run
from mpifed.registry import ALGORITHMS

pytest.importorskip("transformers")
pytestmark = pytest.mark.e2e

EXTRA = ["train.participation=0.75", "train.optimizer=sgd", "train.lr=0.05"]   # FedNova needs SGD


@pytest.mark.parametrize("method", ALGORITHMS.names())
def test_every_method_trains_on_text(tmp_path, method):
    run_debug(text_run(tmp_path, f"algorithm.name={method}", *EXTRA, name="debug"))
    rows = metrics(tmp_path / "runs" / "debug")
    assert rows and all(math.isfinite(r["train_loss"]) and 0 <= r["test_acc"] <= 1 for r in rows)


@pytest.mark.mpi
@pytest.mark.parametrize("method", ["fedavg", "fedcsd", "feddistill_plus", "moon"])
def test_method_on_text_mpi_equals_debug(has_mpirun, tmp_path, method):
    extra = [f"algorithm.name={method}", *EXTRA]
    run_debug(text_run(tmp_path, *extra, name="debug"))
    run_mpi(3, text_run(tmp_path, *extra))
    mpi, debug = tmp_path / "runs" / "run", tmp_path / "runs" / "debug"
    assert_same_model(final_model(mpi), final_model(debug), atol=1e-6)
    a, b = metrics(mpi), metrics(debug)
    assert [r["test_acc"] for r in a] == [r["test_acc"] for r in b]
    assert np.allclose([r["test_loss"] for r in a], [r["test_loss"] for r in b], rtol=1e-6)
