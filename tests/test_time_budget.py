"""system.time_budget: a run on the virtual clock ends with the first round (or asynchronous server
step) that brings the simulated clock to the budget, evaluates it, is finished, and resumes to a
larger budget as the run with that budget never stopped."""
import json

import pytest

from conftest import final_model, assert_same_model, metrics, run_debug, tiny
from mpifed.settings import config
from mpifed.settings.fingerprint import result_fingerprint

CLOCK = ("system.clock=true", "system.speed_sigma=0.5", "system.bandwidth=100000", "system.dropout=0.2",
         "run.eval_every=10", "run.checkpoint_every=2")
FEDBUFF = ("aggregation.name=fedbuff", "aggregation.buffer=2", "aggregation.concurrency=3")


def _between(rows, after):
    """A budget that the round ``after`` (1-based) spends and the one before does not."""
    return (rows[after - 2]["sim_clock"] + rows[after - 1]["sim_clock"]) / 2


@pytest.mark.parametrize("aggregation", [(), FEDBUFF], ids=["sync", "fedbuff"])
def test_the_run_ends_evaluated_with_the_round_that_spends_the_budget(tmp_path, aggregation):
    run_debug(tiny(tmp_path, *CLOCK, *aggregation, "train.rounds=6", name="free"))
    free = metrics(tmp_path / "runs" / "free")
    budget = _between(free, 4)
    run_debug(tiny(tmp_path, *CLOCK, *aggregation, "train.rounds=50", f"system.time_budget={budget}", name="budget"))
    run = tmp_path / "runs" / "budget"
    rows = metrics(run)
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["sim_clock"] >= budget > rows[-2]["sim_clock"]
    assert "test_acc" in rows[-1] and "test_acc" not in rows[-2]
    assert [r["train_loss"] for r in rows] == [r["train_loss"] for r in free[:4]]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["rounds_done"] == 4 and status["sim_clock"] == rows[-1]["sim_clock"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_test_acc"] == rows[-1]["test_acc"]


def test_a_finished_budget_has_nothing_to_resume_and_a_larger_one_trains_on_exactly(tmp_path):
    run_debug(tiny(tmp_path, *CLOCK, "train.rounds=7", name="free"))
    free = metrics(tmp_path / "runs" / "free")
    small, large = _between(free, 3), _between(free, 6)
    run_debug(tiny(tmp_path, *CLOCK, "train.rounds=50", f"system.time_budget={small}", name="cut"))
    run_debug(tiny(tmp_path, *CLOCK, "train.rounds=50", f"system.time_budget={large}", name="full"))
    cut = tmp_path / "runs" / "cut"
    again = run_debug(["--resume", str(cut)])
    assert "nothing to resume" in again.stdout and "system.time_budget=<more than" in again.stdout
    run_debug(["--resume", str(cut), "--set", f"system.time_budget={large}"])
    full = tmp_path / "runs" / "full"
    assert_same_model(final_model(cut), final_model(full))
    assert [r["round"] for r in metrics(cut)] == [1, 2, 3, 4, 5, 6]
    assert [{k: v for k, v in r.items() if k not in ("test_acc", "test_loss", "per_class_acc")}
            for r in metrics(cut)] == [{k: v for k, v in r.items() if k not in ("test_acc", "test_loss",
                                                                                "per_class_acc")}
                                       for r in metrics(full)]


@pytest.mark.unit
def test_a_budget_needs_the_clock_and_is_part_of_the_results_identity():
    with pytest.raises(config.ConfigError, match="time_budget"):
        config.load(None, ["system.time_budget=100"])
    cfg, resolved = config.load(None, ["system.clock=true", "system.time_budget=100"])
    _, plain = config.load(None, ["system.clock=true"])
    assert result_fingerprint(resolved)["system"]["time_budget"] == 100
    assert "time_budget" not in result_fingerprint(plain).get("system", {})
    assert config.math_fingerprint(resolved) == config.math_fingerprint(plain)
