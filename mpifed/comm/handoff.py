"""What the launcher (:mod:`mpifed.entry.launch`) and the ranks it starts tell each other.

Through the environment of the ranks:

    MPIFED_PROGRESS=1|0   show rank 0's live progress bar or not: whether the launcher's own
                          output is a terminal (a rank cannot tell: Open MPI gives every rank a
                          pseudo-terminal); a user may set it too
    MPIFED_RESUME_WITH    how this job was started, e.g. ``launch/local.sh 3``: the start of
                          the resume command rank 0 prints
    MPIFED_HANDOFF=DIR    a folder of the launcher's own, where it writes ``stop`` (why it asked
                          the ranks to stop: Ctrl-C, a signal sent to it) before it passes the stop
                          on as SIGUSR1, and rank 0 writes ``exit``, its exit code, when that code
                          is a clean outcome (a stop with a checkpoint, a configuration error).
                          The ranks then exit 0, so that mpirun does not report a crash, and the
                          launcher exits with the code rank 0 wrote. Rank 0 also keeps ``resume``
                          there up to date: where the run can continue from (its last checkpoint and
                          the command), which the launcher prints last when the job fails (mpirun
                          can kill rank 0 before rank 0 has said it).
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

PROGRESS = "MPIFED_PROGRESS"
RESUME_WITH = "MPIFED_RESUME_WITH"
HANDOFF = "MPIFED_HANDOFF"
STOP_FILE = "stop"
EXIT_FILE = "exit"
RESUME_FILE = "resume"
EXIT_STOPPED = 75  # stopped on a signal after writing a checkpoint: resume with --resume
EXIT_USAGE = 2     # a configuration, data or usage problem, said in one message
CLEAN_EXITS = (EXIT_STOPPED, EXIT_USAGE)

_MPI_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK")
_SIGNALS = {"SIGINT": "Ctrl-C (SIGINT)", "SIGUSR1": "SIGUSR1 (a scheduler's warning, or kill -USR1)",
            "SIGTERM": "SIGTERM (preemption, or mpirun ending the job after a rank failed)",
            "SIGHUP": "SIGHUP (the terminal closed)"}


def launched_by_mpi() -> bool:
    """Whether an MPI launcher (mpirun, mpiexec, srun) started this process."""
    return any(k in os.environ for k in _MPI_VARIABLES)


def progress_bar_wanted() -> bool:
    """Rank 0's live bar: as the launcher (or the user) says in MPIFED_PROGRESS; else only in the
    debug mode with stdout and stderr on a terminal (under a bare mpirun, never: every rank's
    output looks like a terminal there, a log file's too)."""
    said = os.environ.get(PROGRESS)
    if said in ("0", "1"):
        return said == "1"
    return not launched_by_mpi() and is_terminal(sys.stdout) and is_terminal(sys.stderr)


def is_terminal(stream: object) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def describe_signal(name: str) -> str:
    """Why a stop signal came: the launcher's note for its SIGUSR1, else what the signal usually means."""
    folder = os.environ.get(HANDOFF)
    if name == "SIGUSR1" and folder:
        note = _read(Path(folder) / STOP_FILE)
        if note:
            return note
    return _SIGNALS.get(name, name)


def write_stop_reason(folder: Path, reason: str) -> None:
    """The launcher's side: why it asks for a stop (read by rank 0 when the SIGUSR1 arrives)."""
    _write(folder / STOP_FILE, reason)


def hand_back(code: int, rank: int) -> int:
    """The exit code a rank returns: under the launcher, a clean outcome is written for the launcher
    (by rank 0) and every rank exits 0; otherwise ``code`` itself."""
    folder = os.environ.get(HANDOFF)
    if not folder or code not in CLEAN_EXITS:
        return code
    if rank == 0:
        try:
            _write(Path(folder) / EXIT_FILE, str(code))
        except OSError:
            return code
    return 0


def handed_back(folder: Path) -> int | None:
    """The launcher's side: the exit code rank 0 wrote, or None."""
    try:
        return int((folder / EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None


def note_resume_point(text: str) -> None:
    """Rank 0's side, under the launcher: where the run can continue from now (written at the start
    and after every checkpoint)."""
    folder = os.environ.get(HANDOFF)
    if folder:
        try:
            _write(Path(folder) / RESUME_FILE, text)
        except OSError:
            pass


def resume_point(folder: Path) -> str | None:
    """The launcher's side: rank 0's last note of where the run can continue from, or None."""
    return _read(folder / RESUME_FILE)


def python_command() -> str:
    """This interpreter as a user would type it: ``python3`` or ``python`` when that name on PATH
    is this interpreter, else its full path."""
    for name in ("python", "python3"):
        found = shutil.which(name)
        if found and os.path.realpath(found) == os.path.realpath(sys.executable):
            return name
    return sys.executable


def start_command(ranks: int) -> str:
    """How to start mpifed again the way this process was started: the launcher's words, else
    mpirun or srun with this rank count, else the debug mode."""
    given = os.environ.get(RESUME_WITH)
    if given:
        return given
    main = f"{python_command()} -m mpifed.main"
    if Path(sys.argv[0]).name == "mpifed":
        main = "mpifed run"
    if launched_by_mpi():
        by_srun = os.environ.get("SLURM_STEP_ID") is not None and "OMPI_COMM_WORLD_SIZE" not in os.environ
        runner = "srun" if by_srun else "mpirun"
        return f"{runner} -n {ranks} {main}"
    return main


def resume_command(run_path: Path | str, ranks: int, code: tuple[str, ...] = ()) -> str:
    """The exact command that continues the run in ``run_path``; ``code``: the words that give it its
    code from outside mpifed again (``--plugin FILE``, ``--trust-run-code``)."""
    return f"{start_command(ranks)} {shlex.join([*code, '--resume', str(run_path)])}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
