"""Asynchronous runs (aggregation fedbuff, fedasync): one metrics row per server step (its version,
simulated time, the staleness of each update taken); a run stopped and resumed equals the run never
stopped, bit for bit; under mpirun -n 3 and -n 4 the runs equal the debug mode's, bit for bit; FedGKD's
clients distil from the teacher of the version they started from, and its runs resume and run under MPI
exactly too."""
import json

import pytest
import torch

from conftest import (assert_resumed_equals_uninterrupted, assert_same_model, final_model, metrics, run_debug,
                      run_mpi_series, tiny)
from mpifed.run import checkpoint

pytestmark = pytest.mark.e2e

CLOCK = ("system.clock=true", "system.speed_sigma=0.8", "run.checkpoint_every=2")
FEDBUFF = ("aggregation.name=fedbuff", "aggregation.buffer=2", "aggregation.concurrency=3", *CLOCK)
FEDASYNC = ("aggregation.name=fedasync", "aggregation.concurrency=4", "aggregation.max_staleness=1",
            "aggregation.staleness=hinge", "aggregation.a=10", "aggregation.b=0", "system.dropout=0.2", *CLOCK)
GKD = ("algorithm.name=fedgkd", "algorithm.gamma=1", "algorithm.buffer_size=2")   # the teacher: 2 versions' mean
RUNS = {"fedbuff": FEDBUFF, "fedasync": FEDASYNC, "fedgkd-fedbuff": (*FEDBUFF, *GKD),
        "fedgkd-fedasync": (*FEDASYNC, *GKD)}


def test_a_fedbuff_step_is_one_row_with_its_version_simulated_time_and_staleness(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=5", *FEDBUFF))
    rows = metrics(tmp_path / "runs" / "run")
    assert [r["version"] for r in rows] == [1, 2, 3, 4, 5] == [r["round"] for r in rows]
    assert all(len(r["staleness"]) == 2 == r["clients"] for r in rows)
    assert any(s > 0 for r in rows for s in r["staleness"])
    clock = [r["sim_clock"] for r in rows]
    assert clock == sorted(clock) and clock[0] > 0
    saved = checkpoint.load_run_state(checkpoint.latest(tmp_path / "runs" / "run" / "checkpoints"))["async"]
    # in flight: the concurrency less the slot the step's last update freed (filled at the next step, from the new
    # version); kept: the versions those clients started from and the current one, each with its downlink (FedAvg's:
    # nothing besides the model)
    assert set(saved) == {"queue", "version", "versions", "downlinks"} and len(saved["queue"]["events"]) == 2
    assert saved["version"] == 5 and 5 in saved["versions"] and len(saved["versions"]) <= 21
    assert saved["downlinks"] == {v: {} for v in saved["versions"]}


@pytest.mark.parametrize("name", list(RUNS))
def test_stopped_and_resumed_equals_uninterrupted(tmp_path, name):
    # FedGKD: clients in flight at the stop train after the resume with the teachers of their start versions, which
    # the checkpoint keeps (made again from the buffer at the resume, they would be another version's)
    assert_resumed_equals_uninterrupted(tmp_path / "runs", tiny(tmp_path, "train.rounds=6", *RUNS[name], name="full"),
                                        tiny(tmp_path, "train.rounds=3", *RUNS[name], name="cut"), 6)


def test_fedasync_drops_stale_and_dropped_out_updates(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=8", *FEDASYNC))
    rows = metrics(tmp_path / "runs" / "run")
    assert all(r["clients"] == 1 and r["staleness"][0] <= 1 for r in rows)
    assert sum(r["stale_dropped"] + r["dropped"] for r in rows) > 0


@pytest.mark.parametrize("method", [("fedprox",), ("fedntd",), ("fedgkd_vote", "data.server_holdout_per_class=3")],
                         ids=lambda m: m[0])
def test_the_methods_that_declare_how_they_run_asynchronously_run(tmp_path, method):
    name, *settings = method
    run_debug(tiny(tmp_path, "train.rounds=3", f"algorithm.name={name}", *settings, *FEDBUFF))
    rows = metrics(tmp_path / "runs" / "run")
    assert [r["version"] for r in rows] == [1, 2, 3] and all(r["test_acc"] is not None for r in rows)


STATEFUL_PLUGIN = '''"""MOON declared asynchronous: its clients keep their previous models (client state)."""
from mpifed.registry import ALGORITHMS


@ALGORITHMS.register("async_moon")
class AsyncMoon(ALGORITHMS.get("moon")):
    asynchronous = "declared, though each client keeps its previous model"
'''


def test_a_method_with_client_state_is_refused_asynchronously_even_if_it_declares_so(tmp_path, unload_plugins):
    plugin = tmp_path / "async_moon.py"
    plugin.write_text(STATEFUL_PLUGIN)
    p = run_debug([*tiny(tmp_path, "train.rounds=2", "algorithm.name=async_moon", *FEDBUFF), "--plugin", str(plugin)],
                  check=False)
    assert p.returncode != 0
    assert "its messages hold client state, which the asynchronous server does not carry" in p.stdout + p.stderr
    assert "set aggregation=sync" in p.stdout + p.stderr


def test_a_fedgkd_client_distils_from_its_start_versions_teacher_not_the_current_one(tmp_path, monkeypatch):
    from mpifed.algorithms.fedgkd import FedGKDClient, FedGKDServer
    from mpifed.federation.async_server import AsyncServer
    made, current, taught = {}, [], []      # server round -> its teacher; the version current; each client's teacher
    downlink, round_start, plan = FedGKDServer.downlink, FedGKDClient.round_start, AsyncServer.plan

    def made_downlink(self, server_round, weights):
        down = downlink(self, server_round, weights)
        made[server_round] = down["teacher"].clone() if down["active"].item() else None
        return down

    def planned(self):
        current.append(self.version)        # the clients of the step being planned train while it is current
        return plan(self)

    def started(self, server_round, down):
        taught.append((server_round, current[-1], down.teacher.clone() if down.active.item() else None))
        return round_start(self, server_round, down)

    monkeypatch.setattr(FedGKDServer, "downlink", made_downlink)
    monkeypatch.setattr(AsyncServer, "plan", planned)
    monkeypatch.setattr(FedGKDClient, "round_start", started)
    run_debug(tiny(tmp_path, "train.rounds=6", *FEDBUFF, *GKD))
    # version v's teacher is made for round v + 1 (the buffer after v steps); a client's server round is its start
    # version's, and its teacher that version's, byte for byte after the broadcast
    assert all((teacher is None) == (made[server_round] is None) and (teacher is None or
               torch.equal(teacher, made[server_round])) for server_round, _, teacher in taught)
    stale = [(r, now) for r, now, teacher in taught if r - 1 < now and teacher is not None]
    assert stale and all(not torch.equal(made[r], made[now + 1]) for r, now in stale)


def test_with_on_off_availability_only_available_clients_train_and_the_server_waits(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=6", *FEDBUFF, "system.availability=on-off", "system.on_period=2",
                   "system.off_period=20", "aggregation.idle_wait=5"))
    rows = metrics(tmp_path / "runs" / "run")
    assert [r["version"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[-1]["sim_clock"] > 20          # most clients are away most of the time: the clock waited for them


def test_each_version_is_broadcast_once_and_then_cached(tmp_path, monkeypatch):
    from mpifed.comm.collectives import Comm
    sizes = []
    monkeypatch.setattr(Comm, "bcast_buffer", lambda self, buf, *, what, root=0: sizes.append(buf.nbytes)
                        if what.startswith("versions in flight") else None)
    run_debug(tiny(tmp_path, "train.rounds=6", *FEDBUFF))
    weights = final_model(tmp_path / "runs" / "run")
    per_version = sum(t.numel() * 4 for t in weights.values() if t.is_floating_point())
    broadcast = [(n // per_version) for n in sizes]          # versions per step (the integer buffers are smaller)
    assert len(sizes) == 6 and sum(broadcast) <= 6 < 12      # 12 updates taken from at most versions 0..5


AGGREGATION_PLUGIN = '''"""An aggregation of a user's own: FedBuff's step taken half way."""
from mpifed.federation.async_rules import FedBuff
from mpifed.registry import AGGREGATIONS


@AGGREGATIONS.register("half_buff")
class HalfBuff(FedBuff):
    def aggregate(self, x, starts, models, staleness):
        return (x + super().aggregate(x, starts, models, staleness)) / 2
'''


def test_an_aggregation_from_a_plugin_file_runs_and_is_recorded_by_hash(tmp_path, unload_plugins):
    from mpifed.config import read_yaml
    plugin = tmp_path / "half.py"
    plugin.write_text(AGGREGATION_PLUGIN)
    options = [o.replace("aggregation.name=fedbuff", "aggregation.name=half_buff") for o in FEDBUFF]
    run_debug([*tiny(tmp_path, "train.rounds=2", *options, name="mine"), "--plugin", str(plugin)])
    saved = read_yaml(tmp_path / "runs" / "mine" / "config.yaml")
    assert saved["aggregation"]["name"] == "half_buff" and len(saved["code"]["aggregation"]) == 64


@pytest.fixture(scope="module")
def debug_runs(tmp_path_factory):
    """The uninterrupted debug-mode runs of FedBuff and FedAsync (FedAvg's and FedGKD's), and the folder they
    live under."""
    tmp = tmp_path_factory.mktemp("async")
    for name, options in RUNS.items():
        run_debug(tiny(tmp, "train.rounds=6", *options, name=name))
    return tmp / "runs"


def clients(run_dir):
    """clients.jsonl without the wall-clock seconds and the worker index (they differ between rank counts)."""
    rows = [json.loads(line) for line in (run_dir / "clients.jsonl").read_text().splitlines()]
    return [[{k: v for k, v in c.items() if k not in ("seconds", "worker")} for c in r["clients"]] for r in rows]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [3, 4])
def test_under_mpirun_equals_debug_and_resumes_exactly(has_mpirun, debug_runs, tmp_path, n):
    runs = []
    for name, options in RUNS.items():
        runs += [tiny(tmp_path, "train.rounds=6", *options, name=name),
                 tiny(tmp_path, "train.rounds=3", *options, name=f"{name}-cut"),
                 ["--resume", str(tmp_path / "runs" / f"{name}-cut"), "--set", "train.rounds=6"]]
    for p in run_mpi_series(n, runs, tmp_path / "series"):
        assert p.returncode == 0, f"mpirun -n {n} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    for name in RUNS:
        debug = debug_runs / name
        for run in (tmp_path / "runs" / name, tmp_path / "runs" / f"{name}-cut"):
            assert_same_model(final_model(run), final_model(debug))
            assert metrics(run) == metrics(debug)
            assert clients(run) == clients(debug)
