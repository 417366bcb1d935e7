"""The run directory and prepared data under abuse: names, locks (also read by users who cannot
write them), status, stale temporary files and folders, changed raw data, damaged manifests and
partition files, lost checkpoints and config.yaml files, full disks and stop messages (debug mode,
in-process)."""
import contextlib
import errno
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO, env, metrics, run_debug, tiny
from mpifed.run import rundir
from mpifed.data.sets.idx import write_idx
from mpifed.run.rundir import RunDir

pytestmark = pytest.mark.e2e


def hold_lock(path):
    """A separate process that holds the run lock of ``path`` until its stdin closes."""
    code = ("import sys; from pathlib import Path; from mpifed.run.rundir import RunDir; "
            f"RunDir(Path({str(path)!r})).lock(); print('locked', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.parametrize("name", ["..", "../x", "/tmp/abs", "a/b", ".hidden", "a b"])
def test_unsafe_run_names_are_refused_and_nothing_outside_run_root_is_touched(tmp_path, name):
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "f").write_text("x")
    (tmp_path / "config.yaml").write_text("a: 1\n")
    p = run_debug(tiny(tmp_path, name=name) + ["--overwrite"], check=False)
    assert p.returncode == 2 and "is not allowed" in p.stderr and "run.root" in p.stderr
    assert (tmp_path / "keep" / "f").read_text() == "x" and (tmp_path / "config.yaml").exists()


def test_overwrite_removes_only_a_directory_mpifed_made(tmp_path):
    foreign = tmp_path / "runs" / "run"
    foreign.mkdir(parents=True)
    (foreign / "config.yaml").write_text("mine: 1\n")
    p = run_debug(tiny(tmp_path) + ["--overwrite"], check=False)
    assert p.returncode == 2 and ".mpifed-run" in p.stderr and "deletes nothing there" in p.stderr
    assert (foreign / "config.yaml").read_text() == "mine: 1\n"
    (foreign / "config.yaml").unlink()
    run_debug(tiny(tmp_path))
    run_debug(tiny(tmp_path, "train.rounds=1") + ["--overwrite"])
    assert len(metrics(foreign)) == 1


def test_a_locked_run_is_refused_naming_host_and_pid(tmp_path):
    holder = hold_lock(tmp_path / "runs" / "run")
    try:
        p = run_debug(tiny(tmp_path), check=False)
        assert p.returncode == 2 and "in use by another run" in p.stderr
        assert f"host {socket.gethostname()} pid {holder.pid}" in p.stderr
        assert not (tmp_path / "runs" / "run" / "config.yaml").exists()
    finally:
        holder.stdin.close()
        holder.wait()
    run_debug(tiny(tmp_path))  # the lock died with its holder


def test_status_running_without_a_live_holder_reads_as_failed(tmp_path):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.write_json("status.json", {"state": "running", "rounds_done": 2, "checkpoint": None})
    holder = hold_lock(run.path)
    try:
        assert run.status()["state"] == "running"
    finally:
        holder.stdin.close()
        holder.wait()
    status = run.status()
    assert status["state"] == "failed" and "ended without recording why" in status["error"]
    (run.path / "status.json").write_text("[1, 2")
    assert run.status() is None


def test_resuming_a_finished_run_changes_nothing(tmp_path):
    run_debug(tiny(tmp_path))
    run = tmp_path / "runs" / "run"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    p = run_debug(["--resume", str(run)])
    assert "is finished (2 rounds): nothing to resume, nothing changed" in p.stdout
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before


def test_resume_removes_temporary_files_left_by_a_failed_write(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=3", "run.checkpoint_every=1", "algorithm.name=scaffold", name="full"))
    run_debug(tiny(tmp_path, "train.rounds=3", "run.checkpoint_every=1", "algorithm.name=scaffold"))
    run = tmp_path / "runs" / "run"
    (run / "checkpoints" / "round_000003.ckpt").unlink()
    left = [run / ".status.json.tmp4242", run / "checkpoints" / "round_000003.ckpt.tmp4242",
            run / "client_state" / ".store.json.tmp4242"]
    for f in left:
        f.write_bytes(b"partial")
    p = run_debug(["--resume", str(run)])
    assert "removed 3 temporary file(s)" in p.stdout
    assert not any(f.exists() for f in left)
    assert metrics(run) == metrics(tmp_path / "runs" / "full")


def test_full_disk_during_a_checkpoint_is_one_message_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".ckpt.tmp" + str(os.getpid())):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)
    monkeypatch.setattr(rundir.os, "fsync", fsync)
    p = run_debug(tiny(tmp_path, "run.checkpoint_every=1"), check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "No space left on device writing" in p.stderr and "round_000001.ckpt" in p.stderr and "--resume" in p.stderr
    run = tmp_path / "runs" / "run"
    assert not [f for f in run.rglob("*") if ".tmp" in f.name]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed" and "No space left" in status["error"]


def test_failure_handler_that_cannot_write_adds_no_second_traceback(tmp_path, monkeypatch):
    written = []
    real = RunDir.write_json

    def full_once_started(self, name, data):   # the disk fills up after the run's first status
        written.append(name)
        if len(written) > 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path / name))
        real(self, name, data)
    monkeypatch.setattr(RunDir, "write_json", full_once_started)
    p = run_debug(tiny(tmp_path, "run.checkpoint_every=1"), check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "could not record the failure" in p.stderr


def test_unwritable_run_root_and_prepared_root_are_named(tmp_path):
    (tmp_path / "file").write_text("x")
    for key, where in (("run.root", tmp_path / "file"), ("run.root", "/proc/mpifed-runs"),
                       ("data.prepared_root", tmp_path / "file")):
        p = run_debug(tiny(tmp_path) + [f"{key}={where}"], check=False)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert str(where) in p.stderr and key in p.stderr


def prepared_folder(tmp_path):
    return next(p for p in (tmp_path / "data").iterdir() if (p / "manifest.json").exists())


def test_malformed_manifest_is_reported(tmp_path):
    run_debug(tiny(tmp_path, "train.rounds=1"))
    manifest = prepared_folder(tmp_path) / "manifest.json"
    m = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**m, "mean": "abc"}))
    p = run_debug(tiny(tmp_path, "train.rounds=1", name="b"), check=False)
    assert p.returncode == 2 and "'mean' must be a list" in p.stderr and "--force" in p.stderr
    manifest.unlink()
    manifest.mkdir()
    p = run_debug(tiny(tmp_path, "train.rounds=1", name="c"), check=False)
    assert p.returncode == 2 and f"cannot read {manifest}" in p.stderr and "--force" in p.stderr


def test_a_damaged_client_stops_the_run_when_it_is_read_and_a_damaged_block_before_training(tmp_path):
    import h5py
    run_debug(tiny(tmp_path, "train.rounds=1"))
    block = prepared_folder(tmp_path) / "clients" / "block_00000.h5"
    with h5py.File(block, "r+") as f:
        start = int(f["offsets"][4])
        f["labels"][start] = f["labels"][start] + 1
    p = run_debug(tiny(tmp_path, "train.rounds=1", name="b"), check=False)
    assert p.returncode == 2 and "client 4 in" in p.stderr and "block_00000.h5 does not match its checksum" in p.stderr
    assert "round 1/" not in p.stdout and "--force" in p.stderr
    data = block.read_bytes()
    block.write_bytes(data[: len(data) // 2])
    p = run_debug(tiny(tmp_path, "train.rounds=1", name="c"), check=False)
    assert p.returncode == 2 and "block_00000.h5 is corrupt or truncated" in p.stderr
    assert "round 1/" not in p.stdout


def write_mnist(folder, train, test, seed):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", train), ("t10k", test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte", rng.integers(0, 255, (n, 28, 28)))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n))


def tiny_mnist(tmp_path, name="run"):
    """tiny() on the IDX files in tmp_path/mnist, with one round."""
    raw = ["data.dataset={name: mnist, root: " + str(tmp_path / "mnist") + "}", "data.partition=iid", "train.rounds=1"]
    return [a for a in tiny(tmp_path, *raw, name=name) if not a.startswith("data.dataset.")]


def test_changed_raw_data_stops_the_run_naming_the_file(tmp_path):
    write_mnist(tmp_path / "mnist", 200, 50, seed=0)
    run_debug(tiny_mnist(tmp_path))
    write_mnist(tmp_path / "mnist", 150, 50, seed=1)
    p = run_debug(tiny_mnist(tmp_path, name="b"), check=False)
    assert p.returncode == 2 and "raw data changed" in p.stderr and "--force" in p.stderr
    assert "train-images-idx3-ubyte changed size" in p.stderr
    from mpifed.entry.prepare import main as prepare
    assert prepare(["--force", *tiny_mnist(tmp_path, name="b")]) == 0
    run_debug(tiny_mnist(tmp_path, name="b"))


def test_same_size_rewrite_of_raw_data_is_noticed(tmp_path):
    raw = tmp_path / "mnist"
    write_mnist(raw, 200, 50, seed=0)
    run_debug(tiny_mnist(tmp_path))
    labels = raw / "train-labels-idx1-ubyte"
    stat = labels.stat()
    data = bytearray(labels.read_bytes())
    data[-1] = (data[-1] + 1) % 10
    labels.write_bytes(bytes(data))
    os.utime(labels, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same time: only the hash tells
    p = run_debug(tiny_mnist(tmp_path, name="b"), check=False)
    assert p.returncode == 2 and f"the content of {labels.resolve()} changed" in p.stderr
    assert not [f for f in raw.iterdir() if f != labels and f.name in p.stderr]   # only the changed file is named


def test_manifests_with_one_hash_over_all_raw_files_are_still_checked(tmp_path):
    from mpifed.data import fingerprint as fp
    files = [tmp_path / "a.csv", tmp_path / "b.csv"]
    for f in files:
        f.write_bytes(b"1,a\n")
    old = {"files": [{k: v for k, v in e.items() if k != "sha256"} for e in fp.fingerprint(files)["files"]],
           "sha256": fp._digest(files)}
    assert fp.first_change(old) is None
    files[1].write_bytes(b"2,a\n")
    assert "content of the raw files" in fp.first_change(old) and "b.csv" in fp.first_change(old)


def test_stop_before_round_one_says_nothing_was_trained(tmp_path, monkeypatch):
    from mpifed.round import server
    monkeypatch.setattr(server, "stop_requested", lambda: True)
    monkeypatch.setattr(server, "received", lambda: ["SIGUSR1"])
    p = run_debug(tiny(tmp_path), check=False)
    assert p.returncode == 75 and "None" not in p.stdout
    assert "stopped before round 1 on SIGUSR1 (a scheduler's warning, or kill -USR1): nothing was trained" in p.stdout


def test_fingerprint_of_an_image_folder_notices_a_renamed_image(tmp_path):
    from mpifed.data.fingerprint import first_change, fingerprint
    folder = tmp_path / "back_pack"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"x")
    recorded = fingerprint([folder])
    assert recorded["files"][0]["sha256"] and first_change(recorded) is None
    mtime = folder.stat().st_mtime_ns
    (folder / "a.jpg").rename(folder / "b.jpg")
    os.utime(folder, ns=(mtime, mtime))          # even with the folder's time put back
    assert "changed" in first_change(recorded)


def test_fingerprint_accepts_the_same_bytes_written_again(tmp_path, monkeypatch):
    from mpifed.data import fingerprint as fp
    f = tmp_path / "train.csv"
    f.write_bytes(b"1,a\n")
    recorded = fp.fingerprint([f])
    f.write_bytes(b"1,a\n")
    os.utime(f, ns=(1, 10**18))
    assert fp.first_change(recorded) is None            # copied again: same bytes, newer time
    f.write_bytes(b"2,a\n")
    assert fp.first_change(recorded) == f"the content of {f} changed"
    monkeypatch.setattr(fp, "HASH_LIMIT", 1)            # too large to hash: the time is all there is
    f.write_bytes(b"1,a\n")
    unhashed = fp.fingerprint([f])
    assert "sha256" not in unhashed["files"][0]
    os.utime(f, ns=(1, 10**18))
    assert "was modified after the data was prepared" in fp.first_change(unhashed)


def refuse_writes(monkeypatch):
    """From now on this process may open files for reading only (a teammate, a read-only mount)."""
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):
        if flags & (os.O_RDWR | os.O_WRONLY | os.O_CREAT):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)
    monkeypatch.setattr(rundir.os, "open", read_only)


def test_a_live_run_reads_as_running_to_a_reader_who_cannot_write_its_lock(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.write_json("status.json", {"state": "running", "rounds_done": 2, "checkpoint": None})
    holder = hold_lock(run.path)
    refuse_writes(monkeypatch)
    try:
        assert run.in_progress() and run.status()["state"] == "running"
    finally:
        holder.stdin.close()
        holder.wait()
    assert not run.in_progress() and run.status()["state"] == "failed"


def test_a_live_run_reads_as_running_on_a_read_only_mount(tmp_path, read_only_view):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.write_json("status.json", {"state": "running", "rounds_done": 2, "checkpoint": None})
    holder = hold_lock(run.path)
    try:
        assert RunDir(read_only_view(run.path)).status()["state"] == "running"
    finally:
        holder.stdin.close()
        holder.wait()
    assert RunDir(read_only_view(run.path)).status()["state"] == "failed"


def test_a_lock_file_this_user_cannot_read_leaves_status_as_written(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    (run.path / ".lock").touch()
    run.write_json("status.json", {"state": "running", "rounds_done": 2, "checkpoint": None})

    real = os.open

    def unreadable(path, flags, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, *args, **kwargs)
    monkeypatch.setattr(rundir.os, "open", unreadable)
    assert run.status()["state"] == "running"


def snapshot(run):
    return {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}


def test_a_finished_run_whose_checkpoints_were_deleted_stays_finished(tmp_path):
    run_debug(tiny(tmp_path))
    run = tmp_path / "runs" / "run"
    shutil.rmtree(run / "checkpoints")
    before = snapshot(run)
    for resume in (["--resume", str(run)], tiny(tmp_path) + ["--resume"]):   # the second: as slurm/ scripts do
        p = run_debug(resume)
        assert "is finished (2 rounds; its checkpoints were deleted): nothing to resume, nothing changed" in p.stdout
        assert "round 1/" not in p.stdout and snapshot(run) == before
    p = run_debug(["--resume", str(run), "--set", "train.rounds=3"], check=False)
    assert p.returncode == 2 and "has no checkpoint left" in p.stderr and "another run.name" in p.stderr
    assert snapshot(run) == before and not (run / "checkpoints").exists()


@pytest.mark.parametrize("text,problem", [("", "is empty"), ("- 1\n- 2\n", "holds a list"),
                                          ("just words\n", "holds a str")])
def test_a_run_whose_config_yaml_is_not_a_mapping_is_refused_with_the_fix(tmp_path, text, problem):
    run_debug(tiny(tmp_path, "train.rounds=3", "run.checkpoint_every=2"))
    run = tmp_path / "runs" / "run"
    (run / "checkpoints" / "round_000003.ckpt").unlink()
    (run / "config.yaml").write_text(text)
    before = snapshot(run)
    p = run_debug(["--resume", str(run)], check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert f"its config.yaml {problem}" in p.stderr and "under the key 'config'" in p.stderr
    assert "round_000002.ckpt" in p.stderr and snapshot(run) == before
    fix = re.search(r"(python -c .*) > (\S+)$", p.stderr.strip()).group(1)   # the fix works as printed
    restored = subprocess.run(fix, shell=True, cwd=REPO, env=env(), capture_output=True, text=True, check=True).stdout
    (run / "config.yaml").write_text(restored)
    run_debug(["--resume", str(run)])
    assert len(metrics(run)) == 3


def test_a_partition_file_that_is_not_an_index_file_is_one_message(tmp_path):
    from mpifed.entry.prepare import main as prepare
    bad = {"zero-d.npy": None, "garbage.npy": b"\x93NUMPY\x01\x00garbage" * 4, "text.npy": b"[[1, 2], [3]]\n",
           "folder.json": "dir", "none.json": b"[]"}
    for name, content in bad.items():
        path = tmp_path / name
        if content is None:
            np.save(path, np.array(5))
        elif content == "dir":
            path.mkdir()
        else:
            path.write_bytes(content)
        split = [f"data.partition={{name: from_file, path: {path}}}", "data.num_clients=2"]
        p = run_debug(tiny(tmp_path, *split, name=name), check=False)
        assert p.returncode == 2 and "Traceback" not in p.stderr and str(path) in p.stderr, p.stderr
        assert "num_clients=0" not in p.stderr
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            assert prepare(tiny(tmp_path, *split)) == 2
        assert str(path) in err.getvalue(), err.getvalue()
    assert "is a folder, not a file" in run_debug(tiny(tmp_path, "data.partition={name: from_file, path: "
                                                            f"{tmp_path / 'folder.json'}}}"), check=False).stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_cuda_without_a_gpu_is_one_message(tmp_path):
    p = run_debug(tiny(tmp_path, "resources.device=cuda"), check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "resources.device=cuda but no GPU is visible" in p.stderr and "resources.device=auto" in p.stderr


def without_name(args):
    return [a for a in args if not a.startswith("run.name=")]


def test_default_run_names_are_valid_and_unique_within_a_second(tmp_path, monkeypatch):
    real = rundir.time.strftime
    monkeypatch.setattr(rundir.time, "strftime",
                        lambda fmt, *t: "20260101-120000" if fmt == "%Y%m%d-%H%M%S" else real(fmt, *t))
    config = tmp_path / "my setting é.yaml"
    config.write_text("train: {rounds: 1}\n")
    run_debug(["--config", str(config), *without_name(tiny(tmp_path, "train.rounds=1"))])
    run_debug(["--config", str(config), *without_name(tiny(tmp_path, "train.rounds=1"))])
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert names == ["my_setting_-20260101-120000", "my_setting_-20260101-120000-2"]
    for name in names:
        rundir.check_run_name(name)
        assert RunDir(tmp_path / "runs" / name).status()["state"] == "finished"


def test_prepare_removes_temporary_folders_of_dead_prepares_on_this_host(tmp_path):
    from mpifed.entry.prepare import main as prepare
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = socket.gethostname()
    data = tmp_path / "data"
    stale = [data / f"synthetic-iid-k5-0123456789.tmp-{host}-{gone.pid}", data / f"other.tmp-{host}-{gone.pid}"]
    kept = [data / f"live.tmp-{host}-{os.getpid()}", data / f"remote.tmp-elsewhere.example-{gone.pid}"]
    for force in ([], ["--force"]):
        for folder in stale + kept:
            (folder / "clients").mkdir(parents=True, exist_ok=True)
            (folder / "clients" / "block_00000.h5").write_bytes(b"partial")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert prepare(tiny(tmp_path, "data.partition=iid") + force) == 0
        assert not any(f.exists() for f in stale) and all(f.exists() for f in kept)
        assert "removed 2 temporary folder(s)" in out.getvalue() and "remote.tmp-elsewhere.example" in out.getvalue()


def test_a_run_that_fails_before_it_begins_leaves_no_directory(tmp_path):
    """A data preparation that fails (here: more clients than samples) leaves no runs/<name>/ holding only .lock."""
    p = run_debug(tiny(tmp_path, "data.num_clients=400"), check=False)
    assert p.returncode == 2 and "data.num_clients" in p.stderr, p.stderr
    assert not (tmp_path / "runs" / "run").exists()
    held = tmp_path / "runs" / "kept"
    held.mkdir(parents=True)
    RunDir(held).lock()
    RunDir(held).unlock()
    assert held.is_dir()                                   # a directory that was there before stays


def test_a_diverged_run_is_told_by_its_recorded_flag_and_an_archived_one_by_its_error(tmp_path):
    cases = [({"diverged": True, "error": "rank 2: the loss is nan"}, "diverged"),
             ({"diverged": False, "error": "RuntimeError: NonFiniteLoss: in a user's message"}, "failed"),
             ({"error": "rank 2: NonFiniteLoss: client 1, round 2: the local loss is nan"}, "diverged"),   # archived
             ({"error": "RuntimeError: CUDA out of memory"}, "failed")]
    for i, (status, expected) in enumerate(cases):
        run = tmp_path / f"run{i}"
        run.mkdir()
        (run / "status.json").write_text(json.dumps({"state": "failed", **status}))
        assert RunDir(run).state() == expected, status
