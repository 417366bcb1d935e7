"""The run directory ``runs/<name>/`` and atomic writes of everything in it.

    config.yaml      the resolved configuration
    metrics.jsonl    one line per round (appended; cut back to the checkpoint on resume)
    clients.jsonl    per round: each sampled client's worker, samples, loss, time (likewise)
    summary.json     final and best accuracy, forgetting, timing, status
    status.json      running (from before round 1) | stopped (resumable) | finished | failed; readers
                     (:meth:`RunDir.status`) also see a dead ``running`` as failed, and a finished run
                     whose metrics.jsonl is not one whole row per round as damaged
    model.pt         the final global model (state_dict)
    log.txt          what rank 0 printed, plus each rank's host and device
    checkpoints/     see checkpoint.py
    client_state/    see client_state.py
    client_acc.jsonl per evaluation: each client's accuracy on its held-out rows (data.client_holdout)
    provenance.json  each start: when, from which round, which software and machines (provenance.py)
    plugins/         a copy of the source of each plugin the run loaded (see plugins.py)
    .mpifed-run      marks a directory mpifed made: mpifed writes only into a new or empty folder or one
                     with this marker, and --overwrite replaces only such a directory
    .lock            held (an OS lock) by the server rank while the run is in progress

A run name is one path component of letters, digits and ``._+-@=`` (not starting with a
dot), so a run never writes outside ``run.root``. Nothing in a run directory is followed through
a symbolic link: a run refuses to start in a directory whose own files are links, files are read
and appended without following one (:mod:`mpifed.files.nofollow`), and a run's record leaves links out.

The lock is a POSIX record lock (``fcntl``) on ``.lock``: the kernel releases it when the
holder dies, however it dies, so a killed run leaves no stale lock. The holder checks at every
round's end that ``.lock`` is still the file it locked (:meth:`RunDir.check_lock`). POSIX locks are
coherent across the nodes of NFS (NLM for v3, built into v4) and of Lustre mounted with
``-o flock``; where the file system refuses locks the run goes on with a warning. Readers
test the lock without taking it (``F_GETLK`` on a read-only descriptor), so a teammate or a
read-only mount sees a live run as running.
"""
from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import re
import shutil
import socket
import struct
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from mpifed.files import safe_yaml
from mpifed.files.nofollow import open_append, open_lock, read_bytes, read_text
from mpifed.run.state import RunState

# the files and folders of a run directory, named here only (the module docstring says what each holds)
CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
CLIENTS = "clients.jsonl"
CLIENT_ACC = "client_acc.jsonl"         # each client's accuracy on its held-out rows (data.client_holdout)
SUMMARY = "summary.json"
STATUS = "status.json"
PROVENANCE = "provenance.json"          # where and with which software each start ran (provenance.py)
MODEL = "model.pt"
LOG = "log.txt"
CHECKPOINTS = "checkpoints"
CLIENT_STATE = "client_state"
PLUGINS = "plugins"
MARKER = ".mpifed-run"
LOCK = ".lock"
KILLED = "the run's processes ended without recording why (killed, or their node was lost)"
_WRITTEN = {state.value for state in RunState}   # a state status.json can hold
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+@=-]*")
_TEMPORARY = re.compile(r"^(\..+\.tmp\d+|.+\.ckpt\.tmp\d+|\.r\d+\.bin\.tmp\d+)$")
_held: dict[Path, int] = {}  # run directory -> descriptor of its lock file, for the locks this process holds
_fresh: dict[Path, bool] = {}  # held run directory -> whether this start created it, for those whose every entry
                               # is this start's and whose rounds have not begun (see RunDir.unlock)
_claimed: set[Path] = set()  # the run directories claim_new created in this process


class RunLocked(RuntimeError):
    """Another live process holds the run directory."""


class LockLost(RunLocked):
    """The run's lock file was deleted or replaced while the run held it, and another process has
    taken the new one: this process must write nothing more into the directory."""


class NotOurs(OSError):
    """A folder mpifed did not make, or whose own files are links: mpifed does not write into it."""

    def __str__(self) -> str:
        return self.strerror


def release_locks() -> None:
    """Release every run lock this process holds (at the end of a run)."""
    for path in list(_held):
        RunDir(path).unlock()
    for path in list(_claimed):   # claimed, then the run ended before it began: nothing to keep
        _claimed.discard(path)
        _remove_empty(path)


def undo_starts() -> list[Path]:
    """Release the locks of the run directories whose rounds have not begun, undoing their start (see
    :meth:`RunDir.unlock`), and return them; the locks of runs under way stay held."""
    return [path for path in list(_fresh) if RunDir(path).unlock()]


def _remove_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:   # not empty (or gone): kept
        pass


def check_run_name(name: str) -> None:
    """Raise ValueError unless ``name`` is one safe path component."""
    if len(name) > 200 or not _SAFE_NAME.fullmatch(name):
        raise ValueError(f"run.name={name!r} is not allowed: a run name is one folder name of letters, digits and "
                         f"._+@=- (not starting with a dot, no '/'), e.g. run.name=cifar10-fedavg-s0; "
                         f"choose the parent folder with run.root")


def default_run_name(stem: str) -> str:
    """``<stem>-<date>-<time>`` for a run named after its config file, the stem made a valid run
    name (characters outside letters, digits and ``._+@=-`` become ``_``)."""
    safe = re.sub(r"[^A-Za-z0-9._+@=-]+", "_", stem).lstrip(".+@=-")[:150] or "run"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}"


def claim_new(root: Path, name: str) -> Path:
    """Create a new run directory ``root/name``, or ``root/name-2``, ``-3``, ... when that one
    exists (a run started in the same second, or any other folder); returns it. Creating the
    folder is the claim, so two processes never get the same one."""
    root.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = root / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        _claimed.add(path.resolve())
        return path


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write to a temporary file beside ``path``, then rename it over ``path``; on failure (a full
    disk) the temporary file is removed and ``path`` is left as it was."""
    write_then_rename(path, path.with_name(f".{path.name}.tmp{os.getpid()}"),
                      data.encode() if isinstance(data, str) else data)


def write_then_rename(path: Path, tmp: Path, data: bytes) -> None:
    """Write ``data`` to ``tmp``, flush it to disk and rename it to ``path``; ``tmp`` never outlives a failure."""
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename in (None, str(tmp)):   # the message names the file written
            exc.filename = str(path)
        raise


def _named_divergence(status: dict[str, Any]) -> bool:
    """Whether a status.json written without ``diverged`` (archived runs) names the divergence error: its
    error reads "NonFiniteLoss: ..." (or "rank N: NonFiniteLoss: ..."), mpifed.algorithms.base.NonFiniteLoss."""
    return "NonFiniteLoss: " in str(status.get("error", ""))


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.checkpoints = path / CHECKPOINTS
        self.client_state = path / CLIENT_STATE
        self.console: Callable[[str], None] = lambda message: print(message, flush=True)
        self._log = None

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        open_append(self.path / MARKER).close()
        self._log = open_append(self.path / LOG, buffering=1)

    def holds_run(self) -> bool:
        return (self.path / CONFIG).exists()

    def made_by_mpifed(self) -> bool:
        return (self.path / MARKER).is_file() and not (self.path / MARKER).is_symlink()

    def check_ours(self) -> None:
        """Raise :class:`NotOurs` unless mpifed may write into this directory: it does not exist yet, is
        empty, or mpifed made it (its marker), and none of a run's own files in it is a symbolic link."""
        if not self.path.is_dir() or all(p.name == LOCK for p in self.path.iterdir()):   # a lock: a run's start
            return
        if not self.made_by_mpifed():
            raise NotOurs(errno.EEXIST, f"{self.path} exists and was not made by mpifed (it has no {MARKER} file), so "
                                        f"mpifed writes nothing into it and deletes nothing there: choose another "
                                        f"run.name, or move the folder away")
        links = self.links()
        if links:
            raise NotOurs(errno.ELOOP, f"{self.path} holds symbolic links where a run keeps its own files "
                                       f"({', '.join(str(p.relative_to(self.path)) for p in links)}); mpifed never "
                                       f"writes through a link: replace each by the file or folder itself, or remove "
                                       f"it")

    def links(self) -> list[Path]:
        """The symbolic links among the directory's entries and those of its checkpoints/ and plugins/
        (a run's own files never are links; client_state/ is checked itself, not its many folders)."""
        found = []
        for folder in (self.path, self.checkpoints, self.path / PLUGINS):
            if folder.is_dir() and not folder.is_symlink():
                found += sorted(p for p in folder.iterdir() if p.is_symlink())
        return found

    def record_files(self) -> list[Path]:
        """The files of the run's record, relative to its directory: everything but the weights
        (model.pt, checkpoints/, client_state/), the lock and temporary files."""
        skip = {self.path / MODEL, self.checkpoints, self.client_state, self.path / LOCK}
        found: list[Path] = []
        for folder, dirs, files in os.walk(self.path):   # os.walk does not enter a linked folder
            here = Path(folder)
            dirs[:] = sorted(d for d in dirs if here / d not in skip)
            found += [(here / f).relative_to(self.path) for f in sorted(files)
                      if here / f not in skip and not _TEMPORARY.match(f) and not (here / f).is_symlink()]
        return found

    def drop_state(self) -> int:
        """Delete the checkpoints and the per-client state (what resuming needs; with many clients,
        gigabytes), keeping the record and the final model; the bytes freed. The caller holds the lock."""
        freed = 0
        for folder in (self.checkpoints, self.client_state):
            for here, _, files in os.walk(folder):
                freed += sum((Path(here) / f).stat().st_size for f in files)
            shutil.rmtree(folder, ignore_errors=True)
        return freed

    def lock(self) -> str | None:
        """Take the run's exclusive lock for the life of this process (or until :meth:`unlock`).

        Raises :class:`RunLocked` naming the holder's host and pid when a live process holds it.
        Returns a warning where the file system does not support locks (the run goes on unlocked).
        Where the lock cannot be taken (a full disk), what taking it made is removed again."""
        key = self._key()
        if key in _held:
            raise RunLocked(f"{self.path} is in use by this process already")
        created = not self.path.exists() or key in _claimed
        self.path.mkdir(parents=True, exist_ok=True)
        fresh = created or all(p.name == LOCK for p in self.path.iterdir())
        try:
            fd = open_lock(self.path / LOCK)
        except OSError:
            if created:   # nothing of the run's started: leave no empty folder behind (a full disk)
                _claimed.discard(key)
                _remove_empty(self.path)
            raise
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise RunLocked(f"{self.path} is in use by another run ({self.lock_holder()}). Wait for it to end, "
                                f"stop it, or choose another run.name") from None
            return (f"[mpifed] warning: cannot lock {self.path / LOCK} ({exc.strerror}): the file system does not "
                    f"support file locks (Lustre needs the 'flock' mount option), so a second run with the same "
                    f"name at the same time would not be refused")
        try:
            _write_holder(fd)
        except OSError:   # a full disk, after the lock file was made
            if fresh:
                _claimed.discard(key)
                self._take_away(created)
            os.close(fd)
            raise
        _held[key] = fd
        _claimed.discard(key)
        if fresh:
            _fresh[key] = created
        return None

    def keep(self) -> None:
        """The run's rounds begin: from now on the directory holds the run's record, kept however the
        run ends (a start that ends before is undone by :meth:`unlock`)."""
        _fresh.pop(self._key(), None)

    def unlock(self) -> bool:
        """Release the lock. A start that ends before the run's rounds begin (a configuration or data
        error, a full disk, a stop signal) is undone: in a directory that held nothing of a run when
        it was locked (new, empty, or cleared by --overwrite), everything this start wrote is removed,
        and the directory too when this start created it. Returns whether a start was undone."""
        key = self._key()
        fd = _held.pop(key, None)
        if fd is None:
            return False
        created = _fresh.pop(key, None)
        if created is not None:
            self._take_away(created)
        os.close(fd)  # closing the descriptor releases the lock
        return created is not None

    def _take_away(self, created: bool) -> None:
        """Remove every entry of the directory, the lock file too, and the directory itself when
        ``created``: best effort (what cannot be removed stays)."""
        try:
            _remove_entries(self.path)
            (self.path / LOCK).unlink(missing_ok=True)
            if created:
                self.path.rmdir()
        except OSError:
            pass

    def check_lock(self) -> str | None:
        """Make sure the lock this process holds is still the directory's: when its ``.lock`` file was
        deleted or replaced (a lock on a deleted file excludes nobody), lock a new one and return a
        warning saying so; raise :class:`LockLost` when another process has taken it meanwhile."""
        fd = _held.get(self._key())
        if fd is None:
            return None
        try:
            here = os.stat(self.path / LOCK, follow_symlinks=False)
        except FileNotFoundError:
            here = None
        held = os.fstat(fd)
        if here is not None and (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino):
            return None
        what = "deleted" if here is None else "replaced"
        try:
            new = open_lock(self.path / LOCK)
        except OSError as exc:
            raise LockLost(f"the lock file {self.path / LOCK} was {what} while this run held it, and cannot be made "
                           f"again ({exc.strerror}): stopping, so that no other process writes this directory with "
                           f"it. Resume the run with --resume {self.path} once nothing else uses it") from None
        try:
            fcntl.lockf(new, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(new)
            raise LockLost(f"the lock file {self.path / LOCK} was {what} while this run held it, and another process "
                           f"({self.lock_holder()}) has locked the new one: this run stops here and writes nothing "
                           f"more, since that process writes the same files. Never delete a run's .lock while it "
                           f"runs") from None
        _write_holder(new)
        _held[self._key()] = new
        os.close(fd)
        return (f"[mpifed] warning: the lock file {self.path / LOCK} was {what} while the run held it; locked a new "
                f"one (never delete a run's .lock while it runs: a second run could then use the same directory)")

    def _key(self) -> Path:
        return self.path.resolve()

    def lock_holder(self) -> str:
        """"host H pid P" of the run's lock holder, from the lock file."""
        try:
            who = json.loads(read_text(self.path / LOCK))
            return f"host {who['host']} pid {who['pid']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "holder unknown"

    def in_progress(self) -> bool:
        """Whether a live process holds the run's lock (this one included)."""
        return self._lock_state() == "held"

    def _lock_state(self) -> str:
        """``held`` by a live process, ``free``, or ``unknown`` (the lock file cannot be read). The
        lock is tested with F_GETLK on a read-only descriptor: nothing is taken, and no write
        permission is needed (teammates, read-only mounts)."""
        if self._key() in _held:
            return "held"
        try:
            fd = os.open(self.path / LOCK, os.O_RDONLY)
        except FileNotFoundError:
            return "free"
        except OSError:
            return "unknown"
        try:
            return "held" if _write_locked(fd) else "free"
        except OSError:
            return "unknown"
        finally:
            os.close(fd)

    def status(self) -> dict[str, Any] | None:
        """status.json as a reader should believe it: a ``running`` run whose lock holder is gone
        (killed, node lost) is reported ``failed``, with the reason. Where the lock cannot be
        tested (its file unreadable to this user), status.json is reported as written. Its state is a
        :class:`RunState`. None where there is no status, or its state is none that mpifed writes."""
        status = self.read_json(STATUS)
        if status is None or not isinstance(status.get("state"), str) or status["state"] not in _WRITTEN:
            return None
        status = {**status, "state": RunState(status["state"])}
        if status["state"] == RunState.RUNNING and self._lock_state() == "free":
            status = {**status, "state": RunState.FAILED, "error": KILLED}
        if status["state"] == RunState.FINISHED:
            problem = self.metrics_problem(status.get("rounds_done"))
            if problem:
                status = {**status, "state": RunState.DAMAGED,
                          "error": f"{problem}; --resume {self.path} writes it again from the run's last checkpoint"}
        return status

    def state(self) -> RunState | None:
        """The run's state, as every reader of runs takes it: :meth:`status`'s (a dead ``running`` run is
        ``failed``, a ``finished`` one with broken metrics ``damaged``), ``diverged`` for a run that failed
        because its loss became NaN or infinite; None without a status.json."""
        found = self.status()
        if found is None:
            return None
        if found["state"] == RunState.FAILED and found.get("diverged", _named_divergence(found)) is True:
            return RunState.DIVERGED
        return found["state"]

    def why_left_out(self, state: RunState | None) -> str:
        """Why a reader leaves out this run, in ``state`` (not finished): what is damaged, or the state."""
        if state == RunState.DAMAGED:
            return (self.status() or {}).get("error", "damaged")
        return f"not finished ({state or 'no status.json'})"

    def metrics_problem(self, rounds_done: Any) -> str | None:
        """What is wrong with metrics.jsonl for a run of ``rounds_done`` rounds (None: nothing, or no
        number of rounds to check against): it must hold one whole line per round, rounds 1 to
        ``rounds_done`` in order. ``rounds_done`` is read from status.json, so it may be anything: it is
        compared with the file's rows, never used to size anything."""
        if rounds_done is None:
            return None
        if type(rounds_done) is not int or rounds_done < 0:
            return (f"{self.path / STATUS} records {json.dumps(rounds_done)[:40]} finished rounds, which is "
                    f"not a number of rounds (the file was edited)")
        try:
            lines = read_text(self.path / METRICS).splitlines()
        except FileNotFoundError:
            return f"{self.path / METRICS} is missing"
        except (OSError, UnicodeDecodeError) as exc:
            return f"{self.path / METRICS} cannot be read ({getattr(exc, 'strerror', None) or exc})"
        rounds = [_round_of(line) for line in lines]
        if len(rounds) == rounds_done and rounds == list(range(1, len(rounds) + 1)):
            return None
        torn = sum(r is None for r in rounds)
        held = f"{torn} damaged line(s) and " if torn else ""
        return (f"{self.path / METRICS} holds {held}{_rows_text(rounds)} where status.json records "
                f"{rounds_done} finished rounds (one of the two was cut short or edited)")

    def remove_temporary(self) -> list[Path]:
        """Delete temporary files a crashed writer left behind (in the run directory, checkpoints/ and
        client_state/); returns them."""
        found = [p for folder in (self.path, self.checkpoints, self.client_state, *self.client_state.glob("*"))
                 if folder.is_dir() for p in folder.iterdir() if p.is_file() and _TEMPORARY.match(p.name)]
        for p in found:
            p.unlink(missing_ok=True)
        return found

    def clear(self) -> None:
        """Delete everything in the directory but its lock (for --overwrite, with the lock held): what it
        holds from then on is this start's (see :meth:`unlock`)."""
        _remove_entries(self.path)
        if self._key() in _held:
            _fresh.setdefault(self._key(), False)

    def log(self, message: str, console: bool = True) -> None:
        """``message`` in log.txt, with the time, and (``console``) on rank 0's output."""
        stamp = time.strftime("%H:%M:%S")
        if console:
            self.console(message)
        if self._log is not None:
            with _naming(self.path / LOG):
                self._log.write(f"{stamp} {message}\n")

    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write(self.path / CONFIG, yaml.safe_dump(config, sort_keys=False))

    def read_config(self) -> dict[str, Any]:
        source = str(self.path / CONFIG)
        return safe_yaml.load(safe_yaml.decode(read_bytes(self.path / CONFIG), source), source)

    def append_row(self, name: str, row: dict[str, Any]) -> None:
        """Append one complete line to a .jsonl log (one write, then flushed to disk)."""
        with _naming(self.path / name), open_append(self.path / name) as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_rows(self, name: str, rows: list[dict[str, Any]]) -> None:
        """Replace a .jsonl log (atomically) with ``rows``."""
        atomic_write(self.path / name, "".join(json.dumps(r) + "\n" for r in rows))

    def keep_rounds(self, name: str, rounds_done: int) -> None:
        """Rewrite a .jsonl log (atomically) without the lines of rounds after ``rounds_done``."""
        path = self.path / name
        lines = read_text(path).splitlines() if path.exists() else []
        kept = [line for line in lines if (r := _round_of(line)) is not None and r <= rounds_done]
        atomic_write(path, "".join(line + "\n" for line in kept))

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        atomic_write(self.path / name, json.dumps(data, indent=1) + "\n")

    def read_json(self, name: str) -> dict[str, Any] | None:
        try:
            data = json.loads(read_text(self.path / name))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def mark_failed(self, error: str, checkpoint: Path | None, diverged: bool = False) -> None:
        """Record in status.json (and log.txt) that the run failed, with the reason, whether it diverged
        (its loss became NaN or infinite) and the checkpoint to resume from. Best effort: a failure to
        write (a full disk) is reported, never raised."""
        if not self.path.is_dir():
            return
        try:
            with open_append(self.path / LOG) as log:
                log.write(f"{time.strftime('%H:%M:%S')} [mpifed] failed: {error}\n")
            self.write_json(STATUS, {"state": RunState.FAILED, "error": error, "diverged": diverged,
                                            "checkpoint": str(checkpoint) if checkpoint else None})
        except OSError as exc:
            sys.stderr.write(f"[mpifed] could not record the failure in {self.path}/status.json ({exc.strerror}); "
                             f"readers treat the run as failed once its processes have ended\n")

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """An OSError without a file name (a write's: a full disk) gets ``path``, for the message."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def _remove_entries(folder: Path) -> None:
    """Delete every entry of ``folder`` but its lock file, never following a link."""
    for p in folder.iterdir():
        if p.name == LOCK:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _write_holder(fd: int) -> None:
    """Write who holds the lock (host, pid, since) into the lock file ``fd``."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}).encode(), 0)


def _write_locked(fd: int) -> bool:
    """Whether some process holds a write lock on ``fd``'s file, asked with F_GETLK (which takes no
    lock and needs only read access)."""
    if sys.platform == "darwin":   # struct flock {off_t start, len; pid_t pid; short type, whence}
        layout, query, kind = "=qqihh", (0, 0, 0, fcntl.F_RDLCK, os.SEEK_SET), 3
    else:                          # 64-bit Linux: {short type, whence; off_t start, len; pid_t pid}
        layout, query, kind = "=hh4xqqi4x", (fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0), 0
    answer = struct.unpack(layout, fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(layout, *query)))
    return answer[kind] != fcntl.F_UNLCK


def _rows_text(rounds: list[int | None]) -> str:
    """``rows of rounds 1-7`` for the whole lines' rounds of a .jsonl log."""
    whole = [r for r in rounds if r is not None]
    if not whole:
        return "no whole row"
    in_order = all(b == a + 1 for a, b in zip(whole, whole[1:]))
    return f"rows of rounds {whole[0]}-{whole[-1]}" if in_order else \
        f"rows of rounds {', '.join(map(str, whole[:12]))}{', ...' if len(whole) > 12 else ''}"


def _round_of(line: str) -> int | None:
    """The round of a .jsonl line; None for a blank line, one cut short by a crash mid-append, or one
    whose round is not a whole number."""
    try:
        row = json.loads(line)
    except ValueError:      # JSONDecodeError, or an integer of more digits than Python converts
        return None
    found = row.get("round", 0) if isinstance(row, dict) else None
    return found if type(found) is int else None
