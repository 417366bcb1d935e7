"""Entry point: ``mpirun -n N python -m mpifed.main [--config X.yaml] [--set key=value ...]``.

Without an MPI launcher (or with one rank) it is the single-node debug mode: the server
and all clients in one process, the same round code, the same results.
"""
from __future__ import annotations

import argparse
import errno
import functools
import importlib
import importlib.util
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

# Only light modules at import time: signals.listening() must block the stop signals before
# numpy or torch start their thread pools (a thread created earlier could receive SIGTERM and die).
from mpifed import __version__, config, handoff, pipes, provenance, signals
from mpifed.progress import count
from mpifed.registry import RegistryError
from mpifed.rundir import MARKER, RunDir, RunLocked, check_run_name, claim_new, default_run_name, release_locks

if TYPE_CHECKING:
    import torch

    from mpifed.algorithms.base import Algorithm, Setup
    from mpifed.comm import Comm
    from mpifed.data.prepared import Manifest
    from mpifed.data.transforms import BatchTransform
    from mpifed.protocol import Layouts
    from mpifed.server import RoundServer
    from mpifed.worker import Worker


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
                   help="import a Python file or module first, e.g. one that registers a method of your own "
                        "(@ALGORITHMS.register); repeatable")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory of the same name")
    p.add_argument("--show-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--config-reference", action="store_true", help="print every config key with its default and exit")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    return p.parse_args(argv)


class RunError(RuntimeError):
    """A problem with the run directory or resume request."""


class _Exit(Exception):
    """End the run with this exit code (the message, if any, was already printed)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def user_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's to fix: reported as one message, without a traceback."""
    from mpifed import checkpoint
    from mpifed.algorithms.base import NonFiniteLoss
    from mpifed.client_state import ClientStateError
    from mpifed.data.partitions import PartitionError
    from mpifed.data.prepared import PreparedDataError
    from mpifed.data.raw import DataMissing
    from mpifed.data.shards import ShardError
    from mpifed.placement import PlacementError
    return (config.ConfigError, RunError, checkpoint.CheckpointError, ClientStateError, DataMissing, PartitionError,
            PlacementError, PreparedDataError, ShardError, NonFiniteLoss)


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """Rank 0: the validated config, the run directory and the checkpoint to resume (if any)."""
    from mpifed import checkpoint
    overrides = [o for group in args.set for o in group]
    base = None
    run_path = None
    if args.resume:
        run_path = Path(args.resume)
        if not RunDir(run_path).holds_run():
            raise RunError(f"--resume {run_path}: no run there (no config.yaml); give the run directory, e.g. runs/<name>")
        base = _saved_config(RunDir(run_path))
    cfg, d = config.load(args.config, overrides, base=base)
    if args.resume == "" and cfg.run.name is None:
        raise RunError("--resume without a run directory continues run.root/run.name, but run.name is not set: "
                       "give the directory (--resume runs/<name>) or the name (--set run.name=<name>)")
    if run_path is None:
        if cfg.run.name is not None:
            try:
                check_run_name(cfg.run.name)
            except ValueError as exc:
                raise RunError(str(exc)) from None
            run_path = Path(cfg.run.root) / cfg.run.name
        else:
            stem = Path(args.config[-1]).stem if args.config else "quickstart"
            run_path = Path(cfg.run.root) / default_run_name(stem)
            if not args.show_config:
                try:
                    run_path = claim_new(run_path.parent, run_path.name)
                except OSError as exc:
                    raise RunError(_unwritable_root(run_path, exc)) from None
        d["run"]["name"] = run_path.name
    else:
        d["run"]["name"], d["run"]["root"] = run_path.name, str(run_path.parent)
    cfg = config.build(d)
    _check_extras(cfg)
    run = RunDir(run_path)
    if args.show_config:
        return {"config": d, "run_path": str(run_path), "resume_from": None, "resuming": False}
    new = not run.holds_run()
    _take_lock(run)
    resume_from = None
    if args.resume is not None:
        status = run.status()
        resume_from = checkpoint.latest(run.checkpoints)
        state = checkpoint.load(resume_from) if resume_from is not None else None
        if state is not None:
            if state["rounds_done"] > cfg.train.rounds:
                raise RunError(f"cannot resume {run_path} with train.rounds={cfg.train.rounds}: it has already "
                               f"completed {count(state['rounds_done'], 'round')}. Set train.rounds to at least that")
            changed, predates = config.checkpoint_changes(state["config_math"], d, base)
            if changed:
                raise RunError(f"cannot resume {run_path}: these settings differ from the checkpoint and change the "
                               f"results: {', '.join(changed)}. Undo them, or start a new run (another run.name)")
            if predates:
                shown = ", ".join(f"{k}={config.lookup(d, k)!r}" for k in predates)
                print(f"[mpifed] {run_path}'s checkpoint predates the settings {shown}: resuming with these "
                      f"defaults", flush=True)
            if status is not None and status["state"] == "finished" and state["rounds_done"] == cfg.train.rounds:
                return {"config": d, "run_path": str(run_path), "resume_from": None, "resuming": True,
                        "nothing_to_do": f"[mpifed] {run_path} is finished ({count(cfg.train.rounds, 'round')}): nothing to "
                                         f"resume, nothing changed. To train it further, resume with "
                                         f"--set train.rounds=<more than {cfg.train.rounds}>"}
            _check_same_data(run_path, state, cfg)
        elif status is not None and status["state"] == "finished":
            done = status.get("rounds_done")
            if done != cfg.train.rounds:
                raise RunError(f"cannot resume {run_path} with train.rounds={cfg.train.rounds}: it is finished "
                               f"({done} rounds) and has no checkpoint left in {run.checkpoints}, so it cannot be "
                               f"trained further; nothing was changed. Start a new run (another run.name) instead")
            return {"config": d, "run_path": str(run_path), "resume_from": None, "resuming": True,
                    "nothing_to_do": f"[mpifed] {run_path} is finished ({done} rounds; its checkpoints were "
                                     f"deleted): nothing to resume, nothing changed"}
        if status is not None and status.get("error"):
            print(f"[mpifed] {run_path} had failed ({status['error']}); resuming it", flush=True)
        removed = run.remove_temporary()
        if removed:
            print(f"[mpifed] removed {len(removed)} temporary file(s) a failed write left in {run_path}", flush=True)
    elif run.holds_run():
        if not args.overwrite:
            raise RunError(f"{run_path} already holds a run. Continue it with --resume {run_path}, start a new one "
                           f"with --set run.name=<new name>, or replace it with --overwrite")
        if not run.made_by_mpifed():
            raise RunError(f"--overwrite refused: {run_path} lacks the {MARKER} file that marks a directory mpifed "
                           f"made, so it is not deleted. Remove it yourself if it is a run, or choose another run.name")
        run.clear()
    return {"config": d, "run_path": str(run_path), "resume_from": str(resume_from) if resume_from else None,
            "resuming": args.resume is not None, "new": new}


def _check_extras(cfg: config.Config) -> None:
    """The optional packages the config asks for are installed (before anything starts)."""
    for wanted, module, extra in ((cfg.run.tensorboard, "tensorboard", "tensorboard"), (cfg.run.mlflow, "mlflow", "mlflow")):
        if wanted and importlib.util.find_spec(module) is None:
            raise RunError(f"run.{extra}=true needs the {module} package: pip install 'mpifed[{extra}]' "
                           f"(or set run.{extra}=false)")


def _saved_config(run: RunDir) -> dict[str, Any]:
    """The config.yaml of a run to resume, or a RunError that says how to restore it."""
    from mpifed import checkpoint
    try:
        saved = run.read_config()
    except yaml.YAMLError as exc:
        problem = f"is not valid YAML ({exc})"
    except OSError as exc:
        problem = f"cannot be read ({exc.strerror})"
    else:
        if isinstance(saved, dict):
            return saved
        problem = "is empty" if saved is None else f"holds a {type(saved).__name__}, not a mapping of sections"
    latest = checkpoint.latest(run.checkpoints)
    if latest is None:
        fix = "Restore it from a copy, or start the run again with --overwrite (it has no checkpoint)"
    else:
        fix = (f"Restore it from the run's checkpoint, which holds the resolved config under the key 'config': "
               f"python -c \"import sys, yaml; from pathlib import Path; from mpifed.checkpoint import load; "
               f"print(yaml.safe_dump(load(Path(sys.argv[1]))['config'], sort_keys=False), end='')\" "
               f"{latest} > {run.path / 'config.yaml'}")
    raise RunError(f"--resume {run.path}: its config.yaml {problem}, so the run's settings are unknown; nothing "
                   f"was changed. {fix}")


def _check_same_data(run_path: Path, state: dict[str, Any], cfg: config.Config) -> None:
    """Refuse to resume when the prepared data the checkpoint was trained on would differ now (a
    ``from_file`` partition edited since, another tokenizer). A checkpoint that predates this
    record is not checked."""
    from mpifed.data.partitions import PartitionError
    from mpifed.data.prepared import prepare_spec
    stored = state.get("data_spec")
    if stored is None:
        return
    try:
        now = prepare_spec(cfg)
    except (PartitionError, FileNotFoundError):
        return  # the file is gone: preparing the data reports it
    changed = config.diff_keys(stored, now)
    if any(k.startswith("partition.fingerprint") for k in changed):
        raise RunError(f"cannot resume {run_path}: the partition file {cfg.data.partition.options.path} changed since "
                       f"the run started (its content differs from the file the checkpoint was trained on), so the "
                       f"clients would not hold the same samples. Put back the file the run started with, or start "
                       f"a new run (another run.name)")
    if changed:
        raise RunError(f"cannot resume {run_path}: the data it was trained on changed since it started (differing: "
                       f"{', '.join(changed)}). Put back what the run started with, or start a new run "
                       f"(another run.name)")


def _unwritable_root(run_path: Path, exc: OSError) -> str:
    return (f"cannot create the run directory {run_path} ({exc.strerror}): run.root={run_path.parent} must be a "
            f"folder you can write to (not a file, not under /proc or /sys); set run.root=<folder>")


def _take_lock(run: RunDir) -> None:
    """Hold the run directory's lock (for this process's life), or say plainly why not."""
    try:
        warning = run.lock()
    except RunLocked as exc:
        raise RunError(str(exc)) from None
    except OSError as exc:
        raise RunError(_unwritable_root(run.path, exc)) from None
    if warning:
        print(warning, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run mpifed with command-line arguments ``argv``; returns the exit code. Re-entrant: a
    process may call it several times (the tests do, in the debug mode)."""
    args = parse_args(argv)
    try:
        for plugin in args.plugin:
            load_plugin(plugin)
    except (ImportError, OSError, RegistryError) as exc:
        sys.stderr.write(f"[mpifed] --plugin: {exc}\n")
        return 2
    if args.config_reference:
        print(config.reference())
        return 0
    # OpenMP threads waiting for work spin by default; with other processes on the cores (ranks
    # sharing a node, a busy machine) the spinning starves the threads that compute (a round
    # took 10 to 25 times longer). Passive waiting costs little on an idle machine.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with signals.listening(), pipes.survive_closed_output():
        from mpifed.comm import Comm, MpiComm, world
        comm, rank, size = world()
        errors = user_errors()
        w: Comm = MpiComm(comm) if size > 1 else Comm()
        try:
            return handoff.hand_back(_run(args, w, comm, rank, size, errors), rank)
        except _Exit as stop:
            return handoff.hand_back(stop.code, rank)
        except errors as exc:
            sys.stderr.write(f"[mpifed] rank {rank}: {exc}\n")
            if size > 1:
                w.abort(2)
            return handoff.hand_back(2, rank)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                return _crashed(w, rank, size)
            sys.stderr.write(f"[mpifed] rank {rank}: {exc.strerror} writing {exc.filename or 'a file'}: free space "
                             f"there, then continue the run with --resume (it restarts from the last complete "
                             f"checkpoint)\n")
            if size > 1:
                w.abort(2)
            return handoff.hand_back(2, rank)
        except BaseException:
            return _crashed(w, rank, size)
        finally:
            release_locks()


def _crashed(w: "Comm", rank: int, size: int) -> int:
    """Report an unexpected error with its traceback and end the job."""
    sys.stderr.write(f"[mpifed] rank {rank} failed:\n{traceback.format_exc()}")
    if size > 1:
        sys.stderr.write(f"[mpifed] rank {rank}: ending the whole job (MPI Abort)\n")
        w.abort(1)
    return 1


def load_plugin(spec: str) -> None:
    """Import a Python file (path ending in .py) or an importable module by name."""
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise ImportError(f"{spec} does not exist")
        name = f"mpifed_plugin_{path.stem}"
        if name in sys.modules:
            return
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        importlib.import_module(spec)


def _agree(w: "Comm", rank: int, work, errors: tuple[type[Exception], ...]) -> Any:
    """Rank 0 does ``work()`` while the others wait (yielding the CPU); all get its result or its error."""
    outcome = None
    if rank == 0:
        try:
            outcome = ("ok", work())
        except errors as exc:
            outcome = ("error", str(exc))
    w.sync("setup")
    outcome = w.bcast_object(outcome)
    if outcome[0] == "error":
        if rank == 0:
            sys.stderr.write(f"[mpifed] {outcome[1]}\n")
        raise _Exit(2)
    return outcome[1]


def _all_agree(w: "Comm", rank: int, what: str, work, errors: tuple[type[Exception], ...]) -> Any:
    """Every rank does its share of ``work()`` (``what``) and gets its own result; if any fails, all
    stop with the first error (printed by rank 0)."""
    result, mine = None, None
    try:
        result = work()
    except errors as exc:
        mine = str(exc)
    w.sync(what)
    found = w.gather_object(mine)
    first = w.bcast_object(next((e for e in found if e), None) if rank == 0 else None)
    if first:
        if rank == 0:
            sys.stderr.write(f"[mpifed] {first}\n")
        raise _Exit(2)
    return result


def _run(args: argparse.Namespace, w: "Comm", comm: Any, rank: int, size: int,
         errors: tuple[type[Exception], ...]) -> int:
    from mpifed.comm import Comm, MpiComm
    from mpifed.data.prepared import Manifest, ensure_prepared, verify_client_shards, verify_files
    from mpifed.protocol import RoundProtocol, build_layouts

    resolved = _agree(w, rank, lambda: resolve(args), errors)
    cfg = config.build(resolved["config"])
    if args.show_config:
        if rank == 0:
            print(yaml.safe_dump(resolved["config"], sort_keys=False))
        return 0
    if resolved.get("nothing_to_do"):
        if rank == 0:
            print(resolved["nothing_to_do"], flush=True)
        return 0
    run = RunDir(Path(resolved["run_path"]))
    w.on_abort = lambda reason: _mark_failed(run, reason)
    w.timeout_s, w.poll_s = cfg.comm.timeout_s, cfg.comm.poll_ms / 1000.0

    def prepare() -> str:
        manifest = ensure_prepared(cfg, log=print)
        verify_files(manifest)
        return str(manifest.root)

    manifest = Manifest.load(Path(_agree(w, rank, prepare, errors)))
    is_server, has_worker = rank == 0, rank > 0 or size == 1
    workers, worker_index = max(size - 1, 1), rank - 1 if size > 1 else 0
    _all_agree(w, rank, "check of the client shards",
               lambda: verify_client_shards(manifest, worker_index, workers) if has_worker else None, errors)
    device, threads, host = _all_agree(w, rank, "choice of the devices", lambda: _place(cfg, comm, rank, size), errors)
    algo, setup = make_algorithm(cfg, manifest, device)
    layouts = build_layouts(algo.messages(), setup.num_floats, setup.new_model().ints.numel(), manifest.test_size,
                            cfg.train.eval_batch_size, manifest.num_classes, len(manifest.group_names), manifest.val_size)
    transform = make_transform(cfg, manifest, device)
    ranks = w.gather_object({"rank": rank, "host": host, "pid": os.getpid(), "device": str(device), "threads": threads,
                             "role": "server" if size > 1 and is_server else ("worker" if size > 1 else "server and worker"),
                             **provenance.rank_details(device)})
    peers: Comm = Comm()
    if size > 1:
        from mpi4py import MPI
        sub = comm.Split(1 if rank > 0 else MPI.UNDEFINED, rank)
        if rank > 0:
            peers = MpiComm(sub, cfg.comm.timeout_s, cfg.comm.poll_ms)
            peers.on_abort = w.on_abort

    worker = None
    if has_worker:
        worker = make_worker(cfg, algo, setup, layouts, manifest, transform, run, worker_index, workers)
    if not is_server:
        try:
            RoundProtocol(layouts, w, peers, None, worker, setup.clients_per_round).run()
        except BaseException as exc:
            _mark_failed(run, f"rank {rank}: {type(exc).__name__}: {exc}")
            raise
        return 0

    server = make_server(cfg, resolved, algo, setup, manifest, transform, run, workers,
                         handoff.resume_command(run.path, size, args.plugin))
    provenance.record(run.path, ranks, server.rnd)
    _log_start(run, cfg, manifest, size, ranks, server.mlflow.describe() if server.mlflow else None)
    w.context = server.describe_checkpoint

    def on_signal(name: str) -> None:
        again = f"; a second {name} ends the job at once" if name in ("SIGINT", "SIGTERM") else ""
        lost = (" If a rank has failed, mpirun ends the job at once instead, and the run continues from the "
                "last checkpoint." if name == "SIGTERM" else "")
        server.progress.write(f"[mpifed] rank 0: {handoff.describe_signal(name)}: finishing the current round, then "
                              f"writing a checkpoint and stopping{again}.{lost}{server.describe_checkpoint()}", err=True)

    signals.on_signal(on_signal)
    try:
        RoundProtocol(layouts, w, peers, server, worker, setup.clients_per_round).run()
        return server.exit_code
    except BaseException as exc:
        _mark_failed(run, f"{type(exc).__name__}: {exc}")
        try:
            server.abandon()
        except Exception as tracking:  # the failure above is the one to report
            sys.stderr.write(f"[mpifed] could not end the run's tracking ({tracking})\n")
        raise
    finally:
        run.close()


# ------------------------------------------------------------------ factories
def _place(cfg: config.Config, comm: Any, rank: int, size: int) -> tuple["torch.device", int, str]:
    """This rank's device and torch threads (set here), and its host name."""
    import torch

    from mpifed.placement import choose_device, choose_threads, node_slot, set_deterministic
    is_server = rank == 0 and size > 1
    slot = node_slot(comm if size > 1 else None, is_server)
    threads = choose_threads(cfg.resources.threads, slot.ranks_on_node)
    torch.set_num_threads(threads)
    if cfg.resources.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_deterministic(cfg.resources.deterministic)
    torch.backends.cudnn.benchmark = False
    gpus = torch.cuda.device_count()
    device = choose_device(is_server, slot.worker_index, cfg.resources.device, cfg.resources.server_device, gpus)
    return torch.device(device), threads, slot.host


def make_algorithm(cfg: config.Config, manifest: "Manifest", device: "torch.device") -> tuple["Algorithm", "Setup"]:
    """The configured method and the :class:`Setup` its roles are built with."""
    import torch

    from mpifed.algorithms.base import Setup
    from mpifed.flat import FlatModel
    from mpifed.models import build_model
    from mpifed.plan import clients_per_round
    from mpifed.registry import ALGORITHMS
    cls = ALGORITHMS.get(cfg.algorithm.name)
    options = cfg.algorithm.options

    def new_model() -> FlatModel:
        net = build_model(cfg.model.name, cfg.model.options, manifest.input_shape, manifest.num_classes)
        if manifest.vocab_size > getattr(net, "vocab_size", manifest.vocab_size):
            raise ValueError(f"the tokenizer's vocabulary ({manifest.vocab_size} tokens) exceeds the model's "
                             f"{net.vocab_size} token embeddings; set model.vocab_size to at least {manifest.vocab_size}")
        return FlatModel(cls.extend_model(net, options).to(device))

    torch.manual_seed(cfg.run.seed)
    probe = new_model()
    setup = Setup(num_classes=manifest.num_classes, num_clients=manifest.num_clients,
                  clients_per_round=clients_per_round(manifest.num_clients, cfg.train.participation),
                  num_floats=probe.num_floats, num_params=probe.num_params, feature_dim=probe.model.feature_dim,
                  train=cfg.train, device=device, new_model=new_model, seed=cfg.run.seed)
    return cls(options, setup), setup


def make_transform(cfg: config.Config, manifest: "Manifest", device: "torch.device") -> "BatchTransform":
    from mpifed.data.transforms import make_transform as for_manifest
    return for_manifest(manifest, cfg.data.augment, device)


def make_worker(cfg: config.Config, algo: "Algorithm", setup: "Setup", layouts: "Layouts", manifest: "Manifest",
                transform: "BatchTransform", run: RunDir, index: int, count: int) -> "Worker":
    from mpifed.client_state import ClientStates
    from mpifed.steps import make_steps
    from mpifed.worker import Worker
    states = (ClientStates(run.client_state, layouts.client_state, cfg.resources.client_state_mb)
              if layouts.client_state.entries else None)
    runner = make_steps(cfg.resources.precision, cfg.resources.cuda_graphs, setup.device,
                        log=functools.partial(print, flush=True) if index == 0 else None)
    return Worker(index, count, algo.client(), setup, layouts, manifest, transform, cfg.run.seed,
                  cfg.resources.cache_mb, cfg.train.eval_batch_size, states, runner)


def make_server(cfg: config.Config, resolved: dict[str, Any], algo: "Algorithm", setup: "Setup", manifest: "Manifest",
                transform: "BatchTransform", run: RunDir, workers: int, resume_command: str) -> "RoundServer":
    """The server rank's side: the run directory, the global model (initial or resumed) and the
    method's server role with the server-held data; ``resume_command`` continues the run."""
    from mpifed import checkpoint
    from mpifed.algorithms.base import ServerTools
    from mpifed.client_state import discard_from
    from mpifed.data.shards import read_shard
    from mpifed.data.store import ClientData, to_device
    from mpifed.server import RoundServer
    run.create()
    run.write_config(resolved["config"])
    resume = checkpoint.load(Path(resolved["resume_from"])) if resolved["resume_from"] else None
    if resume is None:
        shutil.rmtree(run.client_state, ignore_errors=True)
    else:
        discard_from(run.client_state, resume["rounds_done"])
    flat = setup.initial_model()
    server_data = None
    if manifest.server_size:
        shard = read_shard(manifest.server_path)
        server_data = ClientData(-1, *to_device(shard.inputs, shard.labels, setup.device))
    tools = ServerTools(flat=flat, transform=transform, data=server_data, eval_batch_size=cfg.train.eval_batch_size)
    if resume is None and resolved["resuming"] and not resolved.get("new"):
        run.log(f"[mpifed] no checkpoint in {run.path}: starting the run from round 1")
    elif resume is not None:
        run.log(f"[mpifed] resuming {run.path} after round {resume['rounds_done']} ({resolved['resume_from']})")
    return RoundServer(cfg, resolved["config"], manifest, algo.server(tools), workers, run, resume, resume_command)


def _log_start(run: RunDir, cfg: config.Config, manifest: "Manifest", size: int, ranks: list[dict[str, Any]],
               mlflow: str | None) -> None:
    mode = f"MPI, {size} ranks (1 server + {size - 1} workers)" if size > 1 else "single process (debug mode)"
    run.log(f"[mpifed] {cfg.algorithm.name} on {cfg.data.dataset.name}: {count(manifest.num_clients, 'client')}, "
            f"{count(cfg.train.rounds, 'round')}; {mode}; run directory {run.path}")
    for r in ranks:
        gpu = f" ({r['gpu']})" if r["gpu"] else ""
        run.log(f"[mpifed]   rank {r['rank']} ({r['role']}): host {r['host']} pid {r['pid']} device {r['device']}{gpu} "
                f"threads {r['threads']}")
    if cfg.data.test_subset:
        full = manifest.test_source_size
        if full is None or manifest.test_size < full:
            of = f" of {full}" if full is not None else ""
            run.log(f"[mpifed] test set: first {manifest.test_size}{of} samples (a subset: for quick runs only)")
    if manifest.val_size:
        run.log(f"[mpifed] validation set: {manifest.val_size} training samples held out (data.val_size), "
                f"evaluated with the test set")
    if cfg.run.tensorboard:
        events = run.path / "tensorboard"
        run.log(f"[mpifed] TensorBoard events in {events}; view them with: tensorboard --logdir {events.parent.parent}")
    if mlflow:
        run.log(f"[mpifed] tracking: {mlflow}")


def _mark_failed(run: RunDir, error: str) -> None:
    """Record in status.json (and log.txt) that the run failed, with the reason and the checkpoint to
    resume from. Best effort: a failure to write (a full disk) is reported, never raised."""
    from mpifed import checkpoint
    if not run.path.is_dir():
        return
    latest = checkpoint.latest(run.checkpoints)
    try:
        with open(run.path / "log.txt", "a") as log:
            log.write(f"{time.strftime('%H:%M:%S')} [mpifed] failed: {error}\n")
        run.write_json("status.json", {"state": "failed", "error": error, "checkpoint": str(latest) if latest else None})
    except OSError as exc:
        sys.stderr.write(f"[mpifed] could not record the failure in {run.path}/status.json ({exc.strerror}); "
                         f"readers treat the run as failed once its processes have ended\n")


if __name__ == "__main__":
    sys.exit(main())
