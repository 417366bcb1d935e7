"""A CUDA MPS control daemon for a job whose ranks share GPUs (``resources.mps``).

Processes on one GPU normally take turns on it; under NVIDIA's Multi-Process Service their
kernels run side by side, which is what several small workers per GPU need (FedNTD's CIFAR-10
setting, 10 workers on one H100: 2.7x faster rounds). The launcher (``mpifed launch``,
``launch/local.sh``) and the sbatch scripts of ``slurm/`` call :func:`for_job` before the ranks
start and :meth:`Daemon.stop` when the job ends, however it ends (normally, Ctrl-C, a failure):

* ``auto`` (default): a daemon when two or more ranks share a GPU and
  ``nvidia-cuda-mps-control`` is installed; ``on``: whenever ranks use a GPU (an error without
  the program or a GPU); ``off``: never.
* A daemon already running (one the cluster manages, reached through the environment's
  ``CUDA_MPS_PIPE_DIRECTORY`` or the default pipe folder) is used, neither replaced nor stopped.
* Otherwise the job starts its own, with its pipe and log folders in a new temporary folder
  (``$TMPDIR/mpifed-mps-*``; a pipe must be on a local disk), passes
  ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` to the ranks, asks it for a server
  at once, and quits it and removes the folder at the end.
* A GPU that refuses MPS (a compute mode that forbids it, no permission) starts no server: the
  job says so, with the daemon's log, stops the daemon and runs without MPS.

For shell scripts::

    eval "$(python -m mpifed.mps start -n N [mpifed arguments])"   # exports the folders and MPIFED_MPS_DIR
    python -m mpifed.mps stop "$MPIFED_MPS_DIR"
    srun --overlap --ntasks-per-node=1 python -m mpifed.mps node --folder DIR --tasks-per-node SPEC [...]

A job on several nodes needs a daemon on each: ``slurm/common.sh``'s ``mpifed_mps_start`` runs
``python -m mpifed.mps node`` as one task per node (``srun --overlap``), each deciding for the ranks
of its own node and keeping its daemon, in the same node-local folder on every node, until the
job's script ends that step (:func:`serve_node`).
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import yaml

from mpifed.files import safe_yaml
from mpifed.settings.config import ConfigError, ResourcesConfig, load_resources
from mpifed.run.rundir import CONFIG

CONTROL = "nvidia-cuda-mps-control"
SERVER_WAIT_S = 10.0     # how long a new daemon may take to list its server


class MpsError(RuntimeError):
    """``resources.mps: on`` cannot be honoured."""


@dataclass
class Daemon:
    """The job's MPS daemon: the variables the ranks need, and what :meth:`stop` ends (nothing when
    the job uses no daemon or one it did not start)."""

    env: dict[str, str] = field(default_factory=dict)
    folder: Path | None = None
    control: str | None = None

    def stop(self, say: Callable[[str], None]) -> None:
        """Quit the daemon this job started and remove its folder (idempotent)."""
        if self.folder is None or self.control is None:
            return
        folder, self.folder = self.folder, None
        out = _ask(self.control, "quit", {**os.environ, **self.env})
        if out is None:
            say(f"MPS: the control daemon did not answer 'quit'; end it with "
                f"`echo quit | CUDA_MPS_PIPE_DIRECTORY={self.env['CUDA_MPS_PIPE_DIRECTORY']} {CONTROL}`")
            return
        shutil.rmtree(folder, ignore_errors=True)
        say("MPS: control daemon stopped")


def _ask(control: str, command: str, env: Mapping[str, str]) -> str | None:
    """Send one command to the control daemon; its output, or None when no daemon answered."""
    try:
        p = subprocess.run([control], input=command + "\n", capture_output=True, text=True, env=dict(env), timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def visible_gpus(environ: Mapping[str, str]) -> int:
    """How many GPUs the ranks will see: ``CUDA_VISIBLE_DEVICES``'s entries when it is set (up to
    the first invalid one, as CUDA reads it), else ``nvidia-smi -L``'s (0 without nvidia-smi)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for entry in visible.split(","):
            if not entry.strip() or entry.strip().startswith("-"):
                break
            count += 1
        return count
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def gpu_ranks(ranks: int, resources: ResourcesConfig, gpus: int, server: bool | None = None) -> int:
    """How many of ``ranks`` processes use a GPU (with ``gpus`` visible): the whole job's (``server``
    None; a job of one process is the debug mode), or one node's of a job on several, the server
    among them when ``server``."""
    if gpus == 0:
        return 0
    if server is not None:
        return (ranks - server) * (resources.device != "cpu") + (server and resources.server_device == "cuda")
    if ranks == 1:
        return int(resources.device != "cpu" or resources.server_device == "cuda")
    return (ranks - 1) * (resources.device != "cpu") + (resources.server_device == "cuda")


def decide(setting: str, ranks: int, gpus: int, resources: ResourcesConfig, control: str | None,
           server: bool | None = None) -> tuple[bool, str]:
    """Whether the job (or, with ``server`` given, a node of it) wants a daemon, and why (for the log;
    empty when there is nothing to say). Raises :class:`MpsError` when ``on`` cannot be honoured (on
    a node: no GPU visible there, or no control program; a node with GPUs that its ranks do not use,
    the server's on the CPU, simply gets none)."""
    users = gpu_ranks(ranks, resources, gpus, server)
    share = f"{users} ranks share {gpus} GPU{'s' if gpus != 1 else ''}"
    if setting == "off":
        return False, ""
    if setting == "on":
        if users == 0 and server is not None and gpus > 0:
            return False, f"no rank of this node uses its GPU{'s' if gpus != 1 else ''} (resources.mps=on)"
        if users == 0:
            raise MpsError(f"resources.mps=on, but no rank uses a GPU ({gpus} visible; resources.device="
                           f"{resources.device}, server_device={resources.server_device}). Use auto or off")
        if control is None:
            raise MpsError(f"resources.mps=on, but {CONTROL} is not on PATH (it comes with the NVIDIA driver). "
                           f"Use auto or off")
        return True, (f"{users} rank{'s' if users != 1 else ''} on {gpus} GPU{'s' if gpus != 1 else ''} "
                      f"(resources.mps=on)")
    if users <= gpus:
        return False, ""
    if control is None:
        return False, f"{share}, but {CONTROL} is not installed: they take turns on the GPU"
    return True, share


def start(control: str, environ: Mapping[str, str], say: Callable[[str], None], why: str,
          folder: Path | None = None) -> Daemon:
    """Use the daemon already running, or start the job's own (in ``folder``, else a new temporary
    folder); a daemon that gets no server is stopped again (the job then runs without MPS)."""
    if _ask(control, "get_server_list", environ) is not None:
        pipe = environ.get("CUDA_MPS_PIPE_DIRECTORY", "the default pipe folder")
        say(f"MPS: {why}: using the control daemon already running ({pipe})")
        return Daemon()
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="mpifed-mps-", dir=environ.get("TMPDIR") or None))
    elif folder.exists():        # left by an earlier start of the same job on this node: end its daemon
        Daemon(_folder_env(folder), folder, control).stop(lambda _: None)
        shutil.rmtree(folder, ignore_errors=True)
    env = _folder_env(folder)
    for sub in ("pipe", "log"):
        (folder / sub).mkdir(parents=True)
    full = {**environ, **env}
    daemon = Daemon(env, folder, control)
    try:
        p = subprocess.run([control, "-d"], capture_output=True, text=True, env=full, timeout=60)
        failed = p.returncode != 0 and (p.stderr.strip() or p.stdout.strip() or f"exit code {p.returncode}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        failed = str(exc)
    if failed:
        shutil.rmtree(folder, ignore_errors=True)
        say(f"MPS: {why}, but {CONTROL} -d failed ({failed}); running without MPS")
        return Daemon()
    if not _server_started(control, full):
        log = _tail(folder / "log" / "control.log")
        daemon.stop(lambda _: None)
        say(f"MPS: {why}, but the GPU refused an MPS server (a compute mode that forbids MPS, or no "
            f"permission); running without MPS. The daemon's log:\n{log}")
        return Daemon()
    say(f"MPS: {why}: started a control daemon for this job (pipe and log folders in {folder})")
    return daemon


def _folder_env(folder: Path) -> dict[str, str]:
    return {"CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(folder / "log")}


def _server_started(control: str, env: Mapping[str, str]) -> bool:
    _ask(control, f"start_server -uid {os.getuid()}", env)
    deadline = time.monotonic() + SERVER_WAIT_S
    while True:
        listed = _ask(control, "get_server_list", env)
        if listed and listed.strip():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def _tail(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) or "(empty)"
    except OSError:
        return f"(no {path.name})"


def job_resources(mpifed_args: list[str]) -> ResourcesConfig:
    """The ``resources`` section that mpifed.main will read from these arguments (``--config``,
    ``--set``, ``--resume RUN_DIR``), without importing torch. Raises ConfigError."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--config", action="append", default=[])
    p.add_argument("--set", action="append", nargs="+", default=[])
    p.add_argument("--resume", nargs="?", const="", default=None)
    args, _ = p.parse_known_args(mpifed_args)
    base = None
    if args.resume:
        saved = Path(args.resume) / CONFIG
        try:
            base = safe_yaml.read(saved) if saved.is_file() else None
        except (OSError, yaml.YAMLError):
            base = None
    return load_resources(args.config, [o for group in args.set for o in group],
                          base if isinstance(base, dict) else None)


def for_job(ranks: int, mpifed_args: list[str], environ: Mapping[str, str], say: Callable[[str], None],
            server: bool | None = None, folder: Path | None = None) -> Daemon:
    """The daemon under ``resources.mps`` for the job's ``ranks`` processes (or, with ``server`` given,
    one node's, the server among them when True): a :class:`Daemon` that does nothing when none is
    wanted; a daemon of its own in ``folder`` when given. A config mpifed cannot read is left for mpifed.main to report.
    Raises :class:`MpsError`."""
    wanted, why, control = _planned(ranks, mpifed_args, environ, server)
    if not wanted:
        if why:
            say(f"MPS: {why}")
        return Daemon()
    return start(control, environ, say, why, folder)


def plan(ranks: int, mpifed_args: list[str], environ: Mapping[str, str]) -> str:
    """What :func:`for_job` would do, in words, starting nothing (for ``--dry-run``). Raises :class:`MpsError`."""
    wanted, why, _ = _planned(ranks, mpifed_args, environ)
    if wanted:
        return f"MPS: would start a control daemon for the job ({why})"
    return f"MPS: {why or 'no daemon (resources.mps is off)'}"


def _planned(ranks: int, mpifed_args: list[str], environ: Mapping[str, str],
             server: bool | None = None) -> tuple[bool, str, str | None]:
    try:
        resources = job_resources(mpifed_args)
    except ConfigError:
        return False, "", None
    if resources.mps == "off":
        return False, "", None
    control = shutil.which(CONTROL, path=environ.get("PATH"))
    wanted, why = decide(resources.mps, ranks, visible_gpus(environ), resources, control, server)
    return wanted, why, control


def tasks_on_node(spec: str, node: int) -> int:
    """The tasks on node ``node`` (from 0) of a job whose ``SLURM_TASKS_PER_NODE`` is ``spec``
    (``5``, ``5(x3),4``). Raises ValueError for a malformed spec or a node outside it."""
    nodes: list[int] = []
    for part in spec.split(","):
        count, _, repeat = part.strip().partition("(x")
        if not count.isdigit() or (repeat and not (repeat.endswith(")") and repeat[:-1].isdigit())):
            raise ValueError(f"SLURM_TASKS_PER_NODE={spec!r} is not a list like 5(x3),4")
        nodes += [int(count)] * (int(repeat[:-1]) if repeat else 1)
    if not 0 <= node < len(nodes):
        raise ValueError(f"node {node} is not among the {len(nodes)} nodes of SLURM_TASKS_PER_NODE={spec!r}")
    return nodes[node]


def serve_node(folder: Path, spec: str, mpifed_args: list[str], environ: Mapping[str, str],
               say: Callable[[str], None], report: Callable[[str], None]) -> int:
    """One node's daemon for a job on several nodes (one task per node through srun; ``SLURM_NODEID``
    says which node, and node 0 holds the server): started in ``folder`` when the node's ranks share
    a GPU, reported in one line (``mpifed-mps HOST started|none|error STEP``, the Slurm step's id), kept
    until SIGTERM, SIGINT or SIGHUP (``scancel --signal=TERM JOB.STEP``: srun itself, signalled, would
    kill the step's tasks at once), then quit and its folder removed. The exit code: 0, or 2 when
    this node could not decide or start (``resources.mps=on`` it cannot honour, a bad spec, ...)."""
    host, step = socket.gethostname(), environ.get("SLURM_STEP_ID", "")
    ending: list[int] = []

    def end(signum: int, _frame: object) -> None:
        ending.append(signum)

    # handlers, not a blocked mask or SIG_IGN, which the daemon would inherit and keep
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, end)
    signal.signal(signal.SIGUSR1, lambda *_: None)     # the job's warning signal is for the ranks
    try:
        node = int(environ.get("SLURM_NODEID", "0"))
        ranks = tasks_on_node(spec, node)
        daemon = for_job(ranks, mpifed_args, environ, lambda text: say(f"{host}: {text}"), node == 0, folder)
    except Exception as exc:      # every failure must reach the job's script, which waits for each node's line
        say(f"{host}: {exc}")
        report(f"{host} error {step}".rstrip())
        return 2
    if daemon.folder is None:
        report(f"{host} none {step}".rstrip())
        return 0
    report(f"{host} started {step}".rstrip())
    while not ending:
        time.sleep(0.2)
    daemon.stop(lambda text: say(f"{host}: {text}"))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``start -n N [mpifed arguments]``: print shell ``export`` lines for the job's daemon (none when
    it has none); ``stop DIR``: quit the daemon started in DIR and remove DIR; ``node --folder DIR
    --tasks-per-node SPEC [mpifed arguments]``: :func:`serve_node`."""
    argv = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m mpifed.mps start -n N [mpifed arguments] | stop DIR | "
             "node --folder DIR --tasks-per-node SPEC [mpifed arguments]")

    def say(text: str) -> None:
        print(f"[mpifed.mps] {text}", file=sys.stderr, flush=True)

    if argv[:1] in (["-h"], ["--help"]) or argv[1:2] in (["-h"], ["--help"]):
        print(f"{usage}\n\n{__doc__}")
        return 0
    if len(argv) == 2 and argv[0] == "stop":
        folder = Path(argv[1])
        Daemon(_folder_env(folder), folder, shutil.which(CONTROL)).stop(say)
        return 0
    if len(argv) >= 5 and argv[0] == "node" and argv[1] == "--folder" and argv[3] == "--tasks-per-node":
        def report(line: str) -> None:
            print(f"mpifed-mps {line}", flush=True)

        return serve_node(Path(argv[2]), argv[4], argv[5:], os.environ, say, report)
    if len(argv) >= 3 and argv[0] == "start" and argv[1] == "-n" and argv[2].isdigit():
        try:
            daemon = for_job(int(argv[2]), argv[3:], os.environ, say)
        except MpsError as exc:
            say(str(exc))
            return 2
        exports = {**daemon.env, **({"MPIFED_MPS_DIR": str(daemon.folder)} if daemon.folder else {})}
        for name, value in exports.items():
            print(f"export {name}={shlex.quote(value)}")
        return 0
    say(usage)
    return 2


if __name__ == "__main__":
    sys.exit(main())
