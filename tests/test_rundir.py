"""The run directory and prepared data under abuse: names, locks, status, stale temporary files,
changed raw data, damaged manifests, full disks and stop messages (debug mode, in-process)."""
import errno
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, env, metrics, run_debug, tiny
from mpifed import rundir
from mpifed.data.sets.idx import write_idx
from mpifed.rundir import RunDir

pytestmark = pytest.mark.e2e


def hold_lock(path):
    """A separate process that holds the run lock of ``path`` until its stdin closes."""
    code = ("import sys; from pathlib import Path; from mpifed.rundir import RunDir; "
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
    assert p.returncode == 2 and ".mpifed-run" in p.stderr and "not deleted" in p.stderr
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
            next((run / "client_state").iterdir()) / ".r2.bin.tmp4242"]
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
    def full(self, name, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path / name))
    monkeypatch.setattr(RunDir, "write_json", full)
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


def test_a_corrupt_shard_stops_the_run_before_training(tmp_path):
    import h5py
    run_debug(tiny(tmp_path, "train.rounds=1", "train.participation=0.2"))
    shard = prepared_folder(tmp_path) / "clients" / "client_00004.h5"
    with h5py.File(shard, "r+") as f:
        f["labels"][0] = f["labels"][0] + 1
    p = run_debug(tiny(tmp_path, "train.rounds=1", "train.participation=0.2", name="b"), check=False)
    assert p.returncode == 2 and "client_00004.h5 does not match its checksum" in p.stderr
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
    from mpifed.prepare import main as prepare
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
    assert p.returncode == 2 and "content of the raw files" in p.stderr


def test_stop_before_round_one_says_nothing_was_trained(tmp_path, monkeypatch):
    from mpifed import server
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
    assert recorded["sha256"] and first_change(recorded) is None
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
    assert "content of the raw files" in fp.first_change(recorded) and "train.csv" in fp.first_change(recorded)
    monkeypatch.setattr(fp, "HASH_LIMIT", 1)            # too large to hash: the time is all there is
    f.write_bytes(b"1,a\n")
    unhashed = fp.fingerprint([f])
    assert unhashed["sha256"] is None
    os.utime(f, ns=(1, 10**18))
    assert "was modified after the data was prepared" in fp.first_change(unhashed)


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
