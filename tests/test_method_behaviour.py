"""Every registered method: MPI equals debug, and its own term really acts.

Each method declares its :class:`~mpifed.algorithms.base.Switches`: options under which its
extra term is active (``on``) and options under which it must reduce exactly to a reference run
(``off``, ``reference``). A method whose term never fires fails the "on" half; one whose term
leaks when switched off fails the "off" half.
"""
import dataclasses

import pytest

from conftest import assert_same_model, final_model, metrics, run_debug, run_mpi, tiny
from mpifed.registry import ALGORITHMS

METHODS = sorted(n for n, cls in ALGORITHMS.items().items() if cls.__module__.startswith("mpifed.algorithms."))


def switches(name):
    return ALGORITHMS.get(name).switches


def args(tmp, name, options, run_name):
    return tiny(tmp, f"algorithm.name={name}", *options, "train.rounds=3", name=run_name)


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
def test_the_method_term_acts(tmp_path, name):
    sw = switches(name)
    run_debug(tiny(tmp_path, *sw.reference, "train.rounds=3", name="reference"))
    ref = final_model(tmp_path / "runs" / "reference")
    run_debug(args(tmp_path, name, sw.off, "off"))
    assert_same_model(final_model(tmp_path / "runs" / "off"), ref, atol=1e-5)
    run_debug(args(tmp_path, name, sw.on, "on"))
    with pytest.raises(AssertionError):
        assert_same_model(final_model(tmp_path / "runs" / "on"), ref, atol=1e-4)


@pytest.mark.mpi
@pytest.mark.e2e
@pytest.mark.parametrize("name", METHODS)
def test_method_mpi_equals_debug(has_mpirun, tmp_path, name):
    on = switches(name).on
    run_debug(args(tmp_path, name, on, "debug"))
    run_mpi(3, args(tmp_path, name, on, "mpi"))
    a, b = tmp_path / "runs" / "debug", tmp_path / "runs" / "mpi"
    assert_same_model(final_model(a), final_model(b), atol=1e-6)
    assert [r["test_acc"] for r in metrics(a)] == [r["test_acc"] for r in metrics(b)]
