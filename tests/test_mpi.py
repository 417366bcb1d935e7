"""Integration: real mpirun runs on tiny synthetic shards, compared with the debug mode."""
import json
import re
import socket
import time

import h5py
import numpy as np
import pytest

from conftest import assert_same_model, final_model, metrics, run_debug, run_mpi, run_mpi_series, tiny
from mpifed.run.rundir import RunDir

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def debug_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("debug")
    run_debug(tiny(tmp))
    return tmp / "runs" / "run"


SCAFFOLD = ("algorithm.name=scaffold", "train.participation=0.6", "train.rounds=4")   # clients change workers


def quick_start_fedprox(tmp, name):
    return ["--set", "algorithm.name=fedprox", "algorithm.mu=0.01", "train.rounds=3", f"run.root={tmp / 'runs'}",
            f"data.prepared_root={tmp / 'data'}", f"run.name={name}"]


@pytest.fixture(scope="module")
def mpi_runs(has_mpirun, tmp_path_factory):
    """{(ranks, name): (the run, its directory)}: the runs of this module's MPI-equals-debug tests,
    one MPI job per rank count."""
    tmp = tmp_path_factory.mktemp("mpi")
    # the quick start first: no run before it in the job has set the thread count its test is about
    jobs = {3: {"quick-start": quick_start_fedprox(tmp, "3-quick-start"), "tiny": tiny(tmp, name="3-tiny"),
                "scaffold": tiny(tmp, *SCAFFOLD, name="3-scaffold"),
                # every state through the store (no memory for any), half the rounds, then resumed
                "scaffold-spilled": tiny(tmp, *SCAFFOLD, "resources.client_state_mb=0", "train.rounds=2",
                                         name="3-scaffold-spilled"),
                "scaffold-resumed": ["--resume", str(tmp / "runs" / "3-scaffold-spilled"), "--set", "train.rounds=4"]},
            4: {"tiny": tiny(tmp, name="4-tiny"), "two-clients": tiny(tmp, "data.num_clients=2", name="4-two-clients")}}
    out = {}
    for ranks, runs in jobs.items():
        done = run_mpi_series(ranks, list(runs.values()), tmp / f"series-{ranks}")
        out.update({(ranks, name): (p, tmp / "runs" / f"{ranks}-{name}") for name, p in zip(runs, done)})
    return out


def mpi_run(mpi_runs, ranks, name):
    p, run = mpi_runs[ranks, name]
    assert p.returncode == 0, f"mpirun -n {ranks} of {name} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p, run


@pytest.mark.parametrize("ranks", [3, 4])
@pytest.mark.mpi
def test_mpi_run_equals_debug_run(mpi_runs, debug_run, ranks):
    p, run = mpi_run(mpi_runs, ranks, "tiny")
    assert f"MPI, {ranks} ranks (1 server + {ranks - 1} workers)" in p.stdout
    assert_same_model(final_model(run), final_model(debug_run), atol=1e-6)
    a, b = metrics(run), metrics(debug_run)
    assert [r["test_acc"] for r in a] == [r["test_acc"] for r in b]
    assert np.allclose([r["test_loss"] for r in a], [r["test_loss"] for r in b], rtol=1e-6)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds_done"] == 2
    clients = [json.loads(line) for line in (run / "clients.jsonl").read_text().splitlines()]
    assert {c["worker"] for c in clients[0]["clients"]} == set(range(ranks - 1))


@pytest.mark.mpi
def test_fewer_clients_than_workers(mpi_runs, tmp_path):
    run_debug(tiny(tmp_path, "data.num_clients=2", name="debug"))
    _, run = mpi_run(mpi_runs, 4, "two-clients")
    assert_same_model(final_model(run), final_model(tmp_path / "runs" / "debug"), atol=1e-6)


def test_same_seed_same_result_other_seed_other_result(debug_run, tmp_path):
    run_debug(tiny(tmp_path, name="again"))
    run_debug(tiny(tmp_path, "run.seed=1", name="other"))
    assert_same_model(final_model(tmp_path / "runs" / "again"), final_model(debug_run))
    with pytest.raises(AssertionError):
        assert_same_model(final_model(tmp_path / "runs" / "other"), final_model(debug_run))


@pytest.mark.mpi
def test_quick_start_with_11_ranks(has_mpirun, tmp_path):
    p = run_mpi(11, ["--set", "train.rounds=1", f"run.root={tmp_path}", f"data.prepared_root={tmp_path / 'data'}",
                     "run.name=qs"], timeout=400)
    assert "MPI, 11 ranks (1 server + 10 workers)" in p.stdout and "final test accuracy" in p.stdout
    host = socket.gethostname()
    assert (f"[mpifed]   rank 0 server on {host} (cpu, 1 thread); ranks 1-10 workers on {host} (cpu, 1 thread each) "
            "(log.txt and --verbose: a line per rank)") in p.stdout and "(worker): host" not in p.stdout   # one line
    log = (tmp_path / "qs" / "log.txt").read_text()
    assert [int(r) for r in re.findall(r"rank (\d+) \((?:server|worker)\): host", log)] == list(range(11))


RAISING = '''
from mpifed.algorithms.base import Algorithm, Client
from mpifed.registry import ALGORITHMS


class RaisingClient(Client):
    def begin_client(self, ctx):
        if ctx.server_round >= 2 and ctx.cid == 3:
            raise RuntimeError("client 3 fails mid-run")


@ALGORITHMS.register("raising")
class Raising(Algorithm):
    Client = RaisingClient
'''


@pytest.mark.mpi
def test_exception_on_a_worker_ends_the_job(has_mpirun, tmp_path):
    plugin = tmp_path / "raising.py"
    plugin.write_text(RAISING)
    start = time.time()
    p = run_mpi(3, tiny(tmp_path, "algorithm.name=raising", "train.participation=1.0", "comm.timeout_s=600")
                + ["--plugin", str(plugin)], check=False, timeout=120)
    assert p.returncode != 0 and time.time() - start < 60, "a worker's exception must end the job, not hang it"
    assert "client 3 fails mid-run" in p.stderr and "[mpifed] rank" in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("[mpifed.launch] the job failed (mpirun exited with "), p.stderr      # no NUL before it
    assert "the method raising failed in its hook" in p.stderr                           # the method's own code
    assert "from round 1 (no checkpoint was written yet)" in last and "--resume" in last   # the fix, then the same
    assert last.rstrip().endswith("--trust-changed-code")                                 # command the report gives


@pytest.mark.mpi
def test_a_damaged_client_stops_the_job_in_the_round_that_reads_it(has_mpirun, tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=1", name="prep"))
    block = next((tmp_path / "data").glob("*/clients/block_00000.h5"))
    with h5py.File(block, "r+") as f:
        start = int(f["offsets"][3])
        f["images"][start] = 255 - f["images"][start]   # damage client 3's content; its checksum stays
    p = run_mpi(3, tiny(tmp_path), check=False, timeout=120)
    assert p.returncode != 0
    assert "client 3 in" in p.stderr and "block_00000.h5 does not match its checksum" in p.stderr
    assert "round 1/" not in p.stdout


@pytest.mark.mpi
def test_config_error_under_mpirun_is_reported_once(has_mpirun, tmp_path):
    p = run_mpi(3, tiny(tmp_path, "train.lokal_epochs=2"), check=False, timeout=120)
    assert p.returncode == 2
    assert p.stderr.count("did you mean 'train.local_epochs'") == 1


def test_nan_loss_is_a_clear_error(tmp_path):
    p = run_debug(tiny(tmp_path, "train.lr=1e12", "train.momentum=0"), check=False)
    assert p.returncode == 2
    assert "the local loss is nan" in p.stderr.lower() and "Lower train.lr" in p.stderr
    status = json.loads((tmp_path / "runs" / "run" / "status.json").read_text())
    assert status["diverged"] is True and RunDir(tmp_path / "runs" / "run").state() == "diverged"



@pytest.mark.mpi
def test_nan_loss_on_a_worker_marks_the_run_failed(has_mpirun, tmp_path):
    p = run_mpi(3, tiny(tmp_path, "train.lr=1e12", "train.momentum=0"), check=False, timeout=120)
    assert p.returncode != 0 and "Lower train.lr" in p.stderr
    assert "\0" not in p.stderr and "MPI_ABORT was invoked" not in p.stderr, p.stderr    # the launcher's relay
    status = json.loads((tmp_path / "runs" / "run" / "status.json").read_text())
    assert status["state"] == "failed" and "rank" in status["error"] and "nan" in status["error"].lower()
    assert status["diverged"] is True and RunDir(tmp_path / "runs" / "run").state() == "diverged"


def test_existing_run_directory_is_not_overwritten(debug_run, tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=1"))
    p = run_debug(tiny(tmp_path, "train.rounds=1"), check=False)
    assert p.returncode == 2 and "already holds a run" in p.stderr and "--resume" in p.stderr
    run_debug(tiny(tmp_path, "train.rounds=1") + ["--overwrite"])
    p = run_debug(tiny(tmp_path, "train.rounds=5") + ["--show-config", "--overwrite"])
    assert "rounds: 5" in p.stdout and (tmp_path / "runs" / "run" / "model.pt").exists()


@pytest.mark.mpi
def test_client_state_follows_clients_across_workers(mpi_runs, tmp_path):
    """SCAFFOLD's per-client control variates, with clients changing workers between rounds."""
    run_debug(tiny(tmp_path, *SCAFFOLD, name="debug"))
    _, run = mpi_run(mpi_runs, 3, "scaffold")
    clients = [json.loads(line) for line in (run / "clients.jsonl").read_text().splitlines()]
    where = {}
    for rnd in clients:
        for c in rnd["clients"]:
            where.setdefault(c["cid"], set()).add(c["worker"])
    assert any(len(w) > 1 for w in where.values()), "no client moved between workers; the test proves nothing"
    assert_same_model(final_model(run), final_model(tmp_path / "runs" / "debug"), atol=1e-6)
    # the states written to the packed store by two workers, read back by others and after a resume
    mpi_run(mpi_runs, 3, "scaffold-resumed")
    _, spilled = mpi_run(mpi_runs, 3, "scaffold-spilled")
    assert sorted(p.name for p in (spilled / "client_state").iterdir()) == ["block_00000.bin", "store.json"]
    assert_same_model(final_model(spilled), final_model(tmp_path / "runs" / "debug"), atol=1e-6)
    assert metrics(spilled) == metrics(tmp_path / "runs" / "debug")


@pytest.mark.mpi
def test_default_thread_count_gives_the_same_numbers_in_every_mode(mpi_runs, tmp_path):
    """Issue 25, item 3: FedProx on the quick start's digits gave 0.8552 in the debug mode (two
    threads on a 2-core machine) and 0.8496 under mpirun. By default every mode now uses the same
    thread count, and a thread count that differs makes a run of another identity."""
    from mpifed.settings import config
    run_debug(quick_start_fedprox(tmp_path, "debug"))
    _, mpi = mpi_run(mpi_runs, 3, "quick-start")
    a, b = metrics(tmp_path / "runs" / "debug"), metrics(mpi)
    assert [r["test_acc"] for r in a] == [r["test_acc"] for r in b]
    assert [r["test_loss"] for r in a] == pytest.approx([r["test_loss"] for r in b], rel=1e-6)
    one, two = (config.result_fingerprint(config.load(overrides=[f"resources.threads={t}"])[1]) for t in (1, 2))
    assert config.diff_keys(one, two) == ["resources.threads"]
