import pytest

from conftest import assert_same_model, final_model, metrics, run_debug, tiny
from mpifed.algorithms.scaffold import effective_steps


def test_effective_steps_match_momentum_displacement():
    lr, beta, g = 0.1, 0.9, 1.0
    for k in (1, 5, 40):
        w, buf = 0.0, None
        for _ in range(k):
            buf = g if buf is None else beta * buf + g
            w -= lr * buf
        assert abs(-w / (lr * g) - effective_steps(k, beta)) < 1e-9
    assert effective_steps(7, 0.0) == 7.0


@pytest.mark.e2e
def test_feddyn_clients_mean_changes_what_is_evaluated_not_what_is_trained(tmp_path):
    common = ("algorithm.name=feddyn", "algorithm.alpha=0.1", "train.participation=0.6")
    run_debug(tiny(tmp_path, *common, name="server"))
    run_debug(tiny(tmp_path, *common, "algorithm.evaluate=clients_mean", name="mean"))
    server, mean = metrics(tmp_path / "runs" / "server"), metrics(tmp_path / "runs" / "mean")
    assert [r["train_loss"] for r in server] == [r["train_loss"] for r in mean]
    assert [r["test_loss"] for r in server] != [r["test_loss"] for r in mean]
    with pytest.raises(AssertionError):
        assert_same_model(final_model(tmp_path / "runs" / "server"), final_model(tmp_path / "runs" / "mean"), atol=1e-4)
