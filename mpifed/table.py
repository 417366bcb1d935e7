"""Expand a table into its runs (settings x methods x seeds), tune, run them, compare the methods.

    python -m mpifed.table configs/papers/fedntd/table1.table.yaml --list
    python -m mpifed.table TABLE --tune 3                              # the search only (if the table declares one)
    python -m mpifed.table TABLE --run 3 [--set train.rounds=20 ...]   # search, then the runs; 3 ranks each (0: debug mode)
    python -m mpifed.table TABLE --run 0 --parallel 8                  # 8 runs at once (a GPU with MPS, many cores)
    python -m mpifed.table TABLE --write-runs runs.txt                 # for slurm/array.sbatch (one run per task)
    python -m mpifed.table TABLE --summary [--reference fedprox]       # the metric, and each method against the reference
    python -m mpifed.table TABLE --summary --by-seed                   # ... and every seed's value and difference
    python -m mpifed.table TABLE --archive results                      # the settled runs without weights (mpifed.archive)
    python -m mpifed.table TABLE --reuse results                        # take identical runs from another table's folder
    python -m mpifed.table TABLE --prune                                # free the disk: settled runs' checkpoints and client state
    ... --methods fedavg fedntd --seeds 0 1 --settings fmnist-shard2   # any command, on part of the table

A table file::

    title: "FedNTD Table 1, scaled"
    metric: {kind: last_k, k: 5}          # the primary metric, declared before any run: the comparisons use it
    paper_metric: {kind: final, forgetting: true}   # optional: the paper's metric, shown beside
    reference: fedavg                     # optional: the row the others are compared with (default: FedAvg's)
    claims: ["fedntd > fedavg"]           # optional: the claims the table tests, declared before any run
    settings: [fmnist-shard2.yaml]        # config files relative to the table
    methods: [methods/fedavg.yaml, methods/fedntd.yaml]
    seeds: [0, 1, 2, 3, 4]
    tuning: {grid: {train.lr: [0.01, 0.03, 0.1]}, seeds: [0], rounds: 20}   # optional, see mpifed.tuning

Each run is ``--config <setting> --config <method>`` (plus the tuned values). A setting's or
method's label is its file name without ``.yaml`` (with its folder when two share a name).
Runs go to ``runs/<folder>-<table>/<setting>-<method>-s<seed>`` when they use the table's own
configuration; a run with ``--set`` overrides that change its results goes beside it, in
``<setting>-<method>-s<seed>-<hash of its configuration>``; search runs go to ``tuning/``.
A run counts as done only when its directory holds a finished run of the same configuration;
stopped ones are resumed, so ``--run`` and array jobs can be repeated safely, and ``--summary``
reports only runs of the configuration asked for, naming those it left out.

``--summary`` gives each cell as mean ± sample std over seeds, and for each method its paired
difference from the reference over the seeds both have (runs of one seed share partition,
initial model and client sampling): the mean difference with its 95% confidence interval,
the seeds it is ahead in, and the paired t-test's p-value (:mod:`mpifed.stats`). Each declared
claim is tested the same way in every setting and labelled by its interval, with Holm's adjustment
over all of them (:mod:`mpifed.summary`).
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from mpifed import __version__, archive, config, results
from mpifed.packaged import find_config
from mpifed.pipes import quiet_when_pipe_closes
from mpifed.rundir import RunDir, RunLocked, check_run_name
from mpifed.runner import Job, diverged, run_jobs
from mpifed.summary import Claim, Summary, tabulate
from mpifed.tuning import CHOICES, Candidate, Choice, ChoiceBook, Tuning, choose, label as candidate_label, search_digest

TOP_KEYS = ("title", "settings", "methods", "seeds", "metric", "paper_metric", "reference", "claims", "tuning")


@dataclass
class TableRun:
    setting: str
    method: str
    seed: int
    configs: list[Path]
    root: Path
    name: str
    overrides: list[str] = field(default_factory=list)      # the table's own: a candidate's values, or the choice
    candidate: str | None = None                             # a search run: its candidate's label
    resolved: dict[str, Any] = field(default_factory=dict)   # its config with the overrides, as a dict
    identity: dict[str, Any] = field(default_factory=dict)   # config.result_fingerprint(resolved)

    @property
    def plain_name(self) -> str:
        middle = f"-{self.candidate}" if self.candidate is not None else ""
        return f"{self.setting}-{self.method}{middle}-s{self.seed}"

    @property
    def path(self) -> Path:
        return self.root / self.name

    def args(self, extra: list[str]) -> list[str]:
        out: list[str] = []
        for c in self.configs:
            out += ["--config", str(c)]
        return out + ["--set", f"run.seed={self.seed}", f"run.root={self.root}", f"run.name={self.name}",
                      *self.overrides, *extra, "--resume"]


@dataclass
class Table:
    title: str
    metric: results.Metric
    runs: list[TableRun]
    paper_metric: results.Metric | None = None
    reference: str | None = None
    claims: list[Claim] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    tuning: Tuning | None = None
    root: Path = Path("runs")
    search: list[TableRun] = field(default_factory=list)     # the search runs (with a tuning section)
    choices: dict[tuple[str, str], Choice] = field(default_factory=dict)
    pending: set[tuple[str, str]] = field(default_factory=set)   # (setting, method) still waiting for its search
    extra: list[str] = field(default_factory=list)
    whole: Table | None = None                                 # the table before select() kept a part

    def select(self, settings: list[str] | None, methods: list[str] | None, seeds: list[int] | None) -> None:
        """Keep only the runs of the given settings, methods and seeds (None: all), and the searches of those
        settings and methods (a search left out waits for no one); an unknown name is an error."""
        for what, asked, known in (("setting", settings, [r.setting for r in self.runs]),
                                   ("method", methods, [r.method for r in self.runs]),
                                   ("seed", seeds, [r.seed for r in self.runs])):
            unknown = [a for a in asked or [] if a not in known]
            if unknown:
                raise config.ConfigError(f"--{what}s {' '.join(map(str, unknown))}: not in this table (its {what}s: "
                                         f"{' '.join(map(str, dict.fromkeys(known)))})")

        def pair(setting: str, method: str) -> bool:
            return (settings is None or setting in settings) and (methods is None or method in methods)

        def keep(r: TableRun, search: bool) -> bool:
            return pair(r.setting, r.method) and (search or seeds is None or r.seed in seeds)
        self.whole = self.whole or copy.copy(self)
        self.runs = [r for r in self.runs if keep(r, False)]
        self.search = [r for r in self.search if keep(r, True)]
        self.pending = {p for p in self.pending if pair(*p)}
        self.choices = {p: c for p, c in self.choices.items() if pair(*p)}


# ------------------------------------------------------------------ reading a table file
def load_table(path: str | Path, runs_root: str = "runs") -> Table:
    """The table file's runs (not yet resolved: see :func:`resolve`); ConfigError names any problem."""
    path = find_config(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise config.ConfigError(f"table {path}: {exc}") from None
    if not isinstance(spec, dict):
        raise config.ConfigError(f"table {path} must be a mapping with {', '.join(TOP_KEYS[1:5])}")
    missing = {"settings", "methods", "seeds", "metric"} - set(spec)
    if missing:
        raise config.ConfigError(f"table {path} lacks {', '.join(sorted(missing))}")
    unknown = set(spec) - set(TOP_KEYS)
    if unknown:
        raise config.ConfigError(f"table {path}: unknown keys {', '.join(sorted(map(str, unknown)))}; allowed: "
                                 f"{', '.join(TOP_KEYS)}")
    try:
        metric = results.Metric.parse(spec["metric"])
        paper = results.Metric.parse(spec["paper_metric"]) if spec.get("paper_metric") is not None else None
    except results.MetricError as exc:
        raise config.ConfigError(f"table {path}: {exc}") from None
    seeds = _seeds(spec["seeds"], path)
    settings = _labels(spec["settings"], "settings", path)
    methods = _labels(spec["methods"], "methods", path)
    tuning = Tuning.parse(spec["tuning"], seeds, metric, f"table {path}") if spec.get("tuning") is not None else None
    reference = spec.get("reference")
    if reference is not None and reference not in methods.values():
        raise config.ConfigError(f"table {path}: reference {reference!r} is not one of its methods "
                                 f"({', '.join(methods.values())})")
    claims = _claims(spec.get("claims"), list(methods.values()), path)
    table = path.name.removesuffix(".table.yaml")
    root = Path(runs_root) / f"{path.parent.name}-{table}"
    runs = [TableRun(s, m, seed, [path.parent / sf, path.parent / mf], root, f"{s}-{m}-s{seed}")
            for sf, s in settings.items() for mf, m in methods.items() for seed in seeds]
    return Table(str(spec.get("title", table)), metric, runs, paper, reference, claims, seeds, tuning, root)


def _claims(spec: Any, methods: list[str], path: Path) -> list[Claim]:
    if spec is None:
        return []
    if not isinstance(spec, list) or not spec:
        raise config.ConfigError(f"table {path}: claims must be a non-empty list, e.g. claims: [\"fedgkd > fedavg\"], "
                                 f"got {spec!r}")
    claims = []
    for entry in spec:
        try:
            claim = Claim.parse(entry)
        except ValueError as exc:
            raise config.ConfigError(f"table {path}: {exc}") from None
        if claim.above not in methods or claim.below not in methods or claim.above == claim.below:
            raise config.ConfigError(f"table {path}: claim {entry!r} must compare two of its methods "
                                     f"({', '.join(methods)})")
        if claim in claims:
            raise config.ConfigError(f"table {path}: claim {entry!r} is listed more than once")
        claims.append(claim)
    return claims


def _seeds(spec: Any, path: Path) -> list[int]:
    if isinstance(spec, int) and not isinstance(spec, bool):
        raise config.ConfigError(f"table {path}: seeds must be a list, e.g. seeds: {list(range(max(spec, 1)))}")
    if not isinstance(spec, list) or not spec or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in spec):
        raise config.ConfigError(f"table {path}: seeds must be a non-empty list of whole numbers >= 0, e.g. "
                                 f"[0, 1, 2, 3, 4], got {spec!r}")
    twice = sorted({s for s in spec if spec.count(s) > 1})
    if twice:
        raise config.ConfigError(f"table {path}: seeds lists {', '.join(map(str, twice))} more than once; "
                                 f"each seed is one run")
    return list(spec)


def _labels(spec: Any, what: str, path: Path) -> dict[str, str]:
    """Each listed file -> its label: the file name without .yaml, with its folders where two share a name."""
    if not isinstance(spec, list) or not spec or not all(isinstance(f, str) for f in spec):
        raise config.ConfigError(f"table {path}: {what} must be a non-empty list of config files, e.g. "
                                 f"{what}: [a.yaml, b.yaml], got {spec!r}")
    resolved = [(path.parent / f).resolve() for f in spec]
    twice = sorted({f for f, r in zip(spec, resolved) if resolved.count(r) > 1})
    if twice:
        raise config.ConfigError(f"table {path}: {what} lists {', '.join(twice)} more than once")
    stems = [re.sub(r"\.ya?ml$", "", Path(f).name) for f in spec]
    labels = []
    for f, stem in zip(spec, stems):
        if stems.count(stem) == 1:
            labels.append(stem)
        else:
            parts = [p for p in Path(re.sub(r"\.ya?ml$", "", f)).parts if p not in ("..", ".")]
            labels.append(".".join(parts))
    for f, name in zip(spec, labels):
        if labels.count(name) > 1:
            raise config.ConfigError(f"table {path}: {what} {f} and another file both get the label {name!r}; "
                                     f"rename one of them")
        try:
            check_run_name(name)
        except ValueError:
            raise config.ConfigError(f"table {path}: {f}'s label {name!r} cannot be part of a run name (letters, "
                                     f"digits and ._+@=- only); rename the file") from None
    return dict(zip(spec, labels))


# ------------------------------------------------------------------ resolving runs and their directories
def resolve(table: Table, extra: list[str], record: bool = False) -> None:
    """Load every run's config with the overrides ``extra`` (raises ConfigError naming the first
    bad one) and pick its directory: the plain name when its configuration is the table's own
    (or the plain directory already holds it), else the plain name plus a hash of the
    configuration. With a search declared, a (setting, method) whose search has finished gets its
    choice (recorded in choices.yaml when ``record``); until then its runs are ``pending``."""
    own_keys = [k for k in _keys(extra) if k in ("run.seed", "run.name", "run.root")]
    if own_keys:
        raise config.ConfigError(f"--set {', '.join(own_keys)}: the table sets run.seed, run.name and run.root of its runs "
                                 "itself; change the table's seeds, or use --runs-root")
    if "run.eval_test" in _keys(extra):
        raise config.ConfigError("--set run.eval_test: a table's runs report the test set, and its search runs "
                                 "leave it out themselves; drop the override")
    table.extra = list(extra)
    loader = _Loader(extra)
    if table.tuning is not None:
        _resolve_search(table, extra, loader, record)
    for r in table.runs:
        choice = table.choices.get((r.setting, r.method))
        r.overrides = [f"{k}={_text(v)}" for k, v in choice.chosen.items()] if choice else []
        _place(r, loader)


class _Loader:
    """Loads configs once per (files, table overrides), with and without the user's overrides."""

    def __init__(self, extra: list[str]) -> None:
        self.extra = extra
        self.cache: dict[tuple, tuple[dict[str, Any], dict[str, Any]]] = {}

    def __call__(self, r: TableRun) -> tuple[dict[str, Any], dict[str, Any]]:
        key = (tuple(r.configs), tuple(r.overrides))
        if key not in self.cache:
            files = [str(c) for c in r.configs]
            try:
                with_extra = config.load(files, [*r.overrides, *self.extra])[1]
                own = config.load(files, list(r.overrides))[1] if self.extra else with_extra
            except config.ConfigError as exc:
                what = f" with {' '.join(r.overrides)}" if r.overrides else ""
                raise config.ConfigError(f"{r.setting} x {r.method}{what}: {exc}") from None
            self.cache[key] = (with_extra, own)
        return self.cache[key]


def _place(r: TableRun, loader: _Loader) -> None:
    d, own = loader(r)
    d, own = _with_seed(d, r.seed), _with_seed(own, r.seed)
    r.resolved = d
    r.identity = config.result_fingerprint(d)
    hashed = f"{r.plain_name}-{config.digest(r.identity)}"
    home = r.plain_name if r.identity == config.result_fingerprint(own) else hashed
    held = stored_identity(r.root / home)
    r.name = home if held is None or held == r.identity else hashed
    if not (r.path / "config.yaml").exists():
        # made under another hash (config keys added since change the digest, not the identity)
        r.name = next((p.name for p in _siblings(r) if stored_identity(p) == r.identity), r.name)


def _resolve_search(table: Table, extra: list[str], loader: _Loader, record: bool) -> None:
    tuning = table.tuning
    searched = set(tuning.grid) | {k for g in tuning.per_method.values() for k in g}
    clash = sorted({k for k in _keys(extra) for s in searched if k == s or k.startswith(s + ".") or s.startswith(k + ".")})
    if clash:
        raise config.ConfigError(f"--set {', '.join(clash)}: the table searches {'these keys' if len(clash) > 1 else 'this key'} "
                                 f"itself (its tuning section); drop the override, or edit the grid")
    pairs = list(dict.fromkeys((r.setting, r.method, tuple(r.configs)) for r in table.runs))
    methods = {m for _, m, _ in pairs}
    algorithms = {}
    for setting, method, configs in pairs:
        probe = TableRun(setting, method, tuning.seeds[0], list(configs), table.root, "")
        algorithms[(setting, method)] = loader(probe)[0]["algorithm"]["name"]
    named = set(tuning.per_method)
    unknown = named - methods - set(algorithms.values())
    if unknown:
        raise config.ConfigError(f"tuning.per_method: {', '.join(sorted(unknown))} is neither a method of the table "
                                 f"({', '.join(sorted(methods))}) nor the algorithm of one")
    if tuning.select.column.startswith("val"):
        for setting, method, configs in pairs:
            probe = TableRun(setting, method, tuning.seeds[0], list(configs), table.root, "")
            if not loader(probe)[0]["data"].get("val_size"):
                raise config.ConfigError(f"{setting} x {method}: the search chooses on the validation set "
                                         f"({tuning.select.column}) but the setting holds none; set data.val_size "
                                         f"(e.g. 2000) in {configs[0]}")
    book = ChoiceBook(table.root)
    changed = False
    table.search, table.choices, table.pending = [], {}, set()
    for setting, method, configs in pairs:
        if not tuning.keys_for(method, algorithms[(setting, method)]):
            table.choices[(setting, method)] = Choice(setting, method, "", {}, {"candidates": []})
            continue
        group: list[tuple[dict[str, Any], list[TableRun]]] = []
        for values in tuning.candidates(method, algorithms[(setting, method)]):
            runs = [TableRun(setting, method, seed, list(configs), table.root / "tuning", "",
                             tuning.overrides(values), candidate_label(values)) for seed in tuning.seeds]
            for r in runs:
                _place(r, loader)
            group.append((values, runs))
            table.search += runs
        digest = search_digest([r.identity for _, runs in group for r in runs], tuning.select)
        choice = book.find(setting, method, digest)
        if choice is None:
            candidates = [_score(values, runs, tuning) for values, runs in group]
            if all(c.failed or c.score is not None for c in candidates):
                chosen = choose(candidates, tuning.select)
                if chosen is None:
                    raise config.ConfigError(f"{setting} x {method}: every candidate of the search failed ("
                                             + "; ".join(f"{candidate_label(c.values)}: {', '.join(c.failed)}"
                                                         for c in candidates)
                                             + "); widen the grid or look at the runs' log.txt")
                choice = book.add(setting, method, digest, chosen, tuning, candidates, table.root)
                changed = True
        if choice is None:
            table.pending.add((setting, method))
        else:
            table.choices[(setting, method)] = choice
    if changed and record:
        book.save()


def _score(values: dict[str, Any], runs: list[TableRun], tuning: Tuning) -> Candidate:
    c = Candidate(values, [r.path for r in runs])
    for r in runs:
        state = status(r)
        if state == "finished":
            score = results.value(tuning.select, results.read_rows(r.path), {})
            if score is None:
                raise config.ConfigError(f"{r.path} has no {tuning.select.column} to choose by: the search selects on "
                                         f"the validation set, so the setting needs one (data.val_size)")
            c.scores.append(score)
        elif state == "failed" and diverged(r.path):
            c.failed.append(f"diverged in {r.name}")
        else:
            c.scores.append(None)
    return c


def _keys(extra: list[str]) -> list[str]:
    return [o.split("=", 1)[0].strip() for o in extra]


def _text(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()


def validate(table: Table, extra: list[str]) -> None:
    """Every run's config is valid (raises ConfigError naming the first bad one)."""
    resolve(table, extra)


def _with_seed(d: dict[str, Any], seed: int) -> dict[str, Any]:
    out = copy.deepcopy(d)
    out["run"]["seed"] = seed
    return out


def stored_identity(path: Path) -> dict[str, Any] | str | None:
    """The result fingerprint of the run in ``path``; None when it holds no run; a message when
    its config.yaml cannot be read as a valid configuration."""
    try:
        stored = yaml.safe_load((path / "config.yaml").read_text())
    except FileNotFoundError:
        return None
    except (OSError, yaml.YAMLError) as exc:
        return f"its config.yaml is unreadable ({exc})"
    try:
        return config.result_fingerprint(config.build(stored).to_dict())
    except (config.ConfigError, TypeError, AttributeError) as exc:
        return f"its config.yaml is not a valid configuration of this mpifed version ({exc})"


def status(run: TableRun) -> str:
    """The run's state as :meth:`RunDir.status` reads it (a dead ``running`` run is ``failed``);
    ``running`` or ``failed`` for a run killed or still starting before it wrote a status; ``new``
    without a run."""
    rd = RunDir(run.path)
    found = rd.status()
    if found:
        return found["state"]
    if rd.in_progress():
        return "running"
    return "failed" if rd.holds_run() else "new"


def settled(path: Path) -> bool:
    """Whether the run in ``path`` finished, or diverged (a search scores that, and running it
    again diverges again)."""
    return (RunDir(path).status() or {}).get("state") == "finished" or diverged(path)


def _siblings(run: TableRun) -> list[Path]:
    """Directories of this run's other configurations: the plain name and the hashed ones."""
    if not run.root.is_dir():
        return []
    pattern = re.compile(re.escape(run.plain_name) + r"(-[0-9a-f]{10})?")
    return sorted(p for p in run.root.iterdir() if p.is_dir() and p != run.path and pattern.fullmatch(p.name))


def _difference(held: dict[str, Any] | str, want: dict[str, Any]) -> str:
    if isinstance(held, str):
        return held
    keys = config.diff_keys(held, want)
    shown = ", ".join(f"{k}={config.lookup(held, k)!r} (here {config.lookup(want, k)!r})" for k in keys[:4])
    return f"made with {shown}" + (f" and {len(keys) - 4} more differences" if len(keys) > 4 else "")


def finished_runs(table: Table, keep: Callable[[TableRun], bool] = lambda r: True
                  ) -> tuple[dict[tuple[str, str], list[Path]], list[str], int]:
    """The finished runs of the resolved configuration (see :func:`resolve`) per (setting, method),
    of the table's runs that ``keep`` keeps; the runs left out, with why; how many were not run yet."""
    groups: dict[tuple[str, str], list[Path]] = {}
    left_out: list[str] = []
    not_run = 0
    for r in filter(keep, table.runs):
        runs = groups.setdefault((r.setting, r.method), [])
        if (r.setting, r.method) in table.pending:
            not_run += 1
            continue
        for other in _siblings(r):
            held = stored_identity(other)
            if held is not None and held != r.identity:
                left_out.append(f"{other}: {_difference(held, r.identity)}")
        state = status(r)
        if state != "finished":
            if state == "new":
                not_run += 1
            else:
                why = "diverged (its loss became NaN or infinite)" if diverged(r.path) else f"not finished ({state})"
                left_out.append(f"{r.path}: {why}")
            continue
        runs.append(r.path)
    return groups, left_out, not_run


def summarize(table: Table, reference: str | None = None) -> Summary:
    """The table in its metric from the finished runs of the resolved configuration (see
    :func:`resolve`), with each method against ``reference`` (default: the table's, else FedAvg's row)."""
    groups, left_out, not_run = finished_runs(table)
    whole = table.whole or table
    seeds = {r.seed for r in table.runs}
    family, _, _ = finished_runs(whole, lambda r: r.seed in seeds)
    title = table.title + (f" (with --set {' '.join(table.extra)})" if table.extra else "")
    return tabulate(title, table.metric, groups, left_out, not_run, paper_metric=table.paper_metric,
                    reference=reference or table.reference, declared_seeds=len(table.seeds), notes=_search_notes(table),
                    claims=table.claims, claim_settings=list(dict.fromkeys(r.setting for r in whole.runs)), family=family)


def _search_notes(table: Table) -> list[str]:
    if table.tuning is None:
        return []
    percent = "acc" in table.tuning.select.column
    lines = [f"Tuned on the validation set ({table.tuning.describe()}); each method's choice and every candidate's score:"]
    for (setting, method), choice in table.choices.items():
        lines.append(f"  {setting} x {method}: {choice.text(percent) if choice.search else 'nothing to search (no grid)'}")
    for setting, method in sorted(table.pending):
        lines.append(f"  {setting} x {method}: search not finished (python -m mpifed.table ... --tune N)")
    return lines


def summary_table(table: Table, reference: str | None = None, by_seed: bool = False) -> str:
    s = summarize(table, reference)
    return s.markdown() + (f"\n\n{s.seed_tables()}" if by_seed else "")


# ------------------------------------------------------------------ listing
def listing(table: Table, extra: list[str]) -> str:
    """Each run's status (``diverged``: failed with a NaN loss, not run again), directory and mpifed
    arguments (the search runs first); runs whose raw data is missing are marked with the folder
    they expect; the estimated time left."""
    from mpifed.data.prepared import raw_data_missing
    lines = []
    folders: set[str] = set()
    tokenizers: set[str] = set()
    count = 0
    for kind, runs in (("search", table.search), ("", table.runs)):
        for r in runs:
            if (r.setting, r.method) in table.pending and not kind:
                continue
            cfg = config.build(r.resolved)
            missing = raw_data_missing(cfg)
            mark = ""
            if missing is not None:
                count += 1
                tokenizer = cfg.data.tokenizer is not None and missing == Path(cfg.data.tokenizer)
                (tokenizers if tokenizer else folders).add(str(missing))
                mark = f"  [{'tokenizer' if tokenizer else 'raw data'} missing: expects {missing}]"
            state = "diverged" if diverged(r.path) else status(r)
            lines.append(f"{state:>9}  {kind + ' ' if kind else ''}{shlex.join(r.args(extra))}{mark}")
    waiting = [r for r in table.runs if (r.setting, r.method) in table.pending]
    if waiting:
        pairs = sorted({(r.setting, r.method) for r in waiting})
        lines.append(f"{len(waiting)} runs of {len(pairs)} setting x method pairs wait for their search to finish "
                     f"(--tune N, or --run N which searches first)")
    if folders:
        lines.append("runs lack their raw data; put it in (or point data.dataset.root at): " + ", ".join(sorted(folders)))
    if tokenizers:
        lines.append("runs lack their tokenizer folder; save the tokenizer there (docs/text.md), or point data.tokenizer "
                     "at one: " + ", ".join(sorted(tokenizers)))
    if count:
        lines.append(f"{count} of {len(table.runs) + len(table.search)} runs cannot start until then")
    eta = estimate(table)
    if eta:
        lines.append(eta)
    return "\n".join(lines)


def estimate(table: Table) -> str:
    """The time the unfinished runs will take, from the finished runs' wall times (same setting
    and method first, else all); empty when nothing finished yet or nothing is left."""
    def counts(r: TableRun) -> bool:
        return r.candidate is not None or (r.setting, r.method) not in table.pending
    walls: dict[tuple[str, str, bool], list[float]] = {}
    whole = table.whole or table
    for r in whole.search + whole.runs:
        if counts(r) and status(r) == "finished":
            wall = results.read_json(r.path / "summary.json").get("wall_time_s")
            if isinstance(wall, (int, float)):
                walls.setdefault((r.setting, r.method, r.candidate is not None), []).append(float(wall))
    left = [r for r in table.search + table.runs if counts(r) and not settled(r.path)]
    if not left or not walls:
        return ""
    overall = statistics.fmean(w for ws in walls.values() for w in ws)
    seconds = sum(statistics.fmean(walls.get((r.setting, r.method, r.candidate is not None), [overall])) for r in left)
    waiting = sum(1 for r in table.runs if (r.setting, r.method) in table.pending)
    note = f" (and {waiting} runs after the search)" if waiting else ""
    done = sum(len(ws) for ws in walls.values())
    return f"estimated time left: {_duration(seconds)} for {len(left)} runs{note}, from {done} finished runs' wall times"


def archive_table(table: Table, dest: Path, summary_command: str) -> str:
    """Copy the record of the table's settled runs, its search runs and its choices to ``dest``
    (see :mod:`mpifed.archive`); what was copied, and ``summary_command``, which summarises the copy."""
    target = dest / table.root.name
    if target.resolve() == table.root.resolve():
        raise config.ConfigError(f"--archive {dest}: that is where the table's runs are; name another folder")
    every = table.search + table.runs
    kept = [r.path for r in every if settled(r.path)]
    choices = [table.root / CHOICES] if (table.root / CHOICES).is_file() else []
    done = archive.archive_runs(kept, table.root, target, choices)
    lines = [f"archived {len(kept)} runs to {target} ({done.copied} written, {done.unchanged} already there as "
             f"they are; {done.size / 1e6:.1f} MB without their weights)"]
    if len(kept) < len(every):
        lines.append(f"{len(every) - len(kept)} runs not settled (not run, running, stopped or failed) were left out")
    lines.append(f"its summary: {summary_command}")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{max(minutes, 1)}m"


def settled_runs_under(folder: Path) -> dict[str, list[Path]]:
    """The settled runs anywhere under ``folder`` (a runs root, a table's runs, an archive), by the
    digest of their result fingerprint, in name order (hidden folders, an interrupted copy's, left out)."""
    found: dict[str, list[Path]] = {}
    for here, dirs, files in os.walk(folder):
        path = Path(here)
        if "config.yaml" not in files:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            continue
        dirs[:] = []
        held = stored_identity(path) if settled(path) else None
        if isinstance(held, dict):
            found.setdefault(config.digest(held), []).append(path)
    return found


def _evaluated_test(path: Path) -> bool:
    return any("test_acc" in row for row in results.read_rows(path))


def reuse_runs(table: Table, found: dict[str, list[Path]]) -> list[tuple[Path, TableRun]]:
    """Copy into the table, for each of its runs not made yet (search runs, and runs whose choice is
    made), the record of the first run in ``found`` (settled runs by identity) of its configuration
    (for a table run, one that evaluated the test set: not a search's); (source, run) copied."""
    copied = []
    for r in table.search + table.runs:
        if ((r.setting, r.method) in table.pending and r.candidate is None) or status(r) != "new":
            continue
        sources = found.get(config.digest(r.identity), [])
        source = next((p for p in sources if r.candidate is not None or _evaluated_test(p)), None)
        if source is not None:
            archive.copy_record(source, r.path)
            copied.append((source, r))
    return copied


# ------------------------------------------------------------------ running
def run_all(runs: list[TableRun], ranks: int, extra: list[str], again: str, parallel: int = 1) -> tuple[int, int]:
    """Run the unfinished ``runs`` (``parallel`` at a time); returns (exit code, runs skipped because
    another process is running them). A stop signal ends the table after the runs in progress
    have stopped cleanly; a failure, after they have finished."""
    todo = [r for r in runs if not settled(r.path)]
    jobs = [Job(r.path, r.args(extra), r.root / "logs" / f"{r.name}.txt" if r.candidate is None
                else r.root.parent / "logs" / "tuning" / f"{r.name}.txt") for r in todo]
    out = run_jobs(jobs, ranks, parallel, say=lambda text: print(f"[mpifed.table] {text}", flush=True))
    if out.received:
        print(f"[mpifed.table] {', '.join(dict.fromkeys(out.received))} received: the table stopped after the runs in "
              f"progress (exit code {out.code}). Continue it with:\n  {again}", file=sys.stderr, flush=True)
    elif out.failed:
        print(f"[mpifed.table] stopping after {len(out.failed)} failed run(s). Continue the table with:\n  {again}",
              file=sys.stderr, flush=True)
    return out.code, out.skipped


def _write_runs(table: Table, extra: list[str], path: str) -> str:
    if table.pending:
        runs = [r for r in table.search if status(r) != "finished"]
        Path(path).write_text("".join(shlex.join(r.args(extra)) + "\n" for r in runs))
        return (f"{len(runs)} search runs written to {path}; submit them with:\n"
                f"  sbatch --array=0-{len(runs) - 1} slurm/array.sbatch {path}\n"
                f"when they have finished, run --write-runs again: it makes the choice and writes the table's runs")
    Path(path).write_text("".join(shlex.join(r.args(extra)) + "\n" for r in table.runs))
    return (f"{len(table.runs)} runs written to {path}; submit with:\n"
            f"  sbatch --array=0-{len(table.runs) - 1} slurm/array.sbatch {path}")


def prune(table: Table) -> str:
    """Delete the checkpoints and per-client state of the table's settled runs (search runs too),
    skipping any run another process holds; what was freed."""
    freed = pruned = busy = 0
    for r in table.search + table.runs:
        if not settled(r.path):
            continue
        rd = RunDir(r.path)
        if not (rd.checkpoints.exists() or rd.client_state.exists()):
            continue
        try:
            rd.lock()
        except RunLocked:
            busy += 1
            continue
        try:
            freed += rd.drop_state()
            pruned += 1
        finally:
            rd.unlock()
    size = f"{freed / 1e9:.2f} GB" if freed >= 1e9 else f"{freed / 1e6:.1f} MB"
    return (f"freed {size}: the checkpoints and client state of {pruned} settled runs (they keep their "
            f"record and final model; they can no longer be trained further)"
            + (f"; {busy} runs held by another process were left alone" if busy else ""))


def _reuse(table: Table, a: argparse.Namespace, extra: list[str]) -> None:
    """--reuse: copy identical runs in, again after each search they complete, until none is left."""
    found: dict[str, list[Path]] = {}
    for folder in map(Path, a.reuse):
        if not folder.is_dir():
            raise config.ConfigError(f"--reuse {folder}: no such folder")
        for digest, paths in settled_runs_under(folder).items():
            found.setdefault(digest, []).extend(paths)
    reused = 0
    while copied := reuse_runs(table, found):
        for source, r in copied:
            print(f"[mpifed.table] reused {source} as {r.path}", flush=True)
        reused += len(copied)
        table = load_table(a.table, a.runs_root)
        resolve(table, extra, record=True)
        table.select(a.settings, a.methods, a.seeds)
    left = sum(not settled(r.path) for r in table.search + table.runs)
    waiting = sum((r.setting, r.method) in table.pending for r in table.runs)
    print(f"[mpifed.table] {reused} runs reused from {', '.join(a.reuse)}; {left} of the table's runs still to make"
          + (f", {waiting} of them after their search" if waiting else "") + " (--list shows them)")


@quiet_when_pipe_closes
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m mpifed.table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", help="the table file (*.table.yaml); a configs/... path also finds the tables shipped with mpifed")
    p.add_argument("--runs-root", default="runs", help="folder that holds the table's run folder (default: runs)")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="added to every run; runs with other results go to their own directories")
    p.add_argument("--settings", nargs="+", metavar="LABEL", help="only these settings (their labels, as --list shows them)")
    p.add_argument("--methods", nargs="+", metavar="LABEL", help="only these methods")
    p.add_argument("--seeds", nargs="+", type=int, metavar="SEED", help="only these seeds (the search keeps its own)")
    p.add_argument("--reference", metavar="LABEL", help="--summary: compare every method with this one "
                   "(default: the table's reference, else the FedAvg row)")
    p.add_argument("--by-seed", action="store_true", help="--summary: also each method's metric seed by seed, "
                   "and its difference from the reference on each seed")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--list", action="store_true", help="print each run's status and mpifed arguments; mark missing raw data")
    g.add_argument("--write-runs", metavar="FILE", help="one line of mpifed arguments per run (for slurm/array.sbatch): "
                   "the search runs while a search is unfinished, then the table's runs")
    g.add_argument("--tune", type=int, metavar="N", help="run the search here (N ranks each, 0: debug mode) and record the choice")
    g.add_argument("--run", type=int, metavar="N", help="run here, one after another, with N ranks each (0: debug mode); "
                   "a declared search runs first")
    g.add_argument("--summary", action="store_true", help="the table in its metric, and each method against the reference")
    g.add_argument("--archive", metavar="FOLDER", help="copy the settled runs (finished or diverged, the search's "
                   "too) without their weights to FOLDER/<table folder>, for a repository; --runs-root FOLDER reads them")
    g.add_argument("--reuse", metavar="FOLDER", nargs="+", help="copy into the table the records of the settled runs "
                   "under FOLDER (another table's runs, an archive) whose configuration is one of this table's runs "
                   "(the search's too), instead of making them again")
    g.add_argument("--prune", action="store_true", help="delete the checkpoints and per-client state of the settled "
                   "runs (finished or diverged), keeping their record and final model: gigabytes a run for methods "
                   "with per-client state over many clients (FedCurv, SCAFFOLD, MOON)")
    p.add_argument("--parallel", type=int, default=1, metavar="P", help="--run/--tune: P runs at once (a GPU, or a "
                   "machine with cores to spare; each run's output goes to <table runs>/logs/)")
    a = p.parse_args(argv)
    if a.parallel < 1:
        p.error("--parallel must be at least 1")
    if a.by_seed and not a.summary:
        p.error("--by-seed goes with --summary")
    extra = [o for group in a.set for o in group]
    again = shlex.join(["python", "-m", "mpifed.table", *argv])
    try:
        table = load_table(a.table, a.runs_root)
        if a.reference is not None and a.reference not in {r.method for r in table.runs}:
            raise config.ConfigError(f"--reference {a.reference}: not a method of this table "
                                     f"({', '.join(dict.fromkeys(r.method for r in table.runs))})")
        if (a.tune is not None) and table.tuning is None:
            raise config.ConfigError(f"--tune: {a.table} declares no search (a tuning section)")
        record = a.tune is not None or a.run is not None or a.write_runs is not None or a.reuse is not None
        resolve(table, extra, record=record)
        table.select(a.settings, a.methods, a.seeds)
    except config.ConfigError as exc:
        print(f"[mpifed.table] {exc}", file=sys.stderr)
        return 2
    if a.list:
        print(listing(table, extra))
        return 0
    if a.write_runs:
        print(_write_runs(table, extra, a.write_runs))
        return 0
    if a.summary:
        print(summary_table(table, a.reference, a.by_seed))
        return 0
    if a.archive:
        try:
            filters = [w for flag, v in (("--settings", a.settings), ("--methods", a.methods), ("--seeds", a.seeds)) if v
                       for w in (flag, *map(str, v))]
            summary = shlex.join(["python", "-m", "mpifed.table", a.table, "--runs-root", a.archive, *filters, "--summary"])
            print(archive_table(table, Path(a.archive), summary))
        except (config.ConfigError, OSError) as exc:
            print(f"[mpifed.table] {exc}", file=sys.stderr)
            return 2
        return 0
    if a.prune:
        print(prune(table))
        return 0
    if a.reuse:
        try:
            _reuse(table, a, extra)
        except (config.ConfigError, OSError) as exc:
            print(f"[mpifed.table] {exc}", file=sys.stderr)
            return 2
        return 0
    ranks = a.tune if a.tune is not None else a.run
    skipped = 0
    if table.tuning is not None and (table.pending or a.tune is not None):
        code, skipped = run_all(table.search, ranks, extra, again, a.parallel)
        if code != 0:
            return code
        try:
            kept = (a.settings, a.methods, a.seeds)
            table = load_table(a.table, a.runs_root)
            resolve(table, extra, record=True)
            table.select(*kept)
        except config.ConfigError as exc:
            print(f"[mpifed.table] {exc}", file=sys.stderr)
            return 2
        for line in _search_notes(table):
            print(f"[mpifed.table] {line}", flush=True)
        if a.tune is not None or table.pending:
            if skipped:
                print(f"[mpifed.table] {skipped} search runs are running elsewhere; the choice is made once they finish",
                      flush=True)
            return 0
    code, more = run_all(table.runs, ranks, extra, again, a.parallel)
    skipped += more
    if code != 0:
        return code
    if skipped:
        print(f"[mpifed.table] {skipped} runs were skipped because other processes are running them; --summary "
              f"counts them once they finish", flush=True)
    print(summary_table(table, a.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
