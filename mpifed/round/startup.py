"""Start-up: every step from the command line to round 1, in order, written once.

Like the round (:mod:`mpifed.round.protocol`), start-up is a sequence of phases that every rank
walks in the same order. Each phase that involves more than one rank is one named agreement,
so a rank that hangs or fails is reported under the phase it did not finish
(``start-up: <phase>``)::

    resolve     rank 0 -> all     the config, the run directory and how the run starts: rank 0
                                  loads the plugins, reads the command line, locks the run directory
                                  and applies the resume policy (:mod:`mpifed.run.resume`)
    plugins     all -> all        every rank loads rank 0's plugins (checked by hash) and builds the
                                  config
    prepare     rank 0 -> all     the prepared data, written once (by rank 0) and checked
    shards      all -> all        each worker checks the shards of the clients it may train
    placement   all -> all        each rank's device and torch threads
    (build)                       every rank: the method, its layouts, the batch transform
    ranks       all -> server     each rank's host, pid, device and threads (provenance, log)
    workers     all               the workers' own group (client statistics, client-state moves)
    (roles)                       the worker side on the workers; on rank 0 the server side, which
                                  opens the run directory, makes round 1's downlink (checked against
                                  the method's messages) and listens for stop signals

A phase that fails on any rank stops every rank, before round 1, with the first error,
printed once by rank 0 (:class:`StartFailed`). A stop signal (Ctrl-C, SIGTERM, ...) that reaches
rank 0 during start-up ends it at the end of the phase in progress (:class:`StartStopped`).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from mpifed.run import checkpoint, provenance
from mpifed.settings import config, plugins
from mpifed.comm import handoff
from mpifed.round import signals
from mpifed.algorithms.base import NonFiniteLoss
from mpifed.comm.collectives import Comm
from mpifed.data.prepared import Manifest, verify_blocks
from mpifed.run.progress import count
from mpifed.round.method_errors import MethodFailed
from mpifed.round.async_protocol import AsyncProtocol
from mpifed.round.async_setup import asynchronous
from mpifed.round.protocol import RoundProtocol, build_layouts
from mpifed.run.rundir import LockLost, RunDir

if TYPE_CHECKING:
    import torch

    from mpifed.algorithms.base import Algorithm, Setup
    from mpifed.data.transforms import BatchTransform
    from mpifed.round.placement import NodeSlot
    from mpifed.round.protocol import Layouts
    from mpifed.round.server import RoundServer
    from mpifed.round.worker import Worker

T = TypeVar("T")


class StartFailed(Exception):
    """A start-up phase failed on some rank (rank 0 has printed why): every rank ends with exit code 2."""


class StartStopped(Exception):
    """A stop signal reached rank 0 during start-up (rank 0 has said so): every rank ends before round 1."""


@dataclass(frozen=True)
class Resolved:
    """Rank 0's reading of the command line, sent to every rank."""

    config: dict[str, Any]             # the validated config, as a plain dict
    run_path: Path
    resume_from: Path | None = None    # the checkpoint the run continues after
    resuming: bool = False             # --resume was given
    nothing_to_do: str | None = None   # why the run needs no work (it is finished): printed instead
    new: bool = False                  # the run directory held no run before
    plugins: tuple[dict[str, Any], ...] = ()   # how every rank loads rank 0's plugins (Plugin.how_to_load)
    trust_checkpoint: bool = False     # --trust-checkpoint: the checkpoint may hold other Python objects
    code_words: tuple[str, ...] = ()   # what a resume command needs to load the run's plugins again
    code_changed: dict[str, dict[str, str | None]] = field(default_factory=dict)   # --trust-changed-code: old, new


@dataclass
class Started:
    """A rank ready for round 1: the round protocol with this rank's roles."""

    protocol: RoundProtocol | AsyncProtocol
    server: RoundServer | None
    run: RunDir
    rank: int

    def walk(self) -> int:
        """Walk every round; returns the exit code. A failure is recorded in the run's status.json
        before it propagates."""
        self.run.keep()
        try:
            self.protocol.run()
            return self.server.exit_code if self.server else 0
        except LockLost:
            raise   # another process uses the directory now: nothing more is written into it
        except BaseException as exc:
            where = "" if self.server else f"rank {self.rank} on {socket.gethostname()}: "
            said = exc.headline if isinstance(exc, MethodFailed) else str(exc)   # its traceback is on the output
            self.run.mark_failed(f"{where}{type(exc).__name__}: {said}", checkpoint.latest(self.run.checkpoints),
                                 diverged=isinstance(exc, NonFiniteLoss))
            if self.server:
                try:
                    self.server.abandon()
                except Exception as tracking:  # the failure above is the one to report
                    sys.stderr.write(f"[mpifed] could not end the run's tracking ({tracking})\n")
            raise
        finally:
            self.run.close()


class Startup:
    """Walks the start-up phases on one rank."""

    def __init__(self, world: Comm, mpi_world: Any, errors: tuple[type[Exception], ...]) -> None:
        self.world = world
        self.mpi_world = mpi_world       # mpi4py's COMM_WORLD, None in the debug mode (for the placement)
        self.rank, self.size = world.rank, world.size
        self.errors = errors             # the user's to fix: one message each, no traceback

    def resolve(self, work: Callable[[], Resolved]) -> Resolved:
        """The resolve phase: rank 0 runs ``work``; every rank gets its answer."""
        return self._decided("resolve", work)

    def start(self, resolved: Resolved, resume_command: str, verbose: bool = False) -> Started:
        """The phases after resolve: this rank, ready for round 1 (``resume_command`` continues the run)."""
        world, rank, size = self.world, self.rank, self.size
        cfg = self._everyone("plugins", lambda: load_code(resolved, rank))
        run = RunDir(resolved.run_path)
        world.on_abort = lambda reason: run.mark_failed(reason, checkpoint.latest(run.checkpoints))
        world.timeout_s, world.poll_s = cfg.comm.timeout_s, cfg.comm.poll_ms / 1000.0
        is_server, has_worker = rank == 0, rank > 0 or size == 1
        workers, index = max(size - 1, 1), rank - 1 if size > 1 else 0

        manifest = Manifest.load(self._decided("prepare", lambda: prepare(cfg)))
        self._everyone("shards", lambda: verify_blocks(manifest, index, workers) if has_worker else None)
        device, threads, slot, gpus = self._everyone("placement", lambda: place(cfg, self.mpi_world, rank, size))

        algo, setup = make_algorithm(cfg, manifest, device)
        layouts = build_layouts(algo.messages(), setup.num_floats, setup.num_ints, manifest.test_size,
                                cfg.train.eval_batch_size, manifest.num_classes, len(manifest.group_names),
                                manifest.val_size, method=cfg.algorithm.name,
                                evaluated_clients=manifest.num_clients if cfg.data.client_holdout else 0)
        transform = make_transform(cfg, manifest, device)
        role = ("server" if is_server else "worker") if size > 1 else "server and worker"
        ranks = self._gathered("ranks", {"rank": rank, "host": slot.host, "pid": os.getpid(), "device": str(device),
                                         "threads": threads, "role": role, "node_worker": slot.worker_index,
                                         "node_gpus": gpus, **provenance.rank_details(device)})
        peers = world.workers()

        worker, server = None, None
        if has_worker:
            worker = make_worker(cfg, algo, setup, layouts, manifest, transform, run, index, workers, rank)
        if is_server:
            server = make_server(cfg, resolved, algo, setup, layouts, manifest, transform, run, workers, resume_command)
            code = plugins.keep_copies(run.path, config.chosen_entries(cfg))
            provenance.record(run.path, ranks, server.rounds_done, code, resolved.code_changed)
            log_start(run, cfg, manifest, size, ranks, server.records.tracked(), code, verbose)
            world.context = server.describe_checkpoint
            world.hosts.update({r["rank"]: r["host"] for r in ranks})
            signals.on_signal(lambda name: announce_stop(server, name))
        if asynchronous(cfg):
            return Started(AsyncProtocol(layouts, world, peers, server, worker), server, run, rank)
        from mpifed.plugin.registry import SELECTORS
        probes = SELECTORS.get(cfg.selection.name).probes
        return Started(RoundProtocol(layouts, world, peers, server, worker, setup.clients_per_round, probes), server,
                       run, rank)

    # ------------------------------------------------------------ agreements
    def _decided(self, phase: str, work: Callable[[], T]) -> T:
        """Rank 0 does ``work()`` while the others wait (yielding the CPU); every rank gets its result,
        or stops with its error or on a stop request rank 0 received."""
        outcome = None
        if self.rank == 0:
            try:
                outcome = ("ok", work())
                outcome = self._stop_requested(phase) or outcome
            except self.errors as exc:
                outcome = ("error", str(exc))
        self.world.sync(f"start-up: {phase}")
        outcome = self.world.bcast_object(outcome, what=f"start-up: {phase}: broadcast")
        self._end_if_not_ok(outcome)
        return outcome[1]

    def _everyone(self, phase: str, work: Callable[[], T]) -> T:
        """Every rank does its share of ``work()`` and gets its own result; if any fails, every rank
        stops with the first error (or on a stop request rank 0 received)."""
        result, mine = None, None
        try:
            result = work()
        except self.errors as exc:
            mine = str(exc)
        self.world.sync(f"start-up: {phase}")
        found = self.world.gather_object(mine, what=f"start-up: {phase}: gather")
        outcome = None
        if self.rank == 0:
            first = next((e for e in found if e), None)
            outcome = ("error", first) if first else self._stop_requested(phase) or ("ok", None)
        self._end_if_not_ok(self.world.bcast_object(outcome, what=f"start-up: {phase}: broadcast"))
        return result

    def _stop_requested(self, phase: str) -> tuple[str, str] | None:
        """Rank 0: ("stop", what to say) when a stop signal has arrived by the end of ``phase`` (start-up
        ends there), else None."""
        names = signals.received()
        if not names:
            return None
        why = ", ".join(handoff.describe_signal(n) for n in dict.fromkeys(names))
        return ("stop", f"{why} during start-up ({phase}): stopped before round 1, nothing was trained; run the "
                        f"same command again to start")

    def _end_if_not_ok(self, outcome: tuple[str, Any]) -> None:
        """Every rank: end start-up on a failed phase (:class:`StartFailed`) or a stop request
        (:class:`StartStopped`); rank 0 says why."""
        kind, said = outcome
        if kind == "ok":
            return
        if self.rank == 0:
            sys.stderr.write(f"[mpifed] {said}\n")
        raise StartFailed(said) if kind == "error" else StartStopped(said)

    def _gathered(self, phase: str, mine: Any) -> list[Any] | None:
        """Every rank's ``mine`` on rank 0 (None elsewhere)."""
        self.world.sync(f"start-up: {phase}")
        return self.world.gather_object(mine, what=f"start-up: {phase}: gather")


# ------------------------------------------------------------------ phases' work
def load_code(resolved: Resolved, rank: int) -> config.Config:
    """Plugins: rank 0's plugins loaded on this rank too (the same files, checked by hash), then the
    config, whose recorded code must be what this rank loaded (an installed plugin of another
    version on one node is refused here)."""
    for how in resolved.plugins:
        plugins.load_again(how)
    cfg = config.build(resolved.config)
    here = config.code_of(cfg)
    if here != cfg.code:
        differ = [f"{f}: {getattr(here, f) or 'mpifed own'} here, {getattr(cfg.code, f) or 'mpifed own'} on rank 0"
                  for f in ("algorithm", "model", "dataset", "partition") if getattr(here, f) != getattr(cfg.code, f)]
        raise plugins.PluginError(f"rank {rank} has other plugin code than rank 0 ({'; '.join(differ)}): install the "
                                  f"same version of each plugin on every node")
    return cfg


def check_extras(cfg: config.Config) -> None:
    """Resolve: the optional packages the config asks for are installed (before anything starts)."""
    from mpifed.run.resume import RunError
    for wanted, module, extra in ((cfg.run.tensorboard, "tensorboard", "tensorboard"),
                                  (cfg.run.mlflow, "mlflow", "mlflow"), (cfg.run.wandb, "wandb", "wandb")):
        if wanted and importlib.util.find_spec(module) is None:
            raise RunError(f"run.{extra}=true needs the {module} package: pip install 'mpifed[{extra}]' "
                           f"(or set run.{extra}=false)")
    if cfg.run.mlflow:
        from mpifed.run.mlflow_log import missing_for, tracking_uri
        uri = tracking_uri(config.to_dict(cfg.run))
        missing = missing_for(uri)
        if missing:
            raise RunError(f"run.mlflow: the store {uri} is a database, which MLflow reaches through "
                           f"{' and '.join(missing)}, not installed: pip install 'mpifed[mlflow]' (it installs them), "
                           f"or use a file store (run.mlflow_uri=file:/path)")


def prepare(cfg: config.Config) -> Path:
    """Rank 0: the prepared data's folder (prepared now if it is not yet), its files checked."""
    from mpifed.data.prepared import verify_files
    from mpifed.preparation.build import ensure_prepared
    manifest = ensure_prepared(cfg, log=print)
    verify_files(manifest)
    return manifest.root


def place(cfg: config.Config, mpi_world: Any, rank: int, size: int) -> tuple["torch.device", int, NodeSlot, int]:
    """This rank's device and torch threads (set here), its place on its node, and the GPUs it sees."""
    import torch

    from mpifed.round.placement import choose_device, choose_threads, node_slot, set_deterministic
    is_server = rank == 0 and size > 1
    slot = node_slot(mpi_world if size > 1 else None, is_server)
    threads = choose_threads(cfg.resources.threads, slot.ranks_on_node)
    torch.set_num_threads(threads)
    if cfg.resources.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_deterministic(cfg.resources.deterministic)
    torch.backends.cudnn.benchmark = False
    gpus = torch.cuda.device_count()
    device = choose_device(is_server, slot.worker_index, cfg.resources.device, cfg.resources.server_device, gpus)
    return torch.device(device), threads, slot, gpus


def make_algorithm(cfg: config.Config, manifest: Manifest, device: torch.device) -> tuple[Algorithm, Setup]:
    """The configured method and the :class:`Setup` its roles are built with."""
    import torch

    from mpifed.algorithms.base import Setup
    from mpifed.local.flat import FlatModel
    from mpifed.models import build_model
    from mpifed.round.plan import clients_per_round
    from mpifed.plugin.registry import ALGORITHMS
    cls = ALGORITHMS.get(cfg.algorithm.name)
    options = cfg.algorithm.options

    def new_model() -> FlatModel:
        net = build_model(cfg.model.name, cfg.model.options, manifest.input_shape, manifest.num_classes)
        if manifest.vocab_size > getattr(net, "vocab_size", manifest.vocab_size):
            raise ValueError(f"the tokenizer's vocabulary ({manifest.vocab_size} tokens) exceeds the model's "
                             f"{net.vocab_size} token embeddings; set model.vocab_size to at least "
                             f"{manifest.vocab_size}")
        return FlatModel(cls.extend_model(net, options).to(device))

    torch.manual_seed(cfg.run.seed)
    probe = new_model()
    setup = Setup(num_classes=manifest.num_classes, num_clients=manifest.num_clients,
                  clients_per_round=clients_per_round(manifest.num_clients, cfg.train.participation),
                  num_floats=probe.num_floats, num_params=probe.num_params, num_ints=probe.ints.numel(),
                  feature_dim=probe.model.feature_dim,
                  train=cfg.train, device=device, new_model=new_model, seed=cfg.run.seed)
    return cls(options, setup), setup


def make_transform(cfg: config.Config, manifest: Manifest, device: torch.device) -> BatchTransform:
    from mpifed.data.transforms import make_transform as for_manifest
    return for_manifest(manifest, cfg.data.augment, device)


def make_worker(cfg: config.Config, algo: Algorithm, setup: Setup, layouts: Layouts, manifest: Manifest,
                transform: BatchTransform, run: RunDir, index: int, workers: int, rank: int) -> Worker:
    """The worker side of this rank (``rank``, the ``index``-th of ``workers``): the method's client role,
    its clients' data and their state."""
    from mpifed.round.client_state import ClientStates
    from mpifed.local.steps import make_steps
    from mpifed.round.worker import Worker
    states = (ClientStates(run.client_state, layouts.client_state, cfg.resources.client_state_mb,
                           versions=cfg.run.keep_checkpoints + 1, rounds=cfg.train.rounds)
              if layouts.client_state.entries else None)
    runner = make_steps(cfg.resources.precision, cfg.resources.cuda_graphs, setup.device,
                        log=functools.partial(print, flush=True) if index == 0 else None)
    return Worker(index, workers, algo.client(), setup, layouts, manifest, transform, cfg.run.seed,
                  cfg.resources.cache_mb, cfg.train.eval_batch_size, cfg.run.eval_test, states, runner,
                  cfg.data.client_holdout, method=cfg.algorithm.name, rank=rank)


def make_server(cfg: config.Config, resolved: Resolved, algo: Algorithm, setup: Setup, layouts: Layouts,
                manifest: Manifest, transform: BatchTransform, run: RunDir, workers: int,
                resume_command: str) -> RoundServer:
    """The server rank's side: the run directory, the global model (initial or resumed) and the
    method's server role with the server-held data and the server optimiser, its first downlink
    checked against the declaration; ``resume_command`` continues the run."""
    from mpifed.algorithms.base import ServerTools
    from mpifed.data.shards import read_shard
    from mpifed.data.store import ClientData, to_device
    from mpifed.plugin.registry import SERVER_OPTIMIZERS
    from mpifed.round.server import RoundServer
    from mpifed.round.timeline import Timeline, costs
    run.create()
    run.write_config(resolved.config)
    resume = checkpoint.load_run_state(resolved.resume_from,
                                       resolved.trust_checkpoint) if resolved.resume_from else None
    if resume is None:
        shutil.rmtree(run.client_state, ignore_errors=True)
    flat = setup.initial_model()
    server_data = None
    if manifest.server_size:
        shard = read_shard(manifest.server_path)
        server_data = ClientData(-1, *to_device(shard.inputs, shard.labels, setup.device))
    chosen = cfg.server_optimizer
    optimizer = SERVER_OPTIMIZERS.get(chosen.name)(chosen.options, setup.num_params)
    tools = ServerTools(flat=flat, transform=transform, data=server_data, eval_batch_size=cfg.train.eval_batch_size,
                        optimizer=optimizer)
    if resume is None and resolved.resuming and not resolved.new:
        run.log(f"[mpifed] no checkpoint in {run.path}: starting the run from round 1")
    elif resume is not None:
        run.log(f"[mpifed] resuming {run.path} after round {resume['rounds_done']} ({resolved.resume_from})")
    traces = {kind: path for kind in ("device", "availability") if (path := manifest.trace(kind)) is not None}
    timeline = Timeline(cfg, manifest.client_sizes, costs(layouts, type(algo).forward_passes(cfg.algorithm.options)),
                        traces)
    return RoundServer(cfg, resolved.config, manifest, algo.server(tools), layouts, workers, run, resume,
                       resume_command, timeline)


def log_start(run: RunDir, cfg: config.Config, manifest: Manifest, size: int, ranks: list[dict[str, Any]],
              tracked: list[str], code: list[dict[str, Any]], verbose: bool = False) -> None:
    """The run's first lines, in log.txt and on the console: the method, the data, the mode, where
    the ranks run (one line; a line per rank in log.txt, and on the console too when ``verbose``),
    the plugins the run uses (``code``: their records), and where the run is tracked (TensorBoard,
    the ``tracked`` trackers' descriptions)."""
    mode = f"MPI, {size} ranks (1 server + {size - 1} workers)" if size > 1 else "single process (debug mode)"
    run.log(f"[mpifed] {cfg.algorithm.name} on {cfg.data.dataset.name}: {count(manifest.num_clients, 'client')}, "
            f"{count(cfg.train.rounds, 'round')}; {mode}; run directory {run.path}")
    chosen = cfg.server_optimizer
    if chosen != config.Config().server_optimizer:
        options = ", ".join(f"{key} {value}" for key, value in config.to_dict(chosen.options).items())
        run.log(f"[mpifed] server optimizer {chosen.name} ({options}): the server steps to each round's aggregate")
    if asynchronous(cfg):
        options = ", ".join(f"{key} {value}" for key, value in config.to_dict(cfg.aggregation.options).items())
        run.log(f"[mpifed] aggregation {cfg.aggregation.name} ({options}): an asynchronous server on the virtual "
                f"clock; a round is one server step")
    if size > 1:
        run.log(f"[mpifed]   {rank_summary(ranks)}" + ("" if verbose else " (log.txt and --verbose: a line per rank)"))
    for r in ranks:
        gpu = f" ({r['gpu']})" if r["gpu"] else ""
        run.log(f"[mpifed]   rank {r['rank']} ({r['role']}): host {r['host']} pid {r['pid']} device {r['device']}{gpu} "
                f"threads {r['threads']}", console=verbose or size == 1)
    for p in code:
        if p["used"]:
            run.log(f"[mpifed]   plugin {p['origin']} ({', '.join(p['provides'])}): SHA-256 {p['sha256'][:16]}..., "
                    f"copy in {run.path / p['copy']}")
    if cfg.data.test_subset and cfg.run.eval_test:
        full = manifest.test_source_size
        if full is None or manifest.test_size < full:
            of = f" of {full}" if full is not None else ""
            run.log(f"[mpifed] test set: first {manifest.test_size}{of} samples (a subset: for quick runs only)")
    if manifest.val_size:
        run.log(f"[mpifed] validation set: {manifest.val_size} training samples held out (data.val_size), "
                + ("evaluated with the test set" if cfg.run.eval_test else "evaluated alone (run.eval_test is false)"))
    if cfg.run.tensorboard:
        events = run.path / "tensorboard"
        run.log(f"[mpifed] TensorBoard events in {events}; view them with: tensorboard --logdir {events.parent.parent}")
    for tracker in tracked:
        run.log(f"[mpifed] tracking: {tracker}")


def rank_summary(ranks: list[dict[str, Any]]) -> str:
    """Where the ranks run, in one line: consecutive ranks of one role, host and thread count together,
    with their devices (``rank 0 server on a (cpu, 1 thread); ranks 1-10 workers on a (cuda:0,cuda:1,
    1 thread each)``)."""
    groups: list[tuple[str, str, int, list[int], list[str]]] = []
    for r in ranks:
        if groups and groups[-1][:3] == (r["role"], r["host"], r["threads"]):
            groups[-1][3].append(r["rank"])
            groups[-1][4].append(r["device"])
        else:
            groups.append((r["role"], r["host"], r["threads"], [r["rank"]], [r["device"]]))
    parts = []
    for role, host, threads, numbers, devices in groups:
        several = len(numbers) > 1
        span = f"ranks {numbers[0]}-{numbers[-1]} {role}s" if several else f"rank {numbers[0]} {role}"
        parts.append(f"{span} on {host} ({','.join(dict.fromkeys(devices))}, {count(threads, 'thread')}"
                     f"{' each' if several else ''})")
    return "; ".join(parts)


def announce_stop(server: RoundServer, name: str) -> None:
    """Rank 0's answer to a stop signal: what happens now, and how to continue."""
    again = f"; a second {name} ends the job at once" if name in ("SIGINT", "SIGTERM", "SIGHUP") else ""
    lost = (" If a rank has failed, mpirun ends the job at once instead, and the run continues from the "
            "last checkpoint." if name == "SIGTERM" else "")
    server.progress.write(f"[mpifed] rank 0: {handoff.describe_signal(name)}: finishing the current round, then "
                          f"writing a checkpoint and stopping{again}.{lost}{server.describe_checkpoint()}", err=True)
