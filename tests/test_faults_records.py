"""Faults of a run's records and inputs: a status that says what the run is doing, client states
checked, a lock that survives its file's deletion, torn metrics caught by readers, uplinks checked
at aggregation, bounded config files, a stop during start-up, and the small messages of issue 53;
from issue 76, crafted records whose counts are bounded before anything is allocated (a client-state
store, status.json, metrics.jsonl, a checkpoint's name), client state of an older layout or deleted,
a partition file holding objects, a prepared manifest edited to other classes, a bad uplink weight,
keys set twice, files not in UTF-8 and a real full disk at a run's start.

Each test makes the fault the way a user or a crash would (deleting, truncating, editing files;
methods of a user's own, loaded as plugins in this process) and checks what mpifed says and keeps.
"""
import errno
import json
import os
import subprocess
import sys
import re
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, env, launch_with_mpirun, metrics, run_debug, tiny, write_tiny_table
from mpifed.files import safe_yaml
from mpifed.run.rundir import LockLost, RunDir, check_run_name

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("unload_plugins")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Prepared data shared by the tests (tiny() keeps it under tmp/data)."""
    tmp = tmp_path_factory.mktemp("data")
    run_debug(tiny(tmp, "train.rounds=1", name="warm"))
    return tmp / "data"


def here(tmp, data):
    (tmp / "data").symlink_to(data)
    return tmp


def with_plugin(tmp, source, name):
    path = tmp / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return ["--plugin", str(path)]


# ------------------------------------------------------------------ item 6: status while a finished run trains further
def in_aggregate(name, action):
    """A method ``name``: FedAvg whose server first runs ``action`` (Python lines reading ``server_round`` and
    ``run``, the run directory named by $WATCH_RUN) in each aggregation."""
    body = "\n".join(f"            {line}" for line in action.strip().splitlines())
    return f"""
    import json, os
    from pathlib import Path
    from mpifed.algorithms.base import Algorithm, Server
    from mpifed.registry import ALGORITHMS
    from mpifed.run.rundir import RunDir

    class HookServer(Server):
        def aggregate(self, server_round, weights, replies):
            run = RunDir(Path(os.environ["WATCH_RUN"]))
{body}
            return super().aggregate(server_round, weights, replies)

    ALGORITHMS.register("{name}")(type("Hook", (Algorithm,), {{"Server": HookServer}}))
"""


WATCHER = in_aggregate("watching", """
with open(os.environ["WATCH_OUT"], "a") as f:
    f.write(json.dumps({"round": server_round, "file": run.read_json("status.json")}) + "\\n")
""")


def test_a_finished_run_trained_further_says_running_from_its_first_new_round(tmp_path, data, monkeypatch):
    here(tmp_path, data)
    run, seen = tmp_path / "runs" / "more", tmp_path / "seen.jsonl"
    monkeypatch.setenv("WATCH_RUN", str(run))
    monkeypatch.setenv("WATCH_OUT", str(seen))
    plugin = with_plugin(tmp_path, WATCHER, "watching")
    run_debug(tiny(tmp_path, "algorithm.name=watching", "run.checkpoint_every=5", name="more") + plugin)
    seen.unlink()
    run_debug(["--resume", str(run), "--set", "train.rounds=4"])
    states = [json.loads(line) for line in seen.read_text().splitlines()]
    assert [(s["round"], s["file"]["state"], s["file"]["rounds_done"]) for s in states] == \
        [(3, "running", 2), (4, "running", 2)]                 # was: finished at 2, until a checkpoint
    assert RunDir(run).status()["state"] == "finished" and len(metrics(run)) == 4


def test_a_killed_run_resumed_says_it_had_failed(tmp_path, data):
    here(tmp_path, data)
    run = tmp_path / "runs" / "killed"
    run_debug(tiny(tmp_path, name="killed"))
    RunDir(run).write_json("status.json", {"state": "running", "rounds_done": 2, "checkpoint": None})   # kill -9
    p = run_debug(["--resume", str(run), "--set", "train.rounds=3"])
    assert "had failed (the run's processes ended without recording why (killed" in p.stdout


# ------------------------------------------------------------------ item 7: client states checked
@pytest.fixture(scope="module")
def scaffold_run(tmp_path_factory, data):
    """A finished 2-round SCAFFOLD run (its client states in a store), trained once: tests copy it."""
    tmp = here(tmp_path_factory.mktemp("scaffold"), data)
    run_debug(tiny(tmp, "algorithm.name=scaffold", "data.partition=iid", name="shared"))
    return tmp / "runs" / "shared"


def _scaffold(tmp_path, scaffold_run, name):
    """A copy of the shared SCAFFOLD run, in ``tmp_path``'s runs/``name``, to damage (its config names
    the shared run's prepared data)."""
    shutil.copytree(scaffold_run, tmp_path / "runs" / name, symlinks=True)
    return tmp_path / "runs" / name


def _slot(run, cid, last):
    """The file and offset of client ``cid``'s state after round ``last`` in the run's store."""
    from mpifed.round.client_state import ClientStates
    from mpifed.round.protocol import Layout
    meta = json.loads((run / "client_state" / "store.json").read_text())
    found = ClientStates(run / "client_state", Layout("state", {"x": ((meta["state_bytes"],), np.uint8)}), 0,
                         meta["versions"]).locate(cid, last)
    assert found, f"client {cid} has no state after round {last + 1}"
    return found


def test_a_deleted_client_state_is_an_error_not_zeros(tmp_path, scaffold_run):
    run = _scaffold(tmp_path, scaffold_run, "lost")
    path, offset = _slot(run, 3, 1)
    with open(path, "r+b") as f:                           # the slot's header wiped: the state is gone
        f.seek(offset)
        f.write(bytes(8))
    p = run_debug(["--resume", str(run), "--set", "train.rounds=3"], check=False)
    assert p.returncode == 2 and "client 3's state after round 2 is missing" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and len(metrics(run)) == 2


def test_a_client_state_changed_in_place_is_refused(tmp_path, scaffold_run):
    run = _scaffold(tmp_path, scaffold_run, "edited")
    path, offset = _slot(run, 1, 1)
    with open(path, "r+b") as f:                           # one float of the state changed in place
        f.seek(offset + 56)
        f.write(np.array([1e30], dtype=np.float32).tobytes())
    p = run_debug(["--resume", str(run), "--set", "train.rounds=3"], check=False)
    assert p.returncode == 2 and "client 1's state after round 2 in" in p.stderr
    assert "is damaged (its content does not match its SHA-256)" in p.stderr


def _refused_on_resume(run, said):
    """``--resume`` of ``run`` for a third round stops with one message holding ``said``; nothing is lost."""
    p = run_debug(["--resume", str(run), "--set", "train.rounds=3"], check=False)
    assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(metrics(run)) == 2
    return p


# ------------------------------------------------------------------ issue 76: records crafted, counts bounded
@pytest.mark.parametrize("key,value,said", [
    ("versions", 1e11, "store.json is damaged (versions is 100000000000.0, not a whole number)"),
    ("versions", 10**11, "store.json gives each client 100000000000 versions, where this run keeps 2 to 4 "),
    ("versions", 1, "store.json gives each client 1 versions, where this run keeps 2 to 4 "),
    ("clients_per_file", 0, "store.json is damaged (clients_per_file is 0, where mpifed writes 1 to 4,096)"),
    ("slot_bytes", 64, "store.json is damaged (slot_bytes is 64, and its states of"),
    ("format", None, "store.json says the client states are in no format; this mpifed reads format 1 only"),
    ("format", 2, "store.json says the client states are in format 2; this mpifed reads format 1 only"),
])
def test_a_crafted_client_state_store_is_refused_before_it_allocates(tmp_path, scaffold_run, key, value, said):
    run = _scaffold(tmp_path, scaffold_run, "store")
    path = run / "client_state" / "store.json"
    meta = json.loads(path.read_text())
    meta.pop(key) if value is None else meta.update({key: value})
    path.write_text(json.dumps(meta))
    _refused_on_resume(run, said)        # was: 12.8 GB then MemoryError (1e11), a ZeroDivisionError (0)


def test_client_state_blocks_without_their_store_json_are_not_read_with_a_guessed_layout(tmp_path, scaffold_run):
    run = _scaffold(tmp_path, scaffold_run, "unlabelled")
    (run / "client_state" / "store.json").unlink()
    _refused_on_resume(run, "client_state holds client-state blocks (block_00000.bin) but no store.json")


def test_client_state_files_of_the_earliest_layout_are_refused_naming_it(tmp_path, scaffold_run):
    run = _scaffold(tmp_path, scaffold_run, "earliest")
    state_bytes = json.loads((run / "client_state" / "store.json").read_text())["state_bytes"]
    shutil.rmtree(run / "client_state")
    for cid in range(5):                 # one file per client and round, the state alone: any bytes pass for one
        (run / "client_state" / str(cid)).mkdir(parents=True)
        (run / "client_state" / str(cid) / "r1.bin").write_bytes(bytes(state_bytes))
    p = _refused_on_resume(run, "r1.bin is not a client state mpifed can check: it lacks the MPIFEDCS header")
    assert "This mpifed needs a store (client_state/store.json, format 1)" in p.stderr


def test_client_state_deleted_between_two_attempts_is_named(tmp_path, scaffold_run):
    run = _scaffold(tmp_path, scaffold_run, "gone")
    shutil.rmtree(run / "client_state")
    _refused_on_resume(run, "client_state is missing: it held the clients' states")


DELETES_STATES = """
    import os, shutil
    from pathlib import Path
    from mpifed.algorithms.scaffold import Scaffold
    from mpifed.registry import ALGORITHMS

    class Deleting(Scaffold.Server):
        def aggregate(self, server_round, weights, replies):
            if server_round == 2:
                shutil.rmtree(Path(os.environ["WATCH_RUN"]) / "client_state")
            return super().aggregate(server_round, weights, replies)

    ALGORITHMS.register("deleting_states")(type("DeletingStates", (Scaffold,), {"Server": Deleting}))
"""


def test_client_state_deleted_while_the_run_goes_on_is_one_message(tmp_path, data, monkeypatch):
    here(tmp_path, data)
    run = tmp_path / "runs" / "deleting"
    monkeypatch.setenv("WATCH_RUN", str(run))
    p = run_debug(tiny(tmp_path, "algorithm.name=deleting_states", "data.partition=iid", "run.checkpoint_every=1",
                       "train.rounds=3", name="deleting")
                  + with_plugin(tmp_path, DELETES_STATES, "deleting_states"), check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "client_state (or its block_00000.bin) was deleted while the run was using it" in p.stderr
    assert "Put the folder back as it was, or start the run again with --overwrite" in p.stderr
    assert RunDir(run).status()["state"] == "failed"


@pytest.mark.parametrize("file,count", [("status.json", 10**30), ("status.json", 10**9), ("metrics.jsonl", 10**30)])
def test_a_huge_count_of_rounds_in_a_record_is_a_damaged_run(tmp_path, scaffold_run, capsys, file, count):
    from mpifed.entry.report import main as report_main
    run = _scaffold(tmp_path, scaffold_run, "counted")
    if file == "status.json":
        RunDir(run).write_json("status.json", {**RunDir(run).read_json("status.json"), "rounds_done": count})
    else:
        rows = metrics(run, drop_time=False)
        RunDir(run).write_rows("metrics.jsonl", [rows[0], {**rows[1], "round": count}])
    assert report_main([str(run), "--out", str(tmp_path / "report")]) == 2    # was: OverflowError, MemoryError
    assert f"where status.json records {2 if file == 'metrics.jsonl' else count} finished rounds" in \
        capsys.readouterr().err
    p = run_debug(["--resume", str(run)])
    assert "writing its records again from" in p.stdout
    assert RunDir(run).status() == {**RunDir(run).status(), "state": "finished", "rounds_done": 2}
    assert [r["round"] for r in metrics(run)] == [1, 2]


def test_a_checkpoint_under_another_rounds_name_is_refused(tmp_path, scaffold_run):
    run = _scaffold(tmp_path, scaffold_run, "renamed")
    (run / "checkpoints" / "round_000002.ckpt").rename(run / "checkpoints" / "round_000009.ckpt")
    p = run_debug(["--resume", str(run), "--set", "train.rounds=10"], check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "round_000009.ckpt records another number of finished rounds than the 9 its name says" in p.stderr


def test_a_partition_npz_holding_an_object_array_is_one_message(tmp_path, data):
    here(tmp_path, data)
    split = tmp_path / "split.npz"
    clients = [np.arange(k * 60, (k + 1) * 60) for k in range(5)]
    np.savez(split, *clients[:4], np.array([clients[4], [1, 2]], dtype=object))
    p = run_debug(tiny(tmp_path, f"data.partition={{name: from_file, path: {split}}}", name="npz"), check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr     # was: ValueError from numpy
    assert f"partition file {split} holds Python objects (an object array)" in p.stderr


def _edited_manifest(tmp_path, data, classes, counts_too):
    """A copy of the shared prepared data whose manifest says ``classes`` classes (and, with
    ``counts_too``, whose test and client class counts were cut to match)."""
    import h5py
    shutil.copytree(data, tmp_path / "data")
    folder = next(p.parent for p in (tmp_path / "data").glob("synthetic-dirichlet-*/manifest.json"))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["num_classes"] = classes
    if counts_too:
        manifest["test"]["class_counts"] = manifest["test"]["class_counts"][:classes]
        with h5py.File(folder / "clients" / "index.h5", "r+") as f:
            counts = f["class_counts"][:, :classes]
            del f["class_counts"]
            f["class_counts"] = counts
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("counts_too,said", [
    (False, "manifest.json says the data has 5 classes, and the test set's class counts have 10"),
    (True, "test.h5 hold label 9, outside the 5 classes that"),
])
def test_a_prepared_manifest_edited_to_other_classes_is_refused_at_start(tmp_path, data, counts_too, said):
    folder = _edited_manifest(tmp_path, data, 5, counts_too)
    p = run_debug(tiny(tmp_path, name="classes"), check=False)
    assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stderr   # was: IndexError
    assert f"Delete {folder} so that the next run prepares it again" in p.stderr
    assert not (tmp_path / "runs" / "classes" / "metrics.jsonl").exists()      # stopped before round 1


# ------------------------------------------------------------------ item 8: the lock survives its file's deletion
HOLD = """
import sys, time
from pathlib import Path
from mpifed.run.rundir import RunDir, RunLocked
try:
    RunDir(Path(sys.argv[1])).lock()
except RunLocked:
    print("refused", flush=True)
    sys.exit(0)
print("held", flush=True)
time.sleep(60)
"""


def _holder(path):
    """Another process that takes the run's lock and holds it; its first line: held or refused."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], cwd=REPO, env=env(),
                            stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def test_a_deleted_lock_file_is_made_again_and_still_excludes(tmp_path):
    run = RunDir(tmp_path / "r")
    run.lock()
    try:
        (run.path / ".lock").unlink()
        assert "was deleted while the run held it; locked a new one" in run.check_lock()
        other, said = _holder(run.path)
        other.kill()
        other.wait()
        assert said == "refused" and run.check_lock() is None
    finally:
        run.unlock()


def test_a_lock_taken_by_another_process_after_deletion_stops_the_first(tmp_path):
    run = RunDir(tmp_path / "r")
    run.lock()
    (run.path / ".lock").unlink()
    other, said = _holder(run.path)
    assert said == "held"
    try:
        with pytest.raises(LockLost, match=rf"another process \(host \S+ pid {other.pid}\) has locked the new one"):
            run.check_lock()
    finally:
        other.kill()
        other.wait()
        run.unlock()


DELETER = in_aggregate("deleting", """
if server_round == 2:
    (run.path / ".lock").unlink()
""")


def test_the_server_notices_a_deleted_lock_at_the_end_of_the_round(tmp_path, data, monkeypatch):
    here(tmp_path, data)
    run = tmp_path / "runs" / "unlocked"
    monkeypatch.setenv("WATCH_RUN", str(run))
    p = run_debug(tiny(tmp_path, "algorithm.name=deleting", "train.rounds=3", name="unlocked")
                  + with_plugin(tmp_path, DELETER, "deleting"))
    assert "the lock file" in p.stdout and "was deleted while the run held it; locked a new one" in p.stdout
    assert [r["round"] for r in metrics(run)] == [1, 2, 3] and (run / ".lock").is_file()


# ------------------------------------------------------------------ item 10: torn metrics are caught by readers
def test_a_finished_run_with_a_torn_last_metrics_line_is_left_out_then_repaired(tmp_path, data, capsys):
    from mpifed.entry.report import main as report_main
    here(tmp_path, data)
    run = tmp_path / "runs" / "torn"
    run_debug(tiny(tmp_path, name="torn"))
    whole = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(whole[:-40])                    # the last line cut short
    status = RunDir(run).status()
    assert status["state"] == "damaged" and "holds 1 damaged line(s) and rows of rounds 1-1" in status["error"]
    assert report_main([str(tmp_path / "runs"), "--out", str(tmp_path / "report")]) == 2
    assert "where status.json records 2 finished rounds" in capsys.readouterr().err
    p = run_debug(["--resume", str(run)])
    assert "writing its records again from" in p.stdout
    assert (run / "metrics.jsonl").read_text() == whole and RunDir(run).status()["state"] == "finished"


# ------------------------------------------------------------------ items 11, 14: uplinks checked, one message
BAD_UPLINK = """
    import torch
    from mpifed.algorithms.base import Algorithm, Client
    from mpifed.registry import ALGORITHMS

    KIND = "WHICH"

    class BadClient(Client):
        def uplink(self, ctx):
            up = super().uplink(ctx)
            if KIND == "nan" and ctx.cid == 2:
                up["model"] = up["model"] * float("nan")
            if KIND == "size":
                up["model"] = up["model"][:-3]
            if KIND == "zero":
                up["weight"] = up["weight"] * 0
            if KIND == "none":
                up["weight"] = None
            if KIND == "negative" and ctx.cid == 1:
                up["weight"] = -up["weight"]
            return up

    @ALGORITHMS.register("bad_WHICH")
    class Bad(Algorithm):
        Client = BadClient
"""


@pytest.mark.parametrize("kind,said", [
    ("nan", "BadClient.uplink (client 2, round 1): 'model' holds"),
    ("size", "from BadClient.uplink (client 0, round 1): 'model' has"),
    ("zero", "Server.aggregate (round 1) returned a global model with"),
    ("none", "from BadClient.uplink (client 0, round 1): 'weight' is NoneType, not a tensor"),
    ("negative", "BadClient.uplink (client 1, round 1): 'weight' is -"),
])
def test_a_bad_uplink_is_one_message_naming_the_hook_and_entry(tmp_path, data, kind, said):
    here(tmp_path, data)
    plugin = with_plugin(tmp_path, BAD_UPLINK.replace("WHICH", kind), f"bad_{kind}")
    p = run_debug(tiny(tmp_path, f"algorithm.name=bad_{kind}", "data.partition=iid", name=kind) + plugin, check=False)
    assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert metrics(tmp_path / "runs" / kind) == []                     # nothing NaN was written
    if kind == "zero":
        assert "(summed: weight=0)" in p.stderr


def test_a_plugin_that_registers_a_taken_name_is_one_message(tmp_path, data):
    here(tmp_path, data)
    source = "from mpifed.algorithms.fedavg import FedAvg\nfrom mpifed.registry import ALGORITHMS\n" \
             "ALGORITHMS.register('fedavg')(type('Mine', (FedAvg,), {}))\n"
    p = run_debug(tiny(tmp_path, name="taken") + with_plugin(tmp_path, source, "taken"), check=False)
    assert p.returncode == 2 and "'fedavg'" in p.stderr and "Traceback" not in p.stderr, p.stderr


# ------------------------------------------------------------------ item 12: bounded config files, a stop in start-up
def _bomb(levels=9):
    text = 'a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n'
    for i in range(1, levels):
        text += f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n"
    return text


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    (tmp_path / "bomb.yaml").write_text("train:\n  rounds: 2\nper_algorithm:\n  fedavg: {train: {lr: *a8}}\n"
                                        .replace("per_algorithm", _bomb() + "per_algorithm"))
    p = run_debug(["--config", str(tmp_path / "bomb.yaml"), "--show-config"], check=False)   # was: 3 GB, a MemoryError
    assert p.returncode == 2 and re.search(r"bomb.yaml' expands to [\d,]+ values once its aliases", p.stderr), p.stderr


def test_a_config_file_beyond_the_size_limit_is_refused_unread(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("train:\n  rounds: 2\n" + "# padding\n" * 500_000)
    p = run_debug(["--config", str(big), "--show-config"], check=False)
    assert p.returncode == 2 and "beyond mpifed's limit of 4 MiB for a config" in p.stderr


STOPPER = """
    import os, signal, time
    from mpifed.algorithms.base import Algorithm
    from mpifed.registry import ALGORITHMS

    ALGORITHMS.register("stopper")(type("Stopper", (Algorithm,), {}))
    os.kill(os.getpid(), signal.SIGTERM)    # as if preempted while the config is read
    time.sleep(0.5)                         # the listener thread records it
"""


def test_sigterm_during_start_up_ends_it_with_nothing_left(tmp_path, data):
    here(tmp_path, data)
    stopper = tmp_path / "stopper.py"
    stopper.write_text(textwrap.dedent(STOPPER))
    p = subprocess.run([sys.executable, "-m", "mpifed.main", *tiny(tmp_path, name="early"), "--plugin", str(stopper)],
                       cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 75, p.stderr
    assert "SIGTERM (preemption" in p.stderr and "during start-up (resolve): stopped before round 1" in p.stderr
    assert not (tmp_path / "runs" / "early").exists()


# ------------------------------------------------------------------ item 13: a seed beyond 64 bits
def test_a_seed_beyond_64_bits_is_a_config_error_and_leaves_no_prepared_folder(tmp_path):
    p = run_debug(tiny(tmp_path, "run.seed=18446744073709551616", name="seed"), check=False)
    assert p.returncode == 2 and "run.seed: 18446744073709551616 is out of range" in p.stderr
    assert not (tmp_path / "data").exists() or not any(".tmp" in p.name for p in (tmp_path / "data").rglob("*"))


# ------------------------------------------------------------------ item 15: small ones
def test_a_run_name_ending_in_a_newline_is_refused():
    with pytest.raises(ValueError, match="is not allowed"):
        check_run_name("run\n")
    check_run_name("run-1")


def test_a_full_disk_at_start_leaves_no_empty_run_directory(tmp_path, data, monkeypatch):
    import mpifed.run.rundir as rundir
    here(tmp_path, data)

    def full(path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(rundir, "open_lock", full)
    (tmp_path / "runs").mkdir()
    dated = [a for a in tiny(tmp_path) if not a.startswith("run.name=")]          # a new run directory, named by date
    for named in (dated, tiny(tmp_path, name="named")):
        p = run_debug(named, check=False)
        assert p.returncode == 2 and "is full (or your quota is used up): free space there" in p.stderr, p.stderr
        assert list((tmp_path / "runs").iterdir()) == []


def test_a_lock_that_is_a_folder_gets_its_own_hint(tmp_path, data):
    here(tmp_path, data)
    (tmp_path / "runs" / "locked" / ".lock").mkdir(parents=True)
    p = run_debug(tiny(tmp_path, name="locked"), check=False)
    assert p.returncode == 2 and ".lock is a folder, where mpifed keeps the run's lock file: remove it" in p.stderr


def test_resuming_a_finished_run_on_a_read_only_mount_has_nothing_to_do(tmp_path, data, monkeypatch):
    import mpifed.run.rundir as rundir
    here(tmp_path, data)
    run = tmp_path / "runs" / "ro"
    run_debug(tiny(tmp_path, name="ro"))

    def read_only(path):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(rundir, "open_lock", read_only)
    p = run_debug(["--resume", str(run)])
    assert "is finished (2 rounds): nothing to resume" in p.stdout
    p = run_debug(["--resume", str(run), "--set", "train.rounds=3"], check=False)
    assert p.returncode == 2 and "is on a read-only file system" in p.stderr


FAILING_EARLY = """#!/bin/sh
[ "$1" = --version ] && { echo "mpirun (Open MPI) 5.0.5"; exit 0; }
exit 1
"""


def test_the_launcher_says_a_last_word_when_the_ranks_fail_before_a_checkpoint(tmp_path, monkeypatch, capsys):
    assert launch_with_mpirun(tmp_path, monkeypatch, FAILING_EARLY) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("[mpifed.launch] the job failed (mpirun exited with 1). It wrote no checkpoint: the ranks' "
                    "messages above say why; once that is fixed, run the same command again")


# ------------------------------------------------------------------ item 9: a table's identity and its path's spelling
def test_a_tables_run_root_does_not_depend_on_how_its_path_is_spelled(tmp_path, monkeypatch):
    from mpifed.tables.table_file import load_table
    table = write_tiny_table(tmp_path / "paper", tmp_path / "data")
    roots = set()
    for cwd, spelling in ((tmp_path, table), (tmp_path, Path("paper") / table.name),
                          (tmp_path, Path("paper/../paper") / table.name), (table.parent, Path(table.name))):
        monkeypatch.chdir(cwd)
        roots |= {r.root for r in load_table(spelling, runs_root=str(tmp_path / "runs")).runs}
    assert len(roots) == 1 and roots.pop().name.startswith("paper-")        # was: "-table" from inside the folder


# ------------------------------------------------------------------ issue 76: a key set twice, a file not in UTF-8
TWICE = "train:\n  rounds: 2\nrun:\n  seed: 1\ntrain:\n  lr: 0.1\n"     # YAML alone keeps lr and drops rounds


def test_a_key_set_twice_in_a_config_is_one_message_naming_both_lines(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TWICE)
    p = subprocess.run([sys.executable, "-m", "mpifed.main", "--config", str(bad), "--show-config"], cwd=REPO,
                       env=env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr == (f"[mpifed] config file '{bad}': the key 'train' is set twice, on lines 1 "
                                              f"and 5; YAML keeps only the last, dropping the first without a word: "
                                              f"remove one of them, or merge the two into one\n"), p.stderr
    bad.write_text("data:\n  partition:\n    name: iid\n    beta: 0.5\n    name: dirichlet\n")   # at any depth
    p = run_debug(["--config", str(bad), "--show-config"], check=False)
    assert p.returncode == 2 and "the key 'data.partition.name' is set twice, on lines 3 and 5" in p.stderr, p.stderr
    p = run_debug(["--show-config", "--set", "data.partition={name: iid, name: dirichlet}"], check=False)
    assert p.returncode == 2 and "override 'data.partition={name: iid, name: dirichlet}': the key 'name' is set " \
                                 "twice, on line 1 (columns 2 and 13)" in p.stderr, p.stderr
    merged = safe_yaml.load("a: &a {lr: 0.1, rounds: 2}\nb:\n  <<: *a\n  lr: 0.2\n", "merge")   # set again: allowed
    assert merged["b"] == {"lr": 0.2, "rounds": 2}


def test_a_key_set_twice_in_a_table_file_or_a_runs_own_files_is_refused(tmp_path):
    from mpifed.settings.config import ConfigError
    from mpifed.tables.table_file import load_table
    from mpifed.tables.tuning import ChoiceBook
    table = write_tiny_table(tmp_path / "paper", tmp_path / "data")
    table.write_text(table.read_text() + "seeds: [0]\n")
    with pytest.raises(ConfigError, match=r"x.table.yaml: the key 'seeds' is set twice, on lines 5 and 6"):
        load_table(table, str(tmp_path / "runs"))
    (tmp_path / "choices.yaml").write_text("- setting: s\n  method: a\n  search: lr\n  chosen: {}\n  method: b\n")
    with pytest.raises(ConfigError, match=r"the key 'method' is set twice, on lines 2 and 5"):
        ChoiceBook(tmp_path)
    run = tmp_path / "runs" / "twice"
    run.mkdir(parents=True)
    (run / ".mpifed-run").touch()
    (run / "config.yaml").write_text(TWICE)
    p = run_debug(["--resume", str(run)], check=False)
    assert p.returncode == 2 and f"{run / 'config.yaml'}: the key 'train' is set twice, on lines 1 and 5" in p.stderr


def test_a_config_not_in_utf8_is_one_message_naming_the_file(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("run:\n  group: café\n".encode("latin-1"))
    p = run_debug(["--config", str(latin), "--show-config"], check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert f"config file '{latin}' is not UTF-8 text (line 2 holds the byte 0xe9" in p.stderr
    assert "mpifed reads YAML files as UTF-8 only; save it as UTF-8" in p.stderr
    wide = tmp_path / "wide.yaml"
    wide.write_text("run:\n  group: café\n", encoding="utf-16")
    p = run_debug(["--config", str(wide), "--show-config"], check=False)
    assert p.returncode == 2 and f"config file '{wide}' is UTF-16 text" in p.stderr, p.stderr
    run = tmp_path / "runs" / "latin"
    run.mkdir(parents=True)
    (run / ".mpifed-run").touch()
    (run / "config.yaml").write_bytes(latin.read_bytes())
    p = run_debug(["--resume", str(run)], check=False)
    assert p.returncode == 2 and f"{run / 'config.yaml'} is not UTF-8 text" in p.stderr, p.stderr


# ------------------------------------------------------------------ issue 76: a real full disk at a run's start
@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs of the test's own, unmounted after it; the test is skipped where mounting one is
    not allowed (not root, or a container without the right)."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk is a small tmpfs, and mounting one needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)])


def fill(disk, pages_left):
    """Fill ``disk`` (a tmpfs) but ``pages_left`` pages: a file's data takes whole pages there, while
    making a file or folder takes none, so the run's .lock is made and its first writes get a page each."""
    free = os.statvfs(disk)
    (disk / "fill").write_bytes(bytes((free.f_bavail - pages_left) * free.f_bsize))


@pytest.mark.parametrize("pages, failing", [(0, ".lock"), (1, "config.yaml"), (2, "status.json"),
                                            (3, "provenance.json"), (4, "log.txt")])
def test_a_real_full_disk_at_start_leaves_nothing_that_blocks_the_same_run(tmp_path, data, small_disk, pages,
                                                                            failing):
    here(tmp_path, data)
    fill(small_disk, pages)
    args = tiny(tmp_path, f"run.root={small_disk / 'runs'}", name="full")
    p = run_debug(args, check=False)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    if failing == ".lock":                       # the lock file is made, writing its holder fails
        assert "cannot create or lock the run directory" in p.stderr and "is full" in p.stderr, p.stderr
        p = run_debug([a for a in args if not a.startswith("run.name=")], check=False)      # named by the date
        assert p.returncode == 2 and "is full" in p.stderr, p.stderr
    else:
        assert (f"No space left on device writing {small_disk / 'runs' / 'full' / failing}, before the run's first "
                f"round: what its start wrote in {small_disk / 'runs' / 'full'} is removed (nothing was trained); "
                f"free space there, then run the same command again") in p.stderr, p.stderr
    assert list((small_disk / "runs").iterdir()) == []
    (small_disk / "fill").unlink()
    run_debug(args)
    assert RunDir(small_disk / "runs" / "full").state() == "finished"
