"""Every registered method: MPI equals debug, and its own term really acts.

Each method declares its :class:`~mpifed.algorithms.base.Switches`: options under which its
extra term is active (``on``) and options under which it must reduce exactly to a reference run
(``off``, ``reference``). A method whose term never fires fails the "on" half; one whose term
leaks when switched off fails the "off" half.
"""
import dataclasses

import pytest

from conftest import assert_same_model, final_model, metrics, run_debug, run_mpi_series, tiny
from mpifed.registry import ALGORITHMS

METHODS = sorted(n for n, cls in ALGORITHMS.items().items() if cls.__module__.startswith("mpifed.algorithms."))


def switches(name):
    return ALGORITHMS.get(name).switches


def settings(name, options):
    return (f"algorithm.name={name}", *options, "train.rounds=3")


def test_every_switch_names_an_option_of_its_method():
    for name in METHODS:
        cls, sw = ALGORITHMS.get(name), switches(name)
        keys = {f.name for f in dataclasses.fields(cls.Options)} if dataclasses.is_dataclass(cls.Options) else set()
        for option in (*sw.on, *(sw.off or ())):
            key = option.split("=", 1)[0]
            if key.startswith("algorithm."):
                assert key.removeprefix("algorithm.") in keys, f"{name}: switch {option} names no option of the method"


@pytest.mark.e2e
@pytest.mark.parametrize("name", [n for n in METHODS if switches(n).off is not None])
def test_the_method_term_acts(shared_run, name):
    sw = switches(name)
    ref = final_model(shared_run(*sw.reference, "train.rounds=3"))
    assert_same_model(final_model(shared_run(*settings(name, sw.off))), ref, atol=1e-5)
    with pytest.raises(AssertionError):
        assert_same_model(final_model(shared_run(*settings(name, sw.on))), ref, atol=1e-4)


@pytest.fixture(scope="module")
def mpi_runs(has_mpirun, shared_run, tmp_path_factory):
    """{method: (its run with 3 ranks and its switches on, the run's directory)}, all the runs in one MPI job."""
    tmp = tmp_path_factory.mktemp("mpi")
    runs = [tiny(tmp, *settings(n, switches(n).on), f"data.prepared_root={shared_run.data}", name=n) for n in METHODS]
    return {n: (p, tmp / "runs" / n) for n, p in zip(METHODS, run_mpi_series(3, runs, tmp))}


@pytest.mark.mpi
@pytest.mark.e2e
@pytest.mark.parametrize("name", METHODS)
def test_method_mpi_equals_debug(mpi_runs, shared_run, name):
    p, b = mpi_runs[name]
    assert p.returncode == 0, f"the MPI run of {name} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    a = shared_run(*settings(name, switches(name).on))
    assert_same_model(final_model(a), final_model(b), atol=1e-6)
    assert [r["test_acc"] for r in metrics(a)] == [r["test_acc"] for r in metrics(b)]


@pytest.mark.e2e
def test_fedntd_with_one_local_step_a_round_is_fedavg(tmp_path):
    """Each client's only step starts from the global model, where FedNTD's distillation term and its
    gradient vanish (test_losses): the scaled App. G.1 sweep's E = 1 (one batch per client) runs FedAvg."""
    one_step = ("train.local_epochs=1", "train.batch_size=100", "train.rounds=3")    # each client holds < 100 samples
    run_debug(tiny(tmp_path, "algorithm.name=fedavg", *one_step, name="fedavg"))
    run_debug(tiny(tmp_path, "algorithm.name=fedntd", *one_step, name="fedntd"))
    assert_same_model(final_model(tmp_path / "runs" / "fedntd"), final_model(tmp_path / "runs" / "fedavg"), atol=1e-6)
