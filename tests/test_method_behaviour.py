"""Every registered method: MPI equals debug, and its own term really acts.

For each method, ``ON`` gives options under which its extra term is active and ``OFF``
options under which the method must reduce exactly to a reference run (FedAvg, unless
stated). A method whose term never fires fails the "on" half; one whose term leaks when
switched off fails the "off" half. A new method fails ``test_every_method_is_covered``
until it is listed here.
"""
import pytest

from conftest import assert_same_model, final_model, metrics, run_debug, run_mpi, tiny
from mpifed.registry import ALGORITHMS

HOLDOUT = "data.server_holdout_per_class=3"

# name -> (options that switch the method's term on, options that reduce it to the reference, reference run)
CASES = {
    "fedavg": ([], None, None),
    "fedprox": (["algorithm.mu=0.5"], ["algorithm.mu=0"], "fedavg"),
    "fedavgm": (["algorithm.beta=0.9"], ["algorithm.beta=0", "algorithm.server_lr=1"], "fedavg"),
    "scaffold": (["train.participation=0.6"], None, None),   # no weight to switch off: test_scaffold_* cover it
    "fedntd": (["algorithm.beta=1"], ["algorithm.beta=0"], "fedavg"),
    "fedgkd": (["algorithm.gamma=1", "algorithm.buffer_size=2"], ["algorithm.gamma=0"], "fedavg"),
    "fedgkd_plus": (["algorithm.gamma=1", "algorithm.projection_dim=16"], ["algorithm.gamma=0", "algorithm.projection_dim=16"],
                    "moon-off-projected"),
    "fedgkd_vote": (["algorithm.lam=0.5", "algorithm.buffer_size=2", HOLDOUT], ["algorithm.lam=0", HOLDOUT], "fedavg-holdout"),
    "fedcsd": (["algorithm.mu=0.5"], ["algorithm.mu=0"], "fedavg"),
    "fedcad": ([HOLDOUT], ["algorithm.beta=0", "algorithm.gamma=0", HOLDOUT], "fedavg-holdout"),
    "fedlsd": (["algorithm.alpha=0.3"], ["algorithm.alpha=0"], "fedavg"),
    "moon": (["algorithm.mu=2", "algorithm.projection_dim=16", "train.participation=0.6"],
             ["algorithm.mu=0", "algorithm.projection_dim=0", "train.participation=0.6"], "fedavg-partial"),
    "fednova": (["data.partition.beta=0.5"], ["data.partition=iid"], "fedavg-iid"),
    # baselines-b: FedProto, FedGen
    "fedproto": (["algorithm.lam=1"], ["algorithm.lam=0"], "fedavg"),
    "fedgen": (["algorithm.alpha=1", "algorithm.beta=1"], ["algorithm.alpha=0", "algorithm.beta=0"], "fedavg"),
}

REFERENCES = {
    "fedavg": ["algorithm.name=fedavg"],
    "fedavg-holdout": ["algorithm.name=fedavg", HOLDOUT],
    "fedavg-partial": ["algorithm.name=fedavg", "train.participation=0.6"],
    "fedavg-iid": ["algorithm.name=fedavg", "data.partition=iid"],
    "moon-off-projected": ["algorithm.name=moon", "algorithm.mu=0", "algorithm.projection_dim=16"],
}


def args(tmp, name, options, run_name):
    return tiny(tmp, f"algorithm.name={name}", *options, "train.rounds=3", name=run_name)


def reference_run(tmp, key):
    run_debug(tiny(tmp, *REFERENCES[key], "train.rounds=3", name=f"ref-{key}"))
    return final_model(tmp / "runs" / f"ref-{key}")


def test_every_method_is_covered():
    builtin = {n for n, cls in ALGORITHMS.items().items() if cls.__module__.startswith("mpifed.algorithms.")}
    assert set(CASES) == builtin, "list every registered method in CASES"


@pytest.mark.e2e
@pytest.mark.parametrize("name", [n for n, (_, off, _) in CASES.items() if off is not None])
def test_the_method_term_acts(tmp_path, name):
    on, off, reference = CASES[name]
    ref = reference_run(tmp_path, reference)
    run_debug(args(tmp_path, name, off, "off"))
    assert_same_model(final_model(tmp_path / "runs" / "off"), ref, atol=1e-5)
    run_debug(args(tmp_path, name, on, "on"))
    with pytest.raises(AssertionError):
        assert_same_model(final_model(tmp_path / "runs" / "on"), ref, atol=1e-4)


@pytest.mark.mpi
@pytest.mark.e2e
@pytest.mark.parametrize("name", sorted(CASES))
def test_method_mpi_equals_debug(has_mpirun, tmp_path, name):
    on = CASES[name][0]
    run_debug(args(tmp_path, name, on, "debug"))
    run_mpi(3, args(tmp_path, name, on, "mpi"))
    a, b = tmp_path / "runs" / "debug", tmp_path / "runs" / "mpi"
    assert_same_model(final_model(a), final_model(b), atol=1e-6)
    assert [r["test_acc"] for r in metrics(a)] == [r["test_acc"] for r in metrics(b)]
