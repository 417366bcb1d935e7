"""The simulated federation in the round (system:, selection:; mpifed.round.timeline): off, the clients
are today's; on, the plan decides who trains and for how many steps, the records say what the clock
did, a resume equals the run never stopped, and the debug mode equals MPI with any rank count."""
import json
import pickle

import numpy as np
import pytest

from conftest import (assert_resumed_equals_uninterrupted, assert_same_model, final_model, metrics, run_debug,
                      run_mpi_series, tiny)
from mpifed.round.plan import sample_clients
from mpifed.round.timeline import Costs, Timeline, full_steps
from mpifed.settings import config

SIMULATED = ("data.num_clients=10", "train.participation=0.5", "train.local_epochs=2", "system.clock=true",
             "system.speed_sigma=0.5", "system.bandwidth=100000", "system.bandwidth_sigma=0.5", "system.dropout=0.2",
             "system.deadline=1.5", "system.overcommit=1.3", "system.stragglers=partial")
SELECTORS = ("uniform", "weighted", "oort", "pow_d")


def timeline(*sets: str, clients: int = 50) -> Timeline:
    cfg, _ = config.load(None, [f"data.num_clients={clients}", *sets])
    sizes = np.arange(clients) % 7 * 10 + 20
    return Timeline(cfg, sizes, Costs(passes=3, bytes_down=400_000, bytes_up=400_000))


@pytest.mark.parametrize("participation", [0.1, 0.5, 1.0])
def test_uniform_selection_without_the_clock_samples_todays_clients(participation):
    line = timeline(f"train.participation={participation}", "run.seed=7")
    for rnd in range(5):
        planned = line.plan(rnd)
        assert np.array_equal(planned.clients, sample_clients(7, rnd, 50, participation))
        assert planned.steps == {}


def test_local_work_draws_fewer_steps_keyed_by_round_and_client():
    full = full_steps(np.arange(50) % 7 * 10 + 20, 32, 2, 0)
    uniform = timeline("system.local_work=uniform", "train.participation=1.0")
    a, b = uniform.plan(0), timeline("system.local_work=uniform", "train.participation=1.0").plan(0)
    assert a.steps == b.steps and a.steps and all(1 <= n < full[c] for c, n in a.steps.items())
    straggler = timeline("system.local_work=straggler", "system.straggler_share=0.3", "train.participation=1.0")
    fewer = straggler.plan(0).steps
    assert 0 < len(fewer) < 30 and all(1 <= n < full[c] for c, n in fewer.items())


def test_the_clock_keeps_the_first_to_finish_and_cuts_stragglers():
    line = timeline("system.clock=true", "system.speed_sigma=1.0", "system.deadline=2.0", "system.overcommit=1.5",
                    "system.stragglers=partial", "train.participation=0.2")
    planned = line.plan(0)
    timing = planned.timing
    assert len(planned.sampled) == 15 and len(planned.clients) <= 10
    assert set(planned.steps) <= set(timing.stragglers)
    row = line.finished(0, [])
    assert row["sim_time"] == timing.sim_time and row["sim_clock"] == timing.sim_time
    assert row["bytes_down"] == 400_000 * 15 and row["stragglers"] == len(timing.stragglers)


def test_a_simulated_run_trains_the_planned_steps_and_records_the_clock(tmp_path):
    run_debug(tiny(tmp_path, *SIMULATED, "train.rounds=3", name="sim"))
    run = tmp_path / "runs" / "sim"
    rows = metrics(run)
    clients = _clients(run)
    assert [r["clients"] for r in rows] == [len(c) for c in clients]
    assert np.isclose(rows[-1]["sim_clock"], sum(r["sim_time"] for r in rows))
    assert all(r["sim_time"] <= 1.5 and r["bytes_up"] > 0 for r in rows)
    assert sum(r["stragglers"] for r in rows) > 0 and sum(r["dropped"] for r in rows) > 0
    seconds = [c["extra"]["sim_seconds"] for per_round in clients for c in per_round]
    assert max(seconds) <= 1.5 and min(seconds) > 0
    cut = [c for per_round in clients for c in per_round if c["extra"]["sim_seconds"] == 1.5]
    assert cut and all(c["steps"] < 2 * -(-c["samples"] // 16) for c in cut)   # partial: fewer than 2 epochs


def test_a_round_that_no_client_finishes_keeps_the_model(tmp_path):
    run_debug(tiny(tmp_path, "system.clock=true", "system.deadline=0.001", "train.rounds=2", name="empty"))
    rows = metrics(tmp_path / "runs" / "empty")
    assert [r["clients"] for r in rows] == [0, 0] and rows[0]["stragglers"] == 5
    assert rows[0]["test_loss"] == rows[1]["test_loss"] and rows[1]["sim_clock"] == 0.002


def test_a_round_no_client_answers_after_an_evaluated_one_does_not_change_what_the_next_trains_from(tmp_path):
    """An evaluation leaves the global model on every rank, so the next downlink need not send it; a round in
    which nobody answers keeps the model but evaluates nothing, and the round after it must still get the model
    (a crash in FedGKD's run of issue 78's table, round 37). Evaluating less often changes no number."""
    sets = ("system.clock=true", "system.dropout=0.7", "train.participation=0.4", "train.rounds=10")
    every, sparse = (tiny(tmp_path, *sets, f"run.eval_every={k}", name=f"every-{k}") for k in (1, 2))
    run_debug(every)
    run_debug(sparse)
    rows = metrics(tmp_path / "runs" / "every-2")
    evaluated = [r["round"] for r in rows if "test_acc" in r]
    empty = {r["round"] for r in rows if r["clients"] == 0}
    assert any(r + 1 in empty and r + 2 <= 10 for r in evaluated), "the seed gives no empty round after an evaluation"
    assert_same_model(final_model(tmp_path / "runs" / "every-1"), final_model(tmp_path / "runs" / "every-2"))


@pytest.mark.parametrize("extra", [("selection.name=oort", "selection.pacer_step=1"),
                                   ("selection.name=weighted", "algorithm.name=scaffold")],   # client state too
                         ids=["oort", "scaffold-weighted"])
def test_on_the_clock_resumed_equals_the_run_never_stopped(tmp_path, extra):
    sets = (*SIMULATED, *extra)
    assert_resumed_equals_uninterrupted(tmp_path / "runs", tiny(tmp_path, *sets, "train.rounds=6", name="full"),
                                        tiny(tmp_path, *sets, "train.rounds=3", name="cut"), rounds=6)


@pytest.mark.mpi
@pytest.mark.e2e
@pytest.mark.parametrize("ranks", [3, 4])
def test_the_simulated_federation_under_mpi_equals_the_debug_mode(has_mpirun, tmp_path, ranks):
    runs = {name: tiny(tmp_path, *SIMULATED, "train.rounds=3", f"selection.name={name}",
                       name=f"{ranks}-{name}") for name in SELECTORS}
    for name in SELECTORS:
        run_debug(tiny(tmp_path, *SIMULATED, "train.rounds=3", f"selection.name={name}", name=f"debug-{name}"))
    done = run_mpi_series(ranks, list(runs.values()), tmp_path / "series")
    for name, p in zip(SELECTORS, done):
        assert p.returncode == 0, f"mpirun -n {ranks} of {name} failed:\n{p.stdout}\n{p.stderr}"
        mpi, debug = tmp_path / "runs" / f"{ranks}-{name}", tmp_path / "runs" / f"debug-{name}"
        assert_same_model(final_model(mpi), final_model(debug))     # bit for bit: float64 sums, cast once
        assert metrics(mpi) == metrics(debug)
        assert [_plan(c) for c in _clients(mpi)] == [_plan(c) for c in _clients(debug)]


def _clients(run):
    return [json.loads(line)["clients"] for line in (run / "clients.jsonl").read_text().splitlines()]


def _plan(clients):
    return sorted((c["cid"], c["steps"], c["extra"]["sim_seconds"], c["train_loss"]) for c in clients)


def test_traces_are_prepared_with_the_data_and_drive_the_clock(tmp_path):
    """FedScale-format traces (a device pickle, an availability CSV) are copied beside the shards, their
    content part of the prepared data's identity, and the clock runs on them."""
    device = tmp_path / "device.pkl"
    device.write_bytes(pickle.dumps({1: {"computation": 1.0, "communication": 1e6},
                                     2: {"computation": 500.0, "communication": 1e6}}))
    behave = tmp_path / "behave.csv"
    behave.write_text("client_id,finish_time,active,inactive\n1,100,0,100\n2,100,0;60,10;100\n")
    sets = ("system.clock=true", f"system.device_trace={device}", f"system.availability_trace={behave}",
            "system.deadline=5", "train.rounds=2")
    run_debug(tiny(tmp_path, *sets, name="traced"))
    folders = [p for p in (tmp_path / "data").iterdir() if (p / "traces").is_dir()]
    assert len(folders) == 1 and sorted(f.name for f in (folders[0] / "traces").iterdir()) == [
        "availability.csv", "device.pkl"]
    clients = _clients(tmp_path / "runs" / "traced")
    slow = [c for per_round in clients for c in per_round if c["cid"] % 2 == 1]   # trace row 2: 500 ms per sample
    assert all(clients) and not slow and all(c["extra"]["sim_seconds"] < 5 for per_round in clients for c in per_round)
    behave.write_text("client_id,finish_time,active,inactive\n1,100,0,100\n2,100,0,100\n")
    run_debug(tiny(tmp_path, *sets, name="other-trace"))
    assert len([p for p in (tmp_path / "data").iterdir() if (p / "traces").is_dir()]) == 2


def test_oorts_exploration_window_is_a_full_sorts_first_entries():
    from mpifed.federation.selection import _largest
    rng = np.random.default_rng(1)
    for n, count in [(10, 3), (1000, 50), (1000, 1000), (100_000, 500), (7, 9)]:
        values, ids = rng.integers(0, 20, n).astype(float), rng.permutation(n)
        assert np.array_equal(_largest(values, ids, count), np.lexsort((ids, -values))[:count])


def test_pow_d_trains_the_candidates_of_highest_loss():
    line = timeline("selection.name=pow_d", "selection.d=8", "train.participation=0.06")
    candidates = line.probe(0)
    assert len(candidates) == 8 and len(set(candidates)) == 8
    line.probed({int(c): float(i) for i, c in enumerate(candidates)})      # the later candidates lose more
    assert list(line.plan(0).clients) == sorted(int(c) for c in candidates[-3:])
    assert line.candidates is None and line.last.probed == 8


def test_pow_d_probes_under_the_clock_and_is_charged_for_it(tmp_path):
    run_debug(tiny(tmp_path, "selection.name=pow_d", "train.participation=0.4", "system.clock=true",
                   "system.bandwidth=100000", name="pow-d"))
    rows = metrics(tmp_path / "runs" / "pow-d")
    model_bytes = rows[0]["bytes_up"] // rows[0]["clients"]     # FedAvg: a model and a weight up, a model down
    assert all(r["clients"] == 2 for r in rows)
    assert all(abs(r["bytes_down"] - 6 * model_bytes) < 6 * 1024 for r in rows)   # 4 candidates probed, 2 trained


def test_a_table_metric_reads_the_simulated_clock():
    from mpifed.run import results
    metric = results.Metric.parse({"kind": "final", "time_to": [0.5], "at_times": [2, 10]})
    assert metric.columns == ["final test_acc", "T(50%) sim s", "at 2 sim s", "at 10 sim s"]
    assert results.Metric.parse(metric.to_spec()) == metric
    rows = [{"round": 1, "test_acc": 0.3, "sim_clock": 1.5}, {"round": 2, "sim_clock": 3.0},
            {"round": 3, "test_acc": 0.6, "sim_clock": 4.5}]
    assert results.time_to(rows, 0.5) == 4.5 and results.time_to(rows, 0.7) is None
    assert results.at_time(rows, 2.0) == 0.3 and results.at_time(rows, 10) == 0.6 and results.at_time(rows, 1) is None
    assert results.time_to([{"round": 1, "test_acc": 0.9}], 0.5) is None     # a run without the clock
    with pytest.raises(results.MetricError, match="at_times"):
        results.Metric.parse({"at_times": [-1]})


SELECTOR_PLUGIN = '''"""Selection of a user's own: the k available clients of the lowest ids."""
import numpy as np

from mpifed.federation.selection import Selector
from mpifed.registry import SELECTORS


@SELECTORS.register("lowest_ids")
class LowestIds(Selector):
    def select(self, server_round, available, k, rng, known):
        return np.sort(available)[:k]
'''


def test_a_selector_from_a_plugin_file_selects_and_is_recorded_by_hash(tmp_path):
    import subprocess
    import sys

    from conftest import REPO, env
    plugin = tmp_path / "lowest.py"
    plugin.write_text(SELECTOR_PLUGIN)
    p = subprocess.run([sys.executable, "-m", "mpifed.main", *tiny(tmp_path, "selection.name=lowest_ids",
                                                                     "train.participation=0.4", name="mine"),
                        "--plugin", str(plugin)], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    run = tmp_path / "runs" / "mine"
    assert [sorted(c["cid"] for c in per_round) for per_round in _clients(run)] == [[0, 1], [0, 1]]
    saved = config.read_yaml(run / "config.yaml")
    assert saved["code"]["selection"] and len(saved["code"]["selection"]) == 64
