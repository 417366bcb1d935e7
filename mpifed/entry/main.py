"""Entry point: ``mpirun -n N python -m mpifed.main [--config X.yaml] [--set key=value ...]``.

Without an MPI launcher (or with one rank) it is the single-node debug mode: the server
and all clients in one process, the same round code, the same results.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

# Only light modules at import time: signals.listening() must block the stop signals before
# numpy or torch start their thread pools (a thread created earlier could receive SIGTERM and die).
from mpifed import __version__
from mpifed.settings import config, plugins
from mpifed.comm import handoff
from mpifed.files import pipes
from mpifed.round import signals
from mpifed.run.rundir import RunDir, check_run_name, claim_new, default_run_name, release_locks, undo_starts

if TYPE_CHECKING:
    from mpifed.comm.collectives import Comm
    from mpifed.round.startup import Resolved


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mpifed.main", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", default=[], metavar="YAML",
                   help="config file (repeatable; later files override earlier ones); default: the quick start")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="override config keys, e.g. --set train.rounds=5 data.partition.beta=0.1")
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="RUN_DIR",
                   help="continue the run in RUN_DIR (or in run.root/run.name) from its latest checkpoint; "
                        "starts it if it has none")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                   help="load a Python file or module first, e.g. one that registers a method of your own "
                        "(@ALGORITHMS.register); repeatable. A run records its plugins: --resume needs none")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory of the same name")
    p.add_argument(plugins.TRUST_FLAG, action="store_true",
                   help="with --resume: run the code from outside mpifed that the run records (its plugins, from "
                        "where they came or the run's copy) without it being given by --plugin, a config's plugins: "
                        "or an installed package (only for a run folder from someone you trust)")
    p.add_argument(plugins.CHANGED_FLAG, action="store_true",
                   help="with --resume: continue the run although its plugins' code changed since it started (the "
                        "fix after the method failed); the run's provenance records the code before and after")
    p.add_argument("--trust-checkpoint", action="store_true",
                   help="with --resume: load a checkpoint that holds Python objects beyond tensors and plain values "
                        "(unpickling them runs code from the file: only for a checkpoint from someone you trust)")
    p.add_argument("--show-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config, the run directory, the prepared "
                   "data and what would run, and exit; writes nothing")
    p.add_argument("--verbose", action="store_true", help="print a line per rank at the start (where it runs, its "
                   "pid, device and threads), as log.txt always has them")
    p.add_argument("--config-reference", action="store_true", help="print every config key with its default and exit")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run mpifed with command-line arguments ``argv``; returns the exit code. Re-entrant: a
    process may call it several times (the tests do, in the debug mode)."""
    args = parse_args(argv)
    if args.config_reference:
        try:
            for spec in args.plugin:
                plugins.load(spec)
            plugins.load_installed()
        except plugins.PluginError as exc:
            sys.stderr.write(f"[mpifed] {exc}\n")
            return 2
        print(config.reference())
        return 0
    # OpenMP threads waiting for work spin by default; with other processes on the cores (ranks
    # sharing a node, a busy machine) the spinning starves the threads that compute (a round
    # took 10 to 25 times longer). Passive waiting costs little on an idle machine.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with signals.listening(), pipes.survive_closed_output():
        from mpifed.comm.collectives import Comm, MpiComm, world
        from mpifed.round.startup import StartFailed, StartStopped
        mpi_world, _, size = world()
        comm: Comm = MpiComm(mpi_world) if size > 1 else Comm()
        errors = user_errors()
        try:
            return handoff.hand_back(_run(args, comm, mpi_world, errors), comm.rank)
        except StartFailed:
            return handoff.hand_back(2, comm.rank)
        except StartStopped:
            return handoff.hand_back(handoff.EXIT_STOPPED, comm.rank)
        except errors as exc:
            return handoff.hand_back(_refused(comm, str(exc)), comm.rank)
        except BaseException as exc:
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                return handoff.hand_back(_refused(comm, _disk_full(exc, undo_starts())), comm.rank)
            return _crashed(comm)
        finally:
            release_locks()


def _run(args: argparse.Namespace, comm: Comm, mpi_world: Any, errors: tuple[type[Exception], ...]) -> int:
    """Start up (:mod:`mpifed.round.startup`), then walk the rounds; returns the exit code."""
    from mpifed.round.startup import Startup
    startup = Startup(comm, mpi_world, errors)
    resolved = startup.resolve(lambda: resolve(args))
    if args.show_config or args.dry_run or resolved.nothing_to_do:
        if comm.rank == 0:
            shown = yaml.safe_dump(resolved.config, sort_keys=False) if args.show_config or args.dry_run else ""
            if args.dry_run:
                shown += dry_run(args, resolved, comm.size)
            print(shown or resolved.nothing_to_do, flush=True)
        return 0
    return startup.start(resolved, handoff.resume_command(resolved.run_path, comm.size, resolved.code_words),
                         args.verbose).walk()


def resolve(args: argparse.Namespace) -> Resolved:
    """Rank 0: the validated config, the run directory (locked) and how the run starts. The code
    comes first: the ``--plugin``s, then (for ``--resume``) the plugins the run recorded, then
    those its config files name."""
    from mpifed.run import resume
    from mpifed.round.startup import Resolved, check_extras
    overrides = [o for group in args.set for o in group]
    config.load_plugins(args.config, overrides, args.plugin)
    saved = None
    if args.resume:
        saved = resume.saved_config(RunDir(Path(args.resume)))
        resume.restore_code(RunDir(Path(args.resume)), args.trust_run_code, args.trust_changed_code)
    cfg, d = config.load(args.config, overrides, base=saved, plugins=args.plugin)
    run_path = _run_path(args, cfg, d)
    if d["run"].get("group") is None:
        d["run"]["group"] = (Path(args.config[-1]).stem if args.config
                             else run_path.resolve().parent.name if args.resume else "quickstart")
    cfg = config.build(d)
    check_extras(cfg)
    how = tuple(p.how_to_load() for p in plugins.loaded() if p.kind != "entry point")
    if args.show_config or args.dry_run:
        return Resolved(d, run_path, plugins=how)
    run = RunDir(run_path)
    new = not run.holds_run()
    try:
        resume.take_lock(run)
    except resume.Unwritable:   # a finished run on a read-only mount: resuming it has nothing to do
        done = args.resume is not None and resume.finished_as_asked(run, cfg)
        decision = resume.decide(run, cfg, d, saved, trusted=args.trust_checkpoint) if done else None
        if decision is None or not decision.nothing_to_do:
            raise
        return Resolved(d, run_path, resuming=True, nothing_to_do=decision.nothing_to_do, plugins=how)
    if args.resume is None:
        resume.make_room(run, args.overwrite)
        return Resolved(d, run_path, new=new, plugins=how, code_words=code_words(cfg))
    if not args.resume:   # run.root/run.name: its code is checked against its record now that its place is known
        resume.restore_code(run, args.trust_run_code, args.trust_changed_code)
    decision = resume.decide(run, cfg, d, saved, trusted=args.trust_checkpoint, changed_code=args.trust_changed_code)
    return Resolved(d, run_path, decision.resume_from, resuming=True, nothing_to_do=decision.nothing_to_do, new=new,
                    plugins=how, trust_checkpoint=args.trust_checkpoint, code_words=code_words(cfg),
                    code_changed=decision.code_changed)


def code_words(cfg: config.Config) -> tuple[str, ...]:
    """The words that let a resume of this run load its plugins as this start did: ``--plugin`` with
    each file or module the user gave, ``--trust-run-code`` where the code came from the run's record
    (installed packages need none)."""
    used = {sha for sha in config.to_dict(cfg.code).values() if sha}
    words: list[str] = []
    for p in plugins.loaded():
        if p.sha256 not in used or p.kind == "entry point":
            continue
        given = [plugins.TRUST_FLAG] if p.from_run else ["--plugin", p.origin]
        if given[-1] not in words:
            words += given
    return tuple(words)


def _run_path(args: argparse.Namespace, cfg: config.Config, d: dict[str, Any]) -> Path:
    """The run directory: the one ``--resume`` names, run.root/run.name, or a new one named after the
    config file (claimed now, unless only showing the config); written into ``d``'s run section."""
    from mpifed.run.resume import RunError, unwritable_root
    if args.resume:
        path = Path(args.resume)
        d["run"]["name"], d["run"]["root"] = path.name, str(path.parent)
        return path
    if args.resume == "" and cfg.run.name is None:
        raise RunError("--resume without a run directory continues run.root/run.name, but run.name is not set: "
                       "give the directory (--resume runs/<name>) or the name (--set run.name=<name>)")
    if cfg.run.name is not None:
        try:
            check_run_name(cfg.run.name)
        except ValueError as exc:
            raise RunError(str(exc)) from None
        path = Path(cfg.run.root) / cfg.run.name
    else:
        stem = Path(args.config[-1]).stem if args.config else "quickstart"
        path = Path(cfg.run.root) / default_run_name(stem)
        if not (args.show_config or args.dry_run):
            try:
                path = claim_new(path.parent, path.name)
            except OSError as exc:
                raise RunError(unwritable_root(path, exc)) from None
    d["run"]["name"] = path.name
    return path


def dry_run(args: argparse.Namespace, resolved: Resolved, size: int) -> str:
    """What the run would do, read without writing anything: its directory, its data, its work."""
    from mpifed.run import checkpoint
    from mpifed.preparation.spec import prepared_dir, raw_data_missing
    from mpifed.run.progress import count
    cfg = config.build(resolved.config)
    run = RunDir(resolved.run_path)
    state = run.state() if run.holds_run() else None
    latest = checkpoint.latest(run.checkpoints) if state else None
    if state is None:
        where = "new"
    elif args.resume is not None:
        where = (f"holds a {state} run: --resume continues it from {latest}" if latest else
                 f"holds a {state} run without a checkpoint: --resume starts it again")
    elif args.overwrite:
        where = f"holds a {state} run: --overwrite would replace it"
    else:
        where = f"holds a {state} run: the run would refuse to start (continue it with --resume, or --overwrite)"
    data = prepared_dir(cfg)
    if (data / "manifest.json").exists():
        prepared = "prepared"
    else:
        missing = raw_data_missing(cfg)
        prepared = (f"not prepared yet, and its raw data is missing: expects {missing}" if missing else
                    "not prepared yet: the run prepares it first")
    mode = f"{size} ranks (1 server + {size - 1} workers)" if size > 1 else "one process (debug mode)"
    local = (count(cfg.train.local_steps, "local step") if cfg.train.local_steps else
             count(cfg.train.local_epochs, "local epoch"))
    trackers = [name for name, on in (("TensorBoard", cfg.run.tensorboard), ("MLflow", cfg.run.mlflow),
                                      ("W&B", cfg.run.wandb)) if on]
    return "\n".join([
        "# dry run: nothing was written",
        f"# run directory: {resolved.run_path} ({where})",
        f"# data: {data} ({prepared})",
        f"# would run: {cfg.algorithm.name} on {cfg.data.dataset.name}, {count(cfg.data.num_clients, 'client')} "
        f"({cfg.train.participation:.0%} of them each round), {count(cfg.train.rounds, 'round')} of "
        f"{local}, seed {cfg.run.seed}; {mode}"
        + (f"; tracked in {', '.join(trackers)}" if trackers else "")])


def user_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's to fix: reported as one message, without a traceback."""
    from mpifed.run import checkpoint
    from mpifed.algorithms.base import NonFiniteLoss, ProtocolError
    from mpifed.round.client_state import ClientStateError
    from mpifed.data.partitions import PartitionError
    from mpifed.data.prepared import PreparedDataError
    from mpifed.data.raw import DataMissing
    from mpifed.data.shards import ShardError
    from mpifed.round.method_errors import MethodFailed
    from mpifed.round.placement import PlacementError
    from mpifed.run.resume import RunError
    from mpifed.run.rundir import LockLost
    return (config.ConfigError, RunError, LockLost, checkpoint.CheckpointError, ClientStateError, DataMissing,
            PartitionError, PlacementError, PreparedDataError, ShardError, NonFiniteLoss, ProtocolError, MethodFailed)


def _disk_full(exc: OSError, undone: list[Path]) -> str:
    """What to do after a full disk (``exc``); ``undone``: the run directories whose start was undone."""
    where = f"{exc.strerror} writing {exc.filename or 'a file'}"
    if undone:
        return (f"{where}, before the run's first round: what its start wrote in {undone[0]} is removed (nothing "
                f"was trained); free space there, then run the same command again")
    return f"{where}: free space there, then continue the run with --resume (it restarts from the last complete " \
           f"checkpoint)"


def _refused(comm: Comm, message: str) -> int:
    """End the job on an error that is the user's to fix: its message, no traceback, exit code 2."""
    sys.stderr.write(f"[mpifed] {comm.where(comm.rank)}: {message}\n")
    if comm.size > 1:
        undo_starts()   # MPI_Abort ends this process before main's finally
        comm.abort(2)
    return 2


def _crashed(comm: Comm) -> int:
    """Report an unexpected error with its traceback and end the job."""
    sys.stderr.write(f"[mpifed] {comm.where(comm.rank)} failed:\n{traceback.format_exc()}")
    if comm.size > 1:
        sys.stderr.write(f"[mpifed] {comm.where(comm.rank)}: ending the whole job (MPI Abort)\n")
        undo_starts()
        comm.abort(1)
    return 1


if __name__ == "__main__":
    sys.exit(main())
