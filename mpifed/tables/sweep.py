"""A sweep: one run's configuration expanded over values of one or more keys (every combination
of them), each combination (a *point*) a run of its own per seed, run, listed, written for a
Slurm array and summarised as a table's runs are::

    python -m mpifed.table --config configs/quickstart.yaml \\
        --sweep train.lr=0.01,0.03,0.1 data.partition.beta=0.1,0.5 --seeds 0 1 2 --run 3 --parallel 2
    python -m mpifed.table --config configs/quickstart.yaml --sweep ... --seeds 0 1 2 --summary

A sweep is a table with one setting (its config files) and one row per point: the runs go to
``runs/<config>-sweep-<keys>/<config>-<point>-s<seed>`` (a point's label is ``lr=0.01+beta=0.1``,
each key by the shortest end of its name that tells the keys apart), the same command continues
it, and ``--summary`` compares every point with the first one over the seeds both have.
"""
from __future__ import annotations

import re
from itertools import product
from pathlib import Path

import yaml

from mpifed.files import safe_yaml
from mpifed.files.packaged import find_config
from mpifed.run import results
from mpifed.run.rundir import check_run_name
from mpifed.settings import config
from mpifed.settings.plugins import load as load_plugin
from mpifed.tables.table_file import Table, TableRun

DEFAULT_METRIC = "{kind: final}"


def split_values(text: str) -> list[str]:
    """``0.01,0.1`` -> ``['0.01', '0.1']``: commas inside brackets, braces or quotes stay (``[1,2],[3]``)."""
    values, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
    values.append(text[start:].strip())
    return values


def parse(words: list[str]) -> dict[str, list[str]]:
    """``--sweep KEY=V1,V2 ...`` as {key: [values]}; a ConfigError for a malformed or repeated key."""
    swept: dict[str, list[str]] = {}
    for word in words:
        key, eq, text = word.partition("=")
        key = key.strip()
        if not eq or not key or not text.strip():
            raise config.ConfigError(f"--sweep {word!r}: expected KEY=V1,V2,..., e.g. --sweep train.lr=0.01,0.1")
        if key in swept:
            raise config.ConfigError(f"--sweep {key} is given twice; list all its values once: {key}=V1,V2,...")
        values = split_values(text)
        if "" in values:
            raise config.ConfigError(f"--sweep {word!r}: an empty value; separate the values with single commas")
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise config.ConfigError(f"--sweep {key}: {', '.join(twice)} listed more than once")
        swept[key] = values
    if not swept:
        raise config.ConfigError("--sweep needs at least one KEY=V1,V2,...")
    return swept


def short_names(keys: list[str]) -> dict[str, str]:
    """Each dotted key -> the shortest end of it that no other key shares (``train.lr`` -> ``lr``); a
    choice's ``name`` keeps its section (``algorithm.name`` -> ``algorithm.name``)."""
    out = {}
    for key in keys:
        parts = key.split(".")
        for n in range(2 if parts[-1] == "name" and len(parts) > 1 else 1, len(parts) + 1):
            end = ".".join(parts[-n:])
            if not any(other != key and (other == end or other.endswith("." + end)) for other in keys):
                break
        out[key] = end
    return out


def _label_text(value: str) -> str:
    return re.sub(r"[^\w.+@=-]+", "_", value).strip("_") or "_"


def points(swept: dict[str, list[str]]) -> list[tuple[str, list[str]]]:
    """Every combination of the swept values, in the order given: (its label, its --set overrides)."""
    short = short_names(list(swept))
    out = []
    for combo in product(*swept.values()):
        label = "+".join(f"{short[k]}={_label_text(v)}" for k, v in zip(swept, combo))
        out.append((label, [f"{k}={v}" for k, v in zip(swept, combo)]))
    labels = [label for label, _ in out]
    clash = sorted({label for label in labels if labels.count(label) > 1})
    if clash:
        raise config.ConfigError(f"--sweep: the values {', '.join(clash)} cannot be told apart in a run name; "
                                 f"give them without characters other than letters, digits and ._+@=-")
    return out


def load_sweep(configs: list[str], sweep: list[str], base: list[str], seeds: list[int] | None,
               runs_root: str = "runs", plugins: list[str] | None = None, name: str | None = None,
               metric: str = DEFAULT_METRIC) -> Table:
    """The sweep of ``configs`` with the overrides ``base`` (its ``--set``) over the ``--sweep``
    words as a :class:`Table` (not yet resolved: see :func:`mpifed.tables.table_file.resolve`): one
    setting, a method per point, ``seeds`` (None: the configuration's own ``run.seed``), in
    ``runs_root/name`` (default ``<config>-sweep-<keys>``)."""
    for spec in plugins or []:
        load_plugin(spec)
    files = [find_config(c) for c in configs]
    swept = parse(sweep)
    given = [o.split("=", 1)[0].strip() for o in base]
    table_keys = sorted(k for k in [*swept, *given] if k in ("run.seed", "run.name", "run.root", "run.group"))
    if table_keys:
        raise config.ConfigError(f"{', '.join(table_keys)}: a sweep sets run.seed (--seeds), run.name, "
                                 "run.root (--runs-root) and run.group of its runs itself")
    setting = "+".join(re.sub(r"\.ya?ml$", "", f.name) for f in files)
    short = short_names(list(swept))
    folder = name or f"{setting}-sweep-{'-'.join(_label_text(short[k]) for k in swept)}"
    try:
        check_run_name(folder)
    except ValueError as exc:
        raise config.ConfigError(f"--name {folder!r}: {exc}") from None
    twice = sorted({s for s in seeds or [] if seeds.count(s) > 1})
    if twice:
        raise config.ConfigError(f"--seeds lists {', '.join(map(str, twice))} more than once; each seed is one run")
    if seeds is None:
        seeds = [config.load([str(f) for f in files], list(base), plugins=list(plugins or []))[0].run.seed]
    try:
        declared = results.Metric.parse(safe_yaml.load(metric, f"--metric {metric!r}"))
    except safe_yaml.YamlRefused as exc:
        raise config.ConfigError(str(exc)) from None
    except (results.MetricError, yaml.YAMLError) as exc:
        raise config.ConfigError(f"--metric: {exc}") from None
    root = Path(runs_root) / folder
    found = points(swept)
    runs = [TableRun(setting, label, seed, list(files), root, f"{setting}-{label}-s{seed}", plugins=list(plugins or []),
                     point=[*base, *overrides])
            for label, overrides in found for seed in seeds]
    title = f"Sweep of {' x '.join(swept)} over {' + '.join(configs)}"
    title += f" with --set {' '.join(base)}" if base else ""
    return Table(title, declared, runs, reference=found[0][0], seeds=list(seeds), root=root,
                 plugins=list(plugins or []))
