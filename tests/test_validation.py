"""The validation split in runs, the evaluation of the last rounds, test subsets labelled, provenance."""
import json

import numpy as np
import pytest

from conftest import assert_same_model, final_model, metrics, run_debug, run_mpi, tiny
from mpifed.run import provenance

pytestmark = pytest.mark.e2e

VAL = ("data.val_size=30",)


@pytest.fixture(scope="module")
def val_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("val")
    p = run_debug(tiny(tmp, *VAL, "train.rounds=6", "run.eval_every=4", "run.eval_last=2", "data.test_subset=100"))
    return tmp / "runs" / "run", p.stdout


def test_validation_metrics_on_exactly_the_evaluated_rounds(val_run):
    run, _ = val_run
    rows = metrics(run)
    assert [r["round"] for r in rows if "test_acc" in r] == [4, 5, 6]   # every 4th, and each of the last 2
    assert [r["round"] for r in rows if "val_acc" in r] == [4, 5, 6]
    assert all(0 <= r["val_acc"] <= 1 and r["val_loss"] > 0 for r in rows if "val_acc" in r)


def test_summary_reports_the_round_chosen_on_validation_and_the_test_subset(val_run):
    run, out = val_run
    rows = metrics(run)
    summary = json.loads((run / "summary.json").read_text())
    evaluated = [r for r in rows if "val_acc" in r]
    best = max(r["val_acc"] for r in evaluated)
    first = next(r for r in evaluated if r["val_acc"] == best)
    assert summary["best_val_acc"] == best and summary["best_val_round"] == first["round"]
    assert summary["test_acc_at_best_val"] == first["test_acc"]
    assert summary["test_subset"] == 100
    assert "test set: first 100 of 120 samples (a subset: for quick runs only)" in out
    assert "test set: first 100 of 120" in (run / "log.txt").read_text()


def test_without_the_test_set_a_run_evaluates_validation_alone_with_the_same_numbers(val_run, tmp_path):
    run, _ = val_run
    p = run_debug(tiny(tmp_path, *VAL, "train.rounds=6", "run.eval_every=4", "run.eval_last=2", "data.test_subset=100",
                       "run.eval_test=false"))
    alone = tmp_path / "runs" / "run"
    rows, full = metrics(alone), metrics(run)
    assert not any(k.startswith("test_") or k == "per_class_acc" for r in rows for k in r)
    assert [(r["round"], r["val_acc"], r["val_loss"]) for r in rows if "val_acc" in r] == \
        [(r["round"], r["val_acc"], r["val_loss"]) for r in full if "val_acc" in r]
    summary = json.loads((alone / "summary.json").read_text())
    assert summary["final_test_acc"] is None and summary["test_acc_at_best_val"] is None
    assert summary["best_val_acc"] == json.loads((run / "summary.json").read_text())["best_val_acc"]
    assert "the test set not evaluated: run.eval_test is false" in p.stdout


def test_a_run_resumed_without_the_test_set_reports_no_earlier_test_figure(tmp_path):
    run_debug(tiny(tmp_path, *VAL, "train.rounds=2", "run.checkpoint_every=2"))
    run = tmp_path / "runs" / "run"
    p = run_debug(["--resume", str(run), "--set", "train.rounds=4", "run.eval_test=false"])
    assert [r["round"] for r in metrics(run) if "test_acc" in r] == [1, 2]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["best_val_acc"] is not None
    assert summary["final_test_acc"] is None and summary["best_test_acc"] is None and summary["forgetting"] is None
    assert "the test set not evaluated: run.eval_test is false" in p.stdout


def test_without_a_validation_set_rows_and_summary_say_nothing_of_it(tmp_path):
    p = run_debug(tiny(tmp_path))
    run = tmp_path / "runs" / "run"
    assert not any(k.startswith("val_") for r in metrics(run) for k in r)
    summary = json.loads((run / "summary.json").read_text())
    assert not {"best_val_acc", "best_val_round", "test_acc_at_best_val", "test_subset"} & set(summary)
    assert "test set:" not in p.stdout and "validation set" not in p.stdout
    assert [r["round"] for r in metrics(run) if "test_acc" in r] == [1, 2]


def test_provenance_is_written_at_start_and_extended_on_resume(tmp_path):
    run_debug(tiny(tmp_path, *VAL, "train.rounds=4", "run.checkpoint_every=2", name="full"))
    run_debug(tiny(tmp_path, *VAL, "train.rounds=2", "run.checkpoint_every=2", name="short"))
    short = tmp_path / "runs" / "short"
    first = provenance.read(short)
    assert len(first["segments"]) == 1
    segment = first["segments"][0]
    assert segment["start_round"] == 0 and segment["torch"] and segment["python"] and segment["mpifed"]
    assert [(r["rank"], r["device"], r["gpu"], r["threads"]) for r in segment["ranks"]] == [(0, "cpu", None, 1)]
    assert segment["ranks"][0]["cpu"] and segment["ranks"][0]["host"]
    run_debug(["--resume", str(short), "--set", "train.rounds=4"])
    resumed = provenance.read(short)
    assert resumed["segments"][0] == segment and [s["start_round"] for s in resumed["segments"]] == [0, 2]
    host, cpu, cpu_id = (segment["ranks"][0][k] for k in ("host", "cpu", "cpu_id"))
    assert cpu_id == provenance.cpu_id() and segment["ranks"][0]["blas"] == provenance.blas()
    shown = f"{cpu} ({cpu_id})" if cpu_id else cpu
    assert provenance.machine(resumed) == f"{host}; CPU {shown}; GPU none; torch {segment['torch']}"
    # the resumed run with a validation set continues exactly
    assert_same_model(final_model(short), final_model(tmp_path / "runs" / "full"))
    assert metrics(short) == metrics(tmp_path / "runs" / "full")
    assert [r["round"] for r in metrics(short) if "val_acc" in r] == [1, 2, 3, 4]


def test_machine_names_every_host_cpu_gpu_and_torch_version():
    found = {"segments": [
        {"torch": "2.1",
         "ranks": [{"host": "b", "cpu": "Xeon", "gpu": None}, {"host": "b", "cpu": "Xeon", "gpu": "H100"}]},
        {"torch": "2.1", "ranks": [{"host": "a", "cpu": "EPYC", "gpu": None}]}]}
    assert provenance.machine(found) == "a + b; CPU EPYC + Xeon; GPU H100; torch 2.1"
    masked = {"segments": [{"torch": "2.1", "ranks": [
        {"host": "vm", "cpu": "AMD EPYC", "cpu_id": "family 25 model 1 stepping 1 flags 0123456789"}]}]}
    other = {"segments": [{"torch": "2.1", "ranks": [
        {"host": "vm", "cpu": "AMD EPYC", "cpu_id": "family 23 model 49 stepping 0 flags 9876543210"}]}]}
    assert provenance.machine(masked) == ("vm; CPU AMD EPYC (family 25 model 1 stepping 1 flags 0123456789); "
                                          "GPU none; torch 2.1")
    assert provenance.machine(masked) != provenance.machine(other)       # a masked model name, two machines


def test_the_cpu_id_reads_family_model_stepping_and_a_digest_of_the_flags(tmp_path, monkeypatch):
    text = ("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
            "flags\t\t: fpu sse2 avx2\n\nprocessor\t: 1\ncpu family\t: 99\n")
    real = provenance.Path.read_text
    monkeypatch.setattr(provenance.Path, "read_text",
                        lambda self, *a, **k: text if str(self) == "/proc/cpuinfo" else real(self, *a, **k))
    found = provenance.cpu_id()
    assert found.startswith("family 25 model 1 stepping 1 flags ") and len(found.split()[-1]) == 10
    assert found.split()[-1] == __import__("hashlib").sha256(b"avx2 fpu sse2").hexdigest()[:10]   # flags sorted


@pytest.mark.mpi
def test_mpi_run_with_a_validation_set_equals_the_debug_run(has_mpirun, tmp_path):
    extra = (*VAL, "train.rounds=3", "run.eval_every=2", "run.eval_last=1")
    run_debug(tiny(tmp_path, *extra, name="debug"))
    run_mpi(3, tiny(tmp_path, *extra))
    a, b = metrics(tmp_path / "runs" / "run"), metrics(tmp_path / "runs" / "debug")
    assert_same_model(final_model(tmp_path / "runs" / "run"), final_model(tmp_path / "runs" / "debug"), atol=1e-6)
    for column in ("round", "test_acc", "val_acc"):
        assert [r.get(column) for r in a] == [r.get(column) for r in b]
    assert [r["round"] for r in a if "val_acc" in r] == [2, 3]
    for column in ("test_loss", "val_loss"):
        assert np.allclose([r[column] for r in a if column in r], [r[column] for r in b if column in r], rtol=1e-6)
    ranks = provenance.read(tmp_path / "runs" / "run")["segments"][0]["ranks"]
    assert [(r["rank"], r["role"]) for r in ranks] == [(0, "server"), (1, "worker"), (2, "worker")]
    run_mpi(3, tiny(tmp_path, *extra, "run.eval_test=false", name="val-only"))
    alone = metrics(tmp_path / "runs" / "val-only")
    assert ([(r["round"], r["val_acc"]) for r in alone if "val_acc" in r]
            == [(r["round"], r["val_acc"]) for r in b if "val_acc" in r])
    assert np.allclose([r["val_loss"] for r in alone if "val_loss" in r],
                       [r["val_loss"] for r in b if "val_loss" in r], rtol=1e-6)
    assert not any("test_acc" in r for r in alone)
