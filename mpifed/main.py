"""Entry point: ``mpirun -n N python -m mpifed.main [--config X.yaml] [--set key=value ...]``.

Without an MPI launcher (or with one rank) it is the single-node debug mode: the server
and all clients in one process, the same round code, the same results.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

# Only light modules at import time: signals.start() must block the stop signals before numpy
# or torch start their thread pools (a thread created earlier could receive SIGTERM and die).
from mpifed import config, signals
from mpifed.rundir import RunDir

if TYPE_CHECKING:
    from mpifed.comm import Comm

USER_ERRORS: tuple[type[Exception], ...] = ()  # filled in main()


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
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory of the same name")
    p.add_argument("--show-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--config-reference", action="store_true", help="print every config key with its default and exit")
    return p.parse_args(argv)


class RunError(RuntimeError):
    """A problem with the run directory or resume request."""


def _user_errors() -> tuple[type[Exception], ...]:
    from mpifed import checkpoint
    from mpifed.algorithms.base import NonFiniteLoss
    from mpifed.data.datasets import DataMissing
    from mpifed.data.partitions import PartitionError
    from mpifed.data.prepared import PreparedDataError
    from mpifed.data.shards import ShardError
    return (config.ConfigError, RunError, checkpoint.CheckpointError, DataMissing, PartitionError,
            PreparedDataError, ShardError, NonFiniteLoss)


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
        try:
            base = RunDir(run_path).read_config()
        except yaml.YAMLError as exc:
            raise RunError(f"--resume {run_path}: its config.yaml is not valid YAML ({exc}); repair it "
                           "(every checkpoint holds a copy of the resolved config under the key 'config')") from None
    cfg, d = config.load(args.config, overrides, base=base)
    if args.resume == "" and cfg.run.name is None:
        raise RunError("--resume without a run directory continues run.root/run.name, but run.name is not set: "
                       "give the directory (--resume runs/<name>) or the name (--set run.name=<name>)")
    if run_path is None:
        if cfg.run.name is None:
            stem = Path(args.config[-1]).stem if args.config else "quickstart"
            d["run"]["name"] = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_path = Path(cfg.run.root) / d["run"]["name"]
    else:
        d["run"]["name"], d["run"]["root"] = run_path.name, str(run_path.parent)
    cfg = config.build(d)
    run = RunDir(run_path)
    resume_from = None
    if args.resume is not None:
        resume_from = checkpoint.latest(run.checkpoints)
        if resume_from is not None:
            state = checkpoint.load(resume_from)
            if state["rounds_done"] > cfg.train.rounds:
                raise RunError(f"cannot resume {run_path} with train.rounds={cfg.train.rounds}: it has already "
                               f"completed {state['rounds_done']} rounds. Set train.rounds to at least that")
            changed = config.diff_keys(state["config_math"], config.math_fingerprint(d))
            if changed:
                raise RunError(f"cannot resume {run_path}: these settings differ from the checkpoint and change the "
                               f"results: {', '.join(changed)}. Undo them, or start a new run (another run.name)")
    elif run.holds_run() and not args.show_config:
        if not args.overwrite:
            raise RunError(f"{run_path} already holds a run. Continue it with --resume {run_path}, start a new one "
                           f"with --set run.name=<new name>, or replace it with --overwrite")
        shutil.rmtree(run_path)
    return {"config": d, "run_path": str(run_path), "resume_from": str(resume_from) if resume_from else None,
            "resuming": args.resume is not None}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.config_reference:
        print(config.reference())
        return 0
    signals.start()
    from mpifed.comm import Comm, MpiComm, world
    comm, rank, size = world()
    global USER_ERRORS
    USER_ERRORS = _user_errors()
    w: Comm = MpiComm(comm) if size > 1 else Comm()
    try:
        return _run(args, w, comm, rank, size)
    except SystemExit:
        raise
    except USER_ERRORS as exc:
        sys.stderr.write(f"[mpifed] rank {rank}: {exc}\n")
        if size > 1:
            w.abort(2)
        return 2
    except BaseException:
        sys.stderr.write(f"[mpifed] rank {rank} failed:\n{traceback.format_exc()}")
        if size > 1:
            sys.stderr.write(f"[mpifed] rank {rank}: ending the whole job (MPI Abort)\n")
            w.abort(1)
        return 1


def _agree(w: "Comm", rank: int, work) -> Any:
    """Rank 0 does ``work()`` while the others wait (yielding the CPU); all get its result or its error."""
    outcome = None
    if rank == 0:
        try:
            outcome = ("ok", work())
        except USER_ERRORS as exc:
            outcome = ("error", str(exc))
    w.sync("setup")
    outcome = w.bcast_object(outcome)
    if outcome[0] == "error":
        if rank == 0:
            sys.stderr.write(f"[mpifed] {outcome[1]}\n")
        raise SystemExit(2)
    return outcome[1]


def _run(args: argparse.Namespace, w: "Comm", comm: Any, rank: int, size: int) -> int:
    import torch

    from mpifed import checkpoint
    from mpifed.client_state import ClientStateStore
    from mpifed.comm import Comm, MpiComm
    from mpifed.algorithms import get_algorithm
    from mpifed.algorithms.base import ServerTools, Setup
    from mpifed.data.prepared import Manifest, ensure_prepared, verify_files
    from mpifed.data.shards import read_shard
    from mpifed.data.store import ClientData, to_device
    from mpifed.data.transforms import BatchTransform
    from mpifed.flat import FlatModel
    from mpifed.models import build_model
    from mpifed.placement import choose_device, choose_threads, node_slot
    from mpifed.server import Server
    from mpifed.worker import Worker, serve

    resolved = _agree(w, rank, lambda: resolve(args))
    cfg = config.build(resolved["config"])
    cfg_dict = resolved["config"]
    if args.show_config:
        if rank == 0:
            print(yaml.safe_dump(cfg_dict, sort_keys=False))
        return 0
    run = RunDir(Path(resolved["run_path"]))
    w.timeout_s, w.poll_s = cfg.comm.timeout_s, cfg.comm.poll_ms / 1000.0

    def prepare() -> str:
        manifest = ensure_prepared(cfg, log=print)
        verify_files(manifest)
        return str(manifest.root)

    manifest = Manifest.load(Path(_agree(w, rank, prepare)))

    is_server = rank == 0
    slot = node_slot(comm if size > 1 else None, is_server and size > 1)
    threads = choose_threads(cfg.resources.threads, slot.ranks_on_node)
    torch.set_num_threads(threads)
    if cfg.resources.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    gpus = torch.cuda.device_count()
    worker_device = choose_device(False, slot.worker_index, cfg.resources.device, cfg.resources.server_device, gpus)
    device = torch.device(choose_device(True, -1, cfg.resources.device, cfg.resources.server_device, gpus)
                          if is_server and size > 1 else worker_device)

    def new_model(dev: torch.device = device) -> FlatModel:
        return FlatModel(build_model(cfg.model.name, cfg.model.options, manifest.image_shape, manifest.num_classes).to(dev))

    aug = cfg.data.augment
    transform = BatchTransform(manifest.mean, manifest.std,
                               manifest.crop_padding if aug.crop_padding is None else aug.crop_padding,
                               manifest.flip if aug.flip is None else aug.flip, aug.cutout, device)
    torch.manual_seed(cfg.run.seed)
    flat = new_model()
    setup = Setup(num_classes=manifest.num_classes, num_clients=manifest.num_clients, num_floats=flat.num_floats,
                  num_params=flat.num_params, train=cfg.train, device=device, new_model=new_model)
    algo = get_algorithm(cfg.algorithm.name)(cfg.algorithm.options, setup)
    ranks = w.gather_object({"rank": rank, "host": slot.host, "pid": os.getpid(), "device": str(device),
                             "threads": threads, "role": "server" if is_server and size > 1 else "worker"})

    peers: Comm = Comm()
    if size > 1:
        from mpi4py import MPI
        sub = comm.Split(1 if rank > 0 else MPI.UNDEFINED, rank)
        if rank > 0:
            peers = MpiComm(sub, cfg.comm.timeout_s, cfg.comm.poll_ms)
    if rank != 0:
        worker = Worker(rank - 1, size - 1, algo, manifest, transform, peers, cfg.run.seed,
                        cfg.resources.cache_mb, cfg.train.eval_batch_size, run.path)
        try:
            serve(worker, w)
        except BaseException as exc:
            if run.path.is_dir():
                _mark_failed(run, f"rank {rank}: {type(exc).__name__}: {exc}")
            raise
        return 0

    run.create()
    run.write_config(cfg_dict)
    resume_state = checkpoint.load(Path(resolved["resume_from"])) if resolved["resume_from"] else None
    store = ClientStateStore(run.client_state)
    if resume_state is None:
        store.clear()
        if resolved["resuming"]:
            run.log(f"[mpifed] no checkpoint in {run.path}: starting the run from round 0")
    else:
        store.discard_from(resume_state["rounds_done"])
        run.log(f"[mpifed] resuming {run.path} after round {resume_state['rounds_done']} ({resolved['resume_from']})")
    mode = f"MPI, {size} ranks (1 server + {size - 1} workers)" if size > 1 else "single process (debug mode)"
    run.log(f"[mpifed] {cfg.algorithm.name} on {cfg.data.dataset.name}: {manifest.num_clients} clients, "
            f"{cfg.train.rounds} rounds; {mode}; run directory {run.path}")
    for r in ranks:
        run.log(f"[mpifed]   rank {r['rank']} ({r['role']}): host {r['host']} pid {r['pid']} device {r['device']} threads {r['threads']}")

    server_data = None
    if manifest.server_size:
        shard = read_shard(manifest.server_path)
        server_data = ClientData(-1, *to_device(shard.images, shard.labels, device))
    tools = ServerTools(flat=flat, transform=transform, data=server_data, eval_batch_size=cfg.train.eval_batch_size)
    local_worker = None
    if size == 1:
        local_worker = Worker(0, 1, algo, manifest, transform, peers, cfg.run.seed, cfg.resources.cache_mb,
                              cfg.train.eval_batch_size, run.path)

    def on_signal(name: str) -> None:
        sys.stderr.write(f"\n[mpifed] rank 0 received {name} (a scheduler's warning or preemption, or the launcher "
                         f"ending the job after a rank failed): stopping after the current round.{server.describe_checkpoint()}\n")
        sys.stderr.flush()

    server = Server(cfg, cfg_dict, manifest, algo, w, run, tools, max(size - 1, 1), local_worker, resume_state)
    signals.on_signal(on_signal)
    try:
        return server.run()
    except BaseException as exc:
        _mark_failed(run, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        run.close()


def _mark_failed(run: RunDir, error: str) -> None:
    """Record in status.json that the run failed, with the checkpoint to resume from."""
    from mpifed import checkpoint
    latest = checkpoint.latest(run.checkpoints)
    run.write_json("status.json", {"state": "failed", "error": error, "checkpoint": str(latest) if latest else None})


if __name__ == "__main__":
    sys.exit(main())
