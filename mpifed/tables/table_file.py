"""A table file (``*.table.yaml``, see :mod:`mpifed.entry.table`) read and resolved into its runs:
settings x methods x seeds, the search's candidates and choices, each run's configuration,
directory and state, and the finished runs a summary uses."""
from __future__ import annotations

import copy
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import yaml

from mpifed.settings import config, plugins as plugin_code
from mpifed.run import provenance, results
from mpifed.files import safe_yaml
from mpifed.files.packaged import find_config
from mpifed.plugin.registry import nearest
from mpifed.run.rundir import CONFIG, RunDir, check_run_name
from mpifed.run.state import RunState
from mpifed.tables.summary import Claim
from mpifed.tables.tuning import (Candidate, SearchChoice, ChoiceBook, Tuning, choose, label as candidate_label,
                                  score_candidate, search_digest)

TOP_KEYS = ("title", "plugins", "settings", "methods", "seeds", "metric", "paper_metric", "reference", "claims",
            "claim_seeds", "not_a_test", "paper_local_steps", "tuning", "diverged")


@dataclass
class TableRun:
    """One run of a table (a setting x method x seed), or of its search (with the candidate's
    values): its config files, overrides, resolved configuration and directory."""

    setting: str
    method: str
    seed: int
    configs: list[Path]
    root: Path
    name: str
    overrides: list[str] = field(default_factory=list)      # the table's own: a candidate's values, or the choice
    candidate: str | None = None                             # a search run: its candidate's label
    plugins: list[str] = field(default_factory=list)         # the table's plugins (--plugin of every run)
    resolved: dict[str, Any] = field(default_factory=dict)   # its config with the overrides, as a dict
    identity: dict[str, Any] = field(default_factory=dict)   # config.result_fingerprint(resolved)
    point: list[str] = field(default_factory=list)           # a sweep's run: its point's values (before overrides)

    @property
    def plain_name(self) -> str:
        middle = f"-{self.candidate}" if self.candidate is not None else ""
        return f"{self.setting}-{self.method}{middle}-s{self.seed}"

    @property
    def path(self) -> Path:
        return self.root / self.name

    def args(self, added: list[str]) -> list[str]:
        out: list[str] = [w for p in self.plugins for w in ("--plugin", p)]
        for c in self.configs:
            out += ["--config", str(c)]
        return out + ["--set", f"run.seed={self.seed}", f"run.root={self.root}", f"run.name={self.name}",
                      f"run.group={self.group}", *self.overrides, *added, "--resume"]

    @property
    def group(self) -> str:
        """The trackers' group: the table's run folder (``-tuning`` for its search runs)."""
        return f"{self.root.parent.name}-tuning" if self.candidate is not None else self.root.name


@dataclass
class Table:
    """A table file's declarations, its runs and search runs (configured by :func:`resolve`), and
    the choices its finished search made."""

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
    choices: dict[tuple[str, str], SearchChoice] = field(default_factory=dict)
    pending: set[tuple[str, str]] = field(default_factory=set)   # (setting, method) still waiting for its search
    searching: dict[tuple[str, str],
                    list[Candidate]] = field(default_factory=dict)   # a pending pair's candidates so far
    added: list[str] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)          # loaded before its configs: its own and --plugin's
    whole: Table | None = None                                 # the table before select() kept a part
    diverged_value: float | None = None   # the primary metric's value a diverged final run counts as (None: left out)
    claim_seeds: int | None = None        # the seeds its claims need, as declared (None: not declared)
    not_a_test: dict[str, str] = field(default_factory=dict)   # settings whose claims test nothing: why
    paper_local_steps: dict[str, float] | None = None   # the paper's local steps per client a round, by setting

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
            if search and self.tuning is not None and self.tuning.setting is not None:   # it serves every setting
                return methods is None or r.method in methods
            return pair(r.setting, r.method) and (search or seeds is None or r.seed in seeds)
        self.whole = self.whole or copy.copy(self)
        self.runs = [r for r in self.runs if keep(r, False)]
        self.search = [r for r in self.search if keep(r, True)]
        self.pending = {p for p in self.pending if pair(*p)}
        self.searching = {p: c for p, c in self.searching.items() if pair(*p)}
        self.choices = {p: c for p, c in self.choices.items() if pair(*p)}


# ------------------------------------------------------------------ reading a table file
def load_table(path: str | Path, runs_root: str = "runs", plugins: list[str] | None = None) -> Table:
    """The table file's runs (not yet resolved: see :func:`resolve`), with its plugins loaded (the
    command line's ``plugins``, relative to the current folder, then the table's own, relative to the
    table file); ConfigError names any problem."""
    path = find_config(path)
    try:
        spec = safe_yaml.read(path, f"table {path}")
    except safe_yaml.YamlRefused as exc:
        raise config.ConfigError(str(exc)) from None
    except (OSError, yaml.YAMLError) as exc:
        raise config.ConfigError(f"table {path}: {exc}") from None
    if not isinstance(spec, dict):
        raise config.ConfigError(f"table {path} must be a mapping with {', '.join(TOP_KEYS[2:6])}")
    specs = list(dict.fromkeys(config.plugin_specs(list(plugins or []), "--plugin", None)
                               + config.plugin_specs(spec.get("plugins"), f"table {path}", path.parent)))
    for plugin in specs:
        plugin_code.load(plugin)
    missing = {"settings", "methods", "seeds", "metric"} - set(spec)
    if missing:
        raise config.ConfigError(f"table {path} lacks {', '.join(sorted(missing))}")
    lines = {keys[0]: line for keys, line in safe_yaml.key_lines(safe_yaml.read_text(path, f"table {path}")).items()
             if len(keys) == 1}
    unknown = [k for k in spec if k not in TOP_KEYS]
    if unknown:
        key = unknown[0]
        close = nearest(key, TOP_KEYS)
        raise config.ConfigError(f"table {path}, line {lines.get(str(key), '?')}: unknown key {key!r}"
                                 + (f"; did you mean {close!r}?" if close else "") + f" Allowed: {', '.join(TOP_KEYS)}")

    def at(key: str) -> ContextManager[None]:
        return _located(path, lines, key)
    with at("metric"):
        metric = _metric(spec["metric"], path)
    with at("paper_metric"):
        paper = _metric(spec["paper_metric"], path) if spec.get("paper_metric") is not None else None
    with at("seeds"):
        seeds = _seeds(spec["seeds"], path)
    with at("settings"):
        settings = _labels(spec["settings"], "settings", path)
    with at("methods"):
        methods = _labels(spec["methods"], "methods", path)
    with at("tuning"):
        tuning = Tuning.parse(spec["tuning"], seeds, metric, f"table {path}") if spec.get("tuning") is not None \
            else None
    if tuning is not None and tuning.setting is not None and tuning.setting not in settings.values():
        raise config.ConfigError(f"table {path}, line {lines.get('tuning', '?')}: tuning.setting {tuning.setting!r} "
                                 f"is not one of its settings ({', '.join(settings.values())})")
    reference = spec.get("reference")
    if reference is not None and reference not in methods.values():
        close = nearest(reference, methods.values())
        raise config.ConfigError(f"table {path}, line {lines.get('reference', '?')}: reference {reference!r} is not "
                                 f"one of its methods ({', '.join(methods.values())})"
                                 + (f"; did you mean {close!r}?" if close else ""))
    with at("claims"):
        claims = _claims(spec.get("claims"), list(methods.values()), path)
    with at("claim_seeds"):
        claim_seeds = _claim_seeds(spec.get("claim_seeds"), claims, seeds, path)
    with at("not_a_test"):
        not_a_test = _not_a_test(spec.get("not_a_test"), claims, list(settings.values()), path)
    with at("paper_local_steps"):
        paper_steps = _paper_local_steps(spec.get("paper_local_steps"), list(settings.values()), path)
    counted = spec.get("diverged")
    if counted is not None and (isinstance(counted, bool) or not isinstance(counted, (int, float))
                                or not math.isfinite(counted)):
        raise config.ConfigError(f"table {path}, line {lines.get('diverged', '?')}: diverged is the value a diverged "
                                 f"run counts as in the primary metric, in the unit the summary shows (e.g. diverged: "
                                 f"10.0 for chance on ten classes, in points), got {counted!r}; leave it out to leave "
                                 f"such runs out")
    table = path.name.removesuffix(".table.yaml")
    root = Path(runs_root) / f"{path.resolve().parent.name}-{table}"   # however the path is spelled
    runs = [TableRun(s, m, seed, [path.parent / sf, path.parent / mf], root, f"{s}-{m}-s{seed}", plugins=specs)
            for sf, s in settings.items() for mf, m in methods.items() for seed in seeds]
    return Table(str(spec.get("title", table)), metric, runs, paper, reference, claims, seeds, tuning, root,
                 diverged_value=None if counted is None else float(counted), plugins=specs, claim_seeds=claim_seeds,
                 paper_local_steps=paper_steps, not_a_test=not_a_test)


@contextmanager
def _located(path: Path, lines: dict[str, int], key: str) -> Iterator[None]:
    """A ConfigError raised while reading the table's ``key`` names the line the key is on."""
    try:
        yield
    except config.ConfigError as exc:
        text, head = str(exc), f"table {path}:"
        if key in lines and text.startswith(head):
            raise config.ConfigError(f"table {path}, line {lines[key]}:{text[len(head):]}") from None
        raise


def _metric(spec: Any, path: Path) -> results.Metric:
    try:
        return results.Metric.parse(spec)
    except results.MetricError as exc:
        raise config.ConfigError(f"table {path}: {exc}") from None


def _paper_local_steps(spec: Any, settings: list[str], path: Path) -> dict[str, float] | None:
    """``paper_local_steps``: the paper's local steps per client a round (epochs x samples / batch),
    one number for every setting or a mapping by setting label; ``*`` stands for every setting."""
    if spec is None:
        return None
    given = spec if isinstance(spec, dict) else {"*": spec}
    unknown = set(given) - set(settings) - {"*"}
    if unknown:
        raise config.ConfigError(f"table {path}: paper_local_steps names {', '.join(sorted(map(str, unknown)))}, "
                                 f"which are not its settings ({', '.join(settings)})")
    for label, v in given.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise config.ConfigError(f"table {path}: paper_local_steps is the paper's local steps per client a "
                                     f"round (epochs x samples per client / batch size, e.g. 5 x 500 / 50 = 50), "
                                     f"a number > 0 or a mapping of them by setting; got {label}: {v!r}")
    return {str(k): float(v) for k, v in given.items()}


def _claim_seeds(spec: Any, claims: list[Claim], seeds: list[int], path: Path) -> int | None:
    """``claim_seeds``: the paired seeds each claim needs before it is tested (at least 2, and no more
    than the table's seeds)."""
    if spec is None:
        return None
    if isinstance(spec, bool) or not isinstance(spec, int) or spec < 2:
        raise config.ConfigError(f"table {path}: claim_seeds is the number of paired seeds each claim needs, a whole "
                                 f"number >= 2 (6 is the fewest whose exact sign-flip p can go below 0.05), "
                                 f"got {spec!r}")
    if not claims:
        raise config.ConfigError(f"table {path}: claim_seeds is declared but the table declares no claims")
    if spec > len(seeds):
        raise config.ConfigError(f"table {path}: its claims need {spec} seeds (claim_seeds) but it lists "
                                 f"{len(seeds)}: add seeds, or lower claim_seeds")
    return spec


def _not_a_test(spec: Any, claims: list[Claim], settings: list[str], path: Path) -> dict[str, str]:
    """``not_a_test``: settings whose claims test nothing of what they state (say, a method that
    reduces to its reference there), each with why. Their claims stay in the Holm family, as
    declared (the stricter choice), and are labelled ``not a test`` instead of counted."""
    if spec is None:
        return {}
    if not claims:
        raise config.ConfigError(f"table {path}: not_a_test marks settings whose claims test nothing, but the table "
                                 f"declares no claims")
    if not isinstance(spec, dict) or not spec:
        raise config.ConfigError(f"table {path}: not_a_test maps settings to why their claims test nothing, e.g. "
                                 f"not_a_test: {{e1: 'one local step: the method reduces to FedAvg'}}, got {spec!r}")
    unknown = [str(k) for k in spec if k not in settings]
    if unknown:
        raise config.ConfigError(f"table {path}: not_a_test names {', '.join(unknown)}, which are not its settings "
                                 f"({', '.join(settings)})")
    bare = [str(k) for k, why in spec.items() if not isinstance(why, str) or not why.strip()]
    if bare:
        raise config.ConfigError(f"table {path}: not_a_test: say why the claims of {', '.join(bare)} test nothing "
                                 f"(a sentence), and when that was decided")
    return {str(k): " ".join(v.split()) for k, v in spec.items()}


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
    whole = isinstance(spec, list) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in spec)
    if not whole or not spec:
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
def resolve(table: Table, added: list[str], record: bool = False) -> None:
    """Load every run's config with the overrides ``added`` (raises ConfigError naming the first
    bad one) and pick its directory: the plain name when its configuration is the table's own
    (or the plain directory already holds it), else the plain name plus a hash of the
    configuration. With a search declared, a (setting, method) whose search has finished gets its
    choice (recorded in choices.yaml when ``record``); until then its runs are ``pending``."""
    own_keys = [k for k in _keys(added) if k in ("run.seed", "run.name", "run.root", "run.group")]
    if own_keys:
        raise config.ConfigError(f"--set {', '.join(own_keys)}: the table sets run.seed, run.name, run.root and "
                                 "run.group of its runs itself; change the table's seeds, or use --runs-root")
    if "run.eval_test" in _keys(added):
        raise config.ConfigError("--set run.eval_test: a table's runs report the test set, and its search runs "
                                 "leave it out themselves; drop the override")
    table.added = list(added)
    loader = _Loader(added)
    if table.tuning is not None:
        _resolve_search(table, added, loader, record)
    for r in table.runs:
        choice = table.choices.get((r.setting, r.method))
        r.overrides = r.point + ([f"{k}={_text(v)}" for k, v in choice.chosen.items()] if choice else [])
        _place(r, loader)


class _Loader:
    """Loads configs once per (files, table overrides), with and without the user's overrides."""

    def __init__(self, added: list[str]) -> None:
        self.added = added
        self.cache: dict[tuple, tuple[dict[str, Any], dict[str, Any]]] = {}

    def __call__(self, r: TableRun) -> tuple[dict[str, Any], dict[str, Any]]:
        key = (tuple(r.configs), tuple(r.overrides))
        if key not in self.cache:
            files = [str(c) for c in r.configs]
            try:
                with_added = config.load(files, [*r.overrides, *self.added], plugins=r.plugins)[1]
                own = config.load(files, list(r.overrides), plugins=r.plugins)[1] if self.added else with_added
            except config.ConfigError as exc:
                what = f" with {' '.join(r.overrides)}" if r.overrides else ""
                raise config.ConfigError(f"{r.setting} x {r.method}{what}: {exc}") from None
            self.cache[key] = (with_added, own)
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
    if not (r.path / CONFIG).exists():
        # made under another hash (config keys added since change the digest, not the identity)
        r.name = next((p.name for p in _siblings(r) if stored_identity(p) == r.identity), r.name)


def _resolve_search(table: Table, added: list[str], loader: _Loader, record: bool) -> None:
    """The table's search: its runs placed, each (setting, method)'s choice found in the book or made
    once every candidate has settled, else the pair left pending with its candidates so far."""
    tuning = table.tuning
    _check_overrides(tuning, added)
    pairs = list(dict.fromkeys((r.setting, r.method, tuple(r.configs)) for r in table.runs
                               if tuning.setting in (None, r.setting)))
    probes = {(setting, method): loader(TableRun(setting, method, tuning.seeds[0], list(configs), table.root, "",
                                                 plugins=table.plugins))[0]
              for setting, method, configs in pairs}
    algorithms = {pair: probe["algorithm"]["name"] for pair, probe in probes.items()}
    _check_per_method(tuning, {m for _, m, _ in pairs}, set(algorithms.values()))
    if tuning.select.column.startswith("val"):
        for setting, method, configs in pairs:
            if not probes[(setting, method)]["data"].get("val_size"):
                raise config.ConfigError(f"{setting} x {method}: the search chooses on the validation set "
                                         f"({tuning.select.column}) but the setting holds none; set data.val_size "
                                         f"(e.g. 2000) in {configs[0]}")
    book = ChoiceBook(table.root)
    changed = False
    table.search, table.choices, table.pending, table.searching = [], {}, set(), {}
    for setting, method, configs in pairs:
        algorithm = algorithms[(setting, method)]
        if not tuning.keys_for(method, algorithm):
            table.choices[(setting, method)] = SearchChoice(setting, method, "", {}, {"candidates": []})
            continue
        grid, extended = tuning.keys_for(method, algorithm), []
        # A choice at an end of a key under tuning.extend grows the grid and searches on, a choice
        # recorded before the table declared tuning.extend too.
        while True:
            group = _candidate_runs(table, setting, method, list(configs), loader, grid)
            digest = search_digest([r.identity for _, runs in group for r in runs], tuning.select)
            choice = book.find(setting, method, digest)
            if choice is not None:
                chosen = choice.chosen
            else:
                candidates = [score_candidate(values, [(r.path, status(r)) for r in runs], tuning.select)
                              for values, runs in group]
                chosen = _chosen(setting, method, candidates, tuning)
                if chosen is None:
                    break
            grid, added = tuning.extended(grid, chosen)
            if not added:
                if choice is None:
                    choice = book.add(setting, method, digest, chosen, tuning, candidates, table.root, extended)
                    changed = True
                break
            choice = None
            extended += added
        table.search += [r for _, runs in group for r in runs]
        if choice is None:
            table.pending.add((setting, method))
            table.searching[(setting, method)] = candidates
            continue
        table.choices[(setting, method)] = choice
    if tuning.setting is not None:     # every other setting takes the choice made on tuning.setting
        for r in table.runs:
            searched = (tuning.setting, r.method)
            if searched in table.pending:
                table.pending.add((r.setting, r.method))
            elif searched in table.choices:
                table.choices[(r.setting, r.method)] = table.choices[searched]
    if changed and record:
        book.save()


def _check_overrides(tuning: Tuning, added: list[str]) -> None:
    """A ``--set`` of a key the search itself varies is refused."""
    searched = set(tuning.grid) | {k for g in tuning.per_method.values() for k in g}
    clash = sorted({k for k in _keys(added) for s in searched
                    if k == s or k.startswith(s + ".") or s.startswith(k + ".")})
    if clash:
        raise config.ConfigError(f"--set {', '.join(clash)}: the table searches "
                                 f"{'these keys' if len(clash) > 1 else 'this key'} "
                                 f"itself (its tuning section); drop the override, or edit the grid")


def _check_per_method(tuning: Tuning, methods: set[str], algorithms: set[str]) -> None:
    """Each name under ``tuning.per_method`` is a method of the table or the algorithm of one."""
    unknown = set(tuning.per_method) - methods - algorithms
    if unknown:
        raise config.ConfigError(f"tuning.per_method: {', '.join(sorted(unknown))} is neither a method of the table "
                                 f"({', '.join(sorted(methods))}) nor the algorithm of one")


def _candidate_runs(table: Table, setting: str, method: str, configs: list[str], loader: _Loader,
                    grid: dict[str, list[Any]]) -> list[tuple[dict[str, Any], list[TableRun]]]:
    """Each candidate of the (setting, method)'s search over ``grid`` with its runs (one per search
    seed), placed."""
    tuning = table.tuning
    group = []
    for values in tuning.candidates(grid):
        runs = [TableRun(setting, method, seed, configs, table.root / "tuning", "", tuning.overrides(values),
                         candidate_label(values), table.plugins) for seed in tuning.seeds]
        for r in runs:
            _place(r, loader)
        group.append((values, runs))
    return group


def _chosen(setting: str, method: str, candidates: list[Candidate], tuning: Tuning) -> dict[str, Any] | None:
    """The winning candidate's values once every candidate has settled, None before; an error when every
    candidate failed."""
    if not all(c.settled for c in candidates):
        return None
    chosen = choose(candidates, tuning.select)
    if chosen is None:
        raise config.ConfigError(f"{setting} x {method}: every candidate of the search failed ("
                                 + "; ".join(f"{candidate_label(c.values)}: {', '.join(c.failed)}"
                                             for c in candidates)
                                 + "); widen the grid or look at the runs' log.txt")
    return chosen


def _keys(added: list[str]) -> list[str]:
    return [o.split("=", 1)[0].strip() for o in added]


def _text(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()


def validate(table: Table, added: list[str]) -> None:
    """Every run's config is valid (raises ConfigError naming the first bad one)."""
    resolve(table, added)


def _with_seed(d: dict[str, Any], seed: int) -> dict[str, Any]:
    out = copy.deepcopy(d)
    out["run"]["seed"] = seed
    return out


def stored_identity(path: Path) -> dict[str, Any] | str | None:
    """The result fingerprint of the run in ``path``, read from its config.yaml alone (a plugin's
    entries by their names, recorded options and hash: no code of the run's is loaded); None when
    it holds no run; a message when its config.yaml cannot be read as a configuration."""
    try:
        stored = safe_yaml.read(path / CONFIG)
    except FileNotFoundError:
        return None
    except (OSError, yaml.YAMLError) as exc:
        return f"its config.yaml is unreadable ({exc})"
    if not isinstance(stored, dict):
        return "its config.yaml is not a mapping of settings"
    plugin_code.learn_aliases(provenance.recorded_plugins(path), path)   # a package hashed by its paths, as before
    try:
        return config.result_fingerprint(config.recorded(stored).to_dict())
    except (config.ConfigError, TypeError, AttributeError) as exc:
        return f"its config.yaml is not a valid configuration of this mpifed version ({exc})"


def status(run: TableRun) -> RunState:
    """The run's state as :meth:`RunDir.state` reads it (a dead ``running`` run is ``failed``;
    ``diverged``: failed with a NaN or infinite loss); ``running`` or
    ``failed`` for a run killed or still starting before it wrote a status; ``new`` without a run."""
    rd = RunDir(run.path)
    found = rd.state()
    if found:
        return found
    if rd.in_progress():
        return RunState.RUNNING
    return RunState.FAILED if rd.holds_run() else RunState.NEW


def settled(path: Path) -> bool:
    """Whether the run in ``path`` finished, or diverged (a search scores that, and running it
    again diverges again)."""
    state = RunDir(path).state()
    return state is not None and state.settled


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
    # a value changed on both sides first: an option that only one side has follows from another key
    keys.sort(key=lambda k: config.lookup(held, k) is None or config.lookup(want, k) is None)
    shown = ", ".join(f"{k}={config.lookup(held, k)!r} (here {config.lookup(want, k)!r})" for k in keys[:4])
    return f"made with {shown}" + (f" and {len(keys) - 4} more differences" if len(keys) > 4 else "")


def finished_runs(table: Table, keep: Callable[[TableRun], bool] = lambda r: True, with_diverged: bool = False
                  ) -> tuple[dict[tuple[str, str], list[Path]], list[str], int, list[Path]]:
    """The finished runs of the resolved configuration (see :func:`resolve`) per (setting, method),
    of the table's runs that ``keep`` keeps, and the diverged ones too if ``with_diverged``; the
    runs left out, with why; how many were not run yet; the diverged runs it took in."""
    groups: dict[tuple[str, str], list[Path]] = {}
    left_out: list[str] = []
    taken: list[Path] = []
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
        lost = state == RunState.DIVERGED
        if lost and with_diverged:
            runs.append(r.path)
            taken.append(r.path)
            continue
        if state != RunState.FINISHED:
            if state == RunState.NEW:
                not_run += 1
            else:
                why = "diverged (its loss became NaN or infinite)" if lost else RunDir(r.path).why_left_out(state)
                left_out.append(f"{r.path}: {why}")
            continue
        runs.append(r.path)
    return groups, left_out, not_run, taken
