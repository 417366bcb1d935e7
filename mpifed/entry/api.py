"""mpifed from Python (a notebook, a script): run an experiment, open a run, load its model, read its
metrics and a table's summary. The names in ``__all__`` are the stable API; docs/api.md has a
worked example.

    from mpifed.entry import api
    run = api.run("configs/quickstart.yaml", {"train.rounds": 5}, plugins=["my_method.py"])
    run.summary["final_test_acc"], run.metrics()[-1]["test_acc"]
    model, transform = run.model()              # a torch.nn.Module in eval mode, and its input transform
    api.evaluate_run(run.path)["test_acc"]      # = the accuracy the run recorded
    print(api.table_summary("my.table.yaml").markdown())

A run started here is the debug mode (one process, the results of any MPI run of the same
configuration), with the command line's behaviour: its directory, records, checkpoints and
resume are the same.
"""
from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import yaml

from mpifed.settings import config
from mpifed.tables import trained
from mpifed.plugin.options import ConfigError
from mpifed.run.record import RunRecord
from mpifed.run.rundir import RunDir, claim_new, default_run_name
from mpifed.run.state import RunState
from mpifed.tables.summary import Summary

ConfigLike = str | Path | Mapping[str, Any]


__all__ = ["ConfigError", "Model", "MpifedError", "Run", "evaluate_run", "load_model", "metrics", "open_run", "run",
           "table_summary"]


class MpifedError(RuntimeError):
    """A run that did not finish or stop cleanly, with the message the command line prints (a bad
    configuration is a :class:`ConfigError` before anything starts)."""


class Model(NamedTuple):
    """A run's trained network (eval mode) and the transform its inputs need: ``model(transform(x))``
    with ``x`` as the data set stores its inputs (uint8 images, N x C x H x W, or token ids)."""

    module: Any
    transform: Callable[[Any], Any]


@dataclass(frozen=True)
class Run:
    """A run directory: its configuration, state, summary and metrics, and its trained model
    (``trust_run_code``: see :func:`load_model`)."""

    path: Path
    trust_run_code: bool = False

    @property
    def config(self) -> dict[str, Any]:
        """The resolved configuration (config.yaml)."""
        return RunRecord(self.path).config

    @property
    def status(self) -> RunState | None:
        """running, stopped, finished, failed (a run whose processes died reads as failed), diverged (failed: its
        loss became NaN or infinite) or damaged (finished, its metrics.jsonl cut short: resume it to write it
        again); None before it starts. A :class:`~mpifed.run.state.RunState`: it compares equal to its string."""
        return RunRecord(self.path).state

    @property
    def summary(self) -> dict[str, Any]:
        """summary.json: final and best accuracy, forgetting, timing (empty until the run stops or finishes)."""
        return RunRecord(self.path).summary

    def metrics(self) -> list[dict[str, Any]]:
        """One dict per round (metrics.jsonl): lr, train_loss, and test_acc, test_loss, per_class_acc ... where
        evaluated."""
        return RunRecord(self.path).metrics()

    def model(self, device: str = "cpu") -> Model:
        """The trained network and its input transform (see :func:`load_model`)."""
        return load_model(self.path, device, trust_run_code=self.trust_run_code)

    def evaluate(self, data: str = "test", overrides: Sequence[str] = ()) -> dict[str, Any]:
        """The trained model's figures on ``data`` (see :func:`evaluate_run`)."""
        return evaluate_run(self.path, data, overrides, trust_run_code=self.trust_run_code)

    @property
    def class_names(self) -> list[str]:
        """The classes in label order: their names where the data set has them, else their numbers."""
        return _trained(self.path, "cpu", self.trust_run_code).class_names


def run(config_files: ConfigLike | Sequence[ConfigLike] | None = None,
        overrides: Mapping[str, Any] | Sequence[str] = (), *, plugins: Sequence[str] = (), name: str | None = None,
        root: str | Path | None = None, resume: bool = False, overwrite: bool = False, quiet: bool = False,
        trust_run_code: bool = False, trust_changed_code: bool = False) -> Run:
    """Run an experiment in this process and return its run directory.

    ``config_files``: config files (paths) and mappings (read like a file; a mapping's file paths,
    ``plugins`` among them, are relative to the current folder), later ones over earlier ones;
    none: the quick start. ``overrides``: ``{"train.rounds": 5}`` or ``["train.rounds=5"]``, as
    ``--set``. ``plugins``: files or modules of your own, as ``--plugin``. ``name`` and ``root``:
    the run directory ``root/name`` (default: run.root and run.name, else a new
    ``<config>-<date>-<time>``). ``resume``: continue that run (more rounds with a larger
    ``train.rounds``). ``quiet``: print nothing but errors. ``trust_run_code``: with ``resume``, run
    the code from outside mpifed that the run records without it being in ``plugins`` (as
    ``--trust-run-code``); ``trust_changed_code``: with ``resume``, continue with a plugin's code changed
    since the run started, a fix (as ``--trust-changed-code``). A run stopped by Ctrl-C is returned
    too (``status`` says stopped); any other failure raises :class:`MpifedError` with its message.
    """
    from mpifed.entry.main import main
    given = [] if config_files is None else (
        [config_files] if isinstance(config_files, (str, Path, Mapping)) else list(config_files))
    files = [str(c) for c in given if not isinstance(c, Mapping)]
    sets = [o for c in given if isinstance(c, Mapping) for o in _as_overrides(c)] + (
        _as_overrides(overrides) if isinstance(overrides, Mapping) else list(overrides))
    if root is not None:
        sets.append(f"run.root={root}")
    if name is not None:
        sets.append(f"run.name={name}")
    cfg, _ = config.load(files, sets, plugins=list(plugins))
    if cfg.run.name is None:
        if resume:
            raise MpifedError("resume=True continues the run named by name= (or run.name); give it")
        stem = Path(files[-1]).stem if files else "quickstart"
        sets.append(f"run.name={claim_new(Path(cfg.run.root), default_run_name(stem)).name}")
        cfg, _ = config.load(files, sets, plugins=list(plugins))
    path = Path(cfg.run.root) / str(cfg.run.name)
    argv = [w for p in plugins for w in ("--plugin", str(p))] + [w for f in files for w in ("--config", f)]
    argv += (["--set", *sets] if sets else []) + (["--resume", str(path)] if resume else [])
    argv += ["--overwrite"] if overwrite else []
    argv += ["--trust-run-code"] if trust_run_code else []
    argv += ["--trust-changed-code"] if trust_changed_code else []
    import torch
    threads = torch.get_num_threads()
    errors = io.StringIO()
    out = io.StringIO() if quiet else sys.stdout
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(_Tee(errors, sys.stderr)):
            code = main(argv)
    finally:
        torch.set_num_threads(threads)
    if code not in (0, 75):
        said = [line for line in errors.getvalue().splitlines() if line.startswith("[mpifed] ")]
        raise MpifedError(said[-1].removeprefix("[mpifed] ").removeprefix("rank 0: ") if said
                          else f"the run ended with exit code {code}: {errors.getvalue().strip()}")
    return Run(path)


def open_run(path: str | Path, *, trust_run_code: bool = False) -> Run:
    """The run in the directory ``path`` (made by any mpifed command); ``trust_run_code``: see
    :func:`load_model`."""
    found = Path(path)
    if not RunDir(found).holds_run():
        raise MpifedError(f"{found}: no run there (no config.yaml); give a run directory, e.g. runs/<name>")
    return Run(found, trust_run_code)


def load_model(path: str | Path, device: str = "cpu", *, trust_run_code: bool = False) -> Model:
    """The trained network of the run in ``path`` (a ``torch.nn.Module`` in eval mode, with model.pt's
    weights, built by the run's own code) and the transform its inputs need (the run's normalisation).

    A run made with code of your own (a plugin) is rebuilt with that code when it is loaded in this
    process already (``api.run``'s ``plugins``, an installed package), or, with ``trust_run_code``,
    from the run's record; otherwise a ConfigError says which code the run needs and loads none."""
    found = _trained(path, device, trust_run_code)
    return Model(found.module, found.transform)


def evaluate_run(path: str | Path, data: str = "test", overrides: Sequence[str] = (), *,
                 trust_run_code: bool = False) -> dict[str, Any]:
    """The figures of the run's trained model on ``data``: ``"test"`` (its test set: test_acc,
    test_loss, per_class_acc; test_acc is the run's recorded final_test_acc), ``"val"`` (its
    validation set), or a config file whose data set replaces the run's (``overrides`` on top);
    ``trust_run_code``: see :func:`load_model`."""
    return trained.evaluate(_trained(path, "cpu", trust_run_code), data, list(overrides))


def _trained(path: str | Path, device: str, trust: bool) -> trained.Trained:
    return trained.load(path, device, trust, allow="pass trust_run_code=True, or load the same code first (api.run's "
                                                  "plugins=, or its installed package)")


def metrics(path: str | Path) -> list[dict[str, Any]]:
    """The run's metrics, one dict per round (see :meth:`Run.metrics`)."""
    return open_run(path).metrics()


def table_summary(table: str | Path, runs_root: str | Path = "runs", *, overrides: Sequence[str] = (),
                  plugins: Sequence[str] = (), reference: str | None = None, diverged: float | str | None = None,
                  settings: Sequence[str] | None = None, methods: Sequence[str] | None = None,
                  seeds: Sequence[int] | None = None) -> Summary:
    """A table's summary, as ``python -m mpifed.table TABLE --summary`` computes it, from the finished
    runs under ``runs_root``: ``.markdown()`` prints it; ``.cells[(setting, method, column)]`` holds
    each cell's values (``.mean``, ``.std``, ``.n``), ``.paired[(setting, method)]`` each method's
    paired difference from the reference (``.mean``, ``.low``, ``.high``, ``.p``), ``.claims`` the
    declared claims with their Holm-adjusted p and label, ``.by_seed`` the metric per seed."""
    from mpifed.tables.summarize import summarize
    from mpifed.tables.table_file import load_table, resolve
    loaded = load_table(table, str(runs_root), list(plugins))
    resolve(loaded, list(overrides))
    loaded.select(list(settings) if settings else None, list(methods) if methods else None,
                  list(seeds) if seeds else None)
    return summarize(loaded, reference, diverged)


def _as_overrides(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """A mapping as ``--set`` overrides: nested mappings flattened to dotted keys."""
    out = []
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out += _as_overrides(value, f"{dotted}.")
        elif isinstance(value, str):
            out.append(f"{dotted}={value}")
        else:
            text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
            out.append(f"{dotted}={text.removesuffix('...').strip()}")
    return out


class _Tee(io.TextIOBase):
    """Writes to two streams: the caller's stderr, and a buffer the error message is read from."""

    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()
