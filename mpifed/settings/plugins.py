"""Code from outside mpifed: a method, model, data set or partition of your own, loaded once per
process, identified by the SHA-256 of its source, and recorded with every run that uses it.

A plugin comes in one of three ways:

* a Python file (``my_method.py``) or an importable module (``mylab.methods``) named under
  ``plugins:`` in a config file or a table file (a file path is relative to the file that names
  it), or by ``--plugin`` on a command line (relative to the current folder);
* an installed package that declares an entry point in the group ``mpifed.plugins``
  (``[project.entry-points."mpifed.plugins"] logitreg = "mylab.methods"``), found without any
  flag (``MPIFED_DISABLE_PLUGIN_AUTOLOAD=1`` turns that off, as pytest's variable of that name does).

A plugin's source is the file itself, or for a module every ``.py`` file of its top-level
package (its helpers are part of its code). Its hash is its content's alone, the same for a file and
for a package that holds that file (:func:`content_sha`): the SHA-256 of its one non-blank file (what
``sha256sum`` prints), or of its non-blank files' SHA-256s in sorted order; file names and blank
files (an empty ``__init__.py``) do not count. Runs recorded before hashed a package by its paths as
well: that hash is an alias of the same code (:func:`canonical`), so such runs resume and enter tables
as ever. A plugin must
register at least one entry (``@ALGORITHMS.register("name")``); a name mpifed or another plugin
has already taken, an entry that does not fit its registry's interface, or an import that fails
is a :class:`PluginError` naming the plugin and the fix, with nothing of it left registered.

A run keeps a copy of each plugin's source (:func:`keep_copies`); :func:`restore` loads the
code a recorded run used (for ``--resume`` and ``mpifed evaluate``). A run folder may come from
someone else (a collaborator's results, an archive downloaded with a paper), so the code it records
runs only where the user allows it: the same code (by hash) already loaded in this process (by
``--plugin``, a ``plugins:`` entry, an installed entry point), or ``--trust-run-code``
(:class:`UntrustedCode` otherwise, naming the code and its copy; nothing is loaded). A recorded
copy outside the run's ``plugins/`` folder, or reached through a link, is refused in every case.
Code changed since the run started (a fix after the method failed) continues a run only with
``--trust-changed-code`` (``changed="accept"``); the run's provenance then records both hashes.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal

from mpifed.files.nofollow import read_bytes
from mpifed.plugin.options import ConfigError
from mpifed.plugin.registry import (AGGREGATIONS, ALGORITHMS, DATASETS, MODELS, PARTITIONS, SELECTORS, Registry,
                                    RegistryError)

GROUP = "mpifed.plugins"                    # the entry-point group installed plugins declare
AUTOLOAD_OFF = "MPIFED_DISABLE_PLUGIN_AUTOLOAD"
COPIES = "plugins"                          # a run directory's folder of plugin copies
KINDS: dict[str, Registry] = {"algorithm": ALGORITHMS, "model": MODELS, "dataset": DATASETS,
                              "partition": PARTITIONS, "selection": SELECTORS, "aggregation": AGGREGATIONS}


class PluginError(ConfigError):
    """A plugin cannot be loaded, or a recorded plugin's code is not the code a run used."""


class UntrustedCode(PluginError):
    """A run records code from outside mpifed that the user has not allowed to run."""


TRUST_FLAG = "--trust-run-code"             # the commands' opt-in to run the code a run folder records
CHANGED_FLAG = "--trust-changed-code"       # --resume's opt-in to continue with code changed since the run started
ALLOW = (f"add {TRUST_FLAG}, or give the same code yourself (--plugin FILE, a plugins: entry of your config, or its "
         f"installed package)")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(eq=False)
class Plugin:
    """One loaded plugin: how it was named, where its source is, its hash and what it registered."""

    kind: Literal["file", "module", "entry point"]
    origin: str                  # the file's absolute path, or the module's name
    module: str                  # the name it is imported as (sys.modules)
    sha256: str
    root: Path                   # the folder its source files are relative to
    files: tuple[str, ...]       # its source files, relative to ``root``
    provides: list[tuple[str, str]] = field(default_factory=list)   # (kind, name): ("algorithm", "fedavg_x")
    package: str | None = None   # an entry point's distribution, "name version"
    entry_point: str | None = None   # an entry point's "name = value"
    sys_path: str | None = None  # a module loaded from a run's copy: the folder put on sys.path for it
    recorded_origin: str | None = None   # loaded from a run's copy: the origin the run recorded
    from_run: bool = False       # loaded from a run's record, as --trust-run-code allowed
    sources: dict[str, bytes] = field(default_factory=dict, repr=False)   # the files as hashed (and run, for a file)
    aliases: frozenset[str] = frozenset()   # the hashes runs recorded for the same code before (see content_sha)

    @property
    def label(self) -> str:
        """How messages name it: the file, the module, or the entry point and its package."""
        if self.kind == "entry point":
            return f"entry point {self.entry_point} of the installed package {self.package}"
        return self.origin if self.kind == "file" else f"module {self.origin}"

    @property
    def copy_name(self) -> str:
        """The folder of its copy in a run directory's plugins/: ``<file stem or package>-<hash>``."""
        stem = Path(self.files[0]).stem if self.kind == "file" else self.origin.split(".")[0]
        return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', stem)}-{self.sha256[:12]}"

    @property
    def package_prefix(self) -> str:
        """The modules that are its code: its own module, or its top-level package's."""
        return self.module if self.kind == "file" else self.module.split(".")[0]

    def owns(self, module: str) -> bool:
        return module == self.package_prefix or module.startswith(self.package_prefix + ".")

    def record(self, used: bool, copy: str | None) -> dict[str, Any]:
        """What a run's provenance.json says of it."""
        return {"kind": self.kind, "origin": self.recorded_origin or self.origin, "module": self.module,
                "sha256": self.sha256, "files": list(self.files), "provides": [f"{k} {n}" for k, n in self.provides],
                "package": self.package, "entry_point": self.entry_point, "used": used, "copy": copy}

    def how_to_load(self) -> dict[str, Any]:
        """What another rank needs to load the same code (:func:`load_again`)."""
        path = str(self.root / self.files[0]) if self.kind == "file" else None
        return {"kind": self.kind, "path": path, "module": self.origin, "sys_path": self.sys_path,
                "sha256": self.sha256, "label": self.label}


_loaded: dict[str, Plugin] = {}     # sha256 -> the plugin loaded with that source
_aliases: dict[str, str] = {}       # a hash recorded by an older scheme -> the content hash of the same code
_installed_done = False


# ------------------------------------------------------------------ loading
def load(spec: str, relative_to: Path | None = None) -> Plugin:
    """Load the file or module ``spec`` (a path relative to ``relative_to``, else the current folder),
    once per process for the same source; a file edited since it was loaded replaces the old version."""
    if is_file_spec(spec):
        return _load_file(resolve_spec(spec, relative_to))
    return _load_module(spec)


def is_file_spec(spec: str) -> bool:
    """Whether a plugin spec names a file (ends in .py, or holds a path separator) rather than a module."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def resolve_spec(spec: str, relative_to: Path | None = None) -> str:
    """A file spec as an absolute path (relative to ``relative_to``, else the current folder); a
    module name as it is."""
    if not is_file_spec(spec):
        return spec
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = (relative_to or Path.cwd()) / path
    return str(Path(os.path.abspath(path)))


def _load_file(origin: str, expect: str | None = None) -> Plugin:
    """Load the file ``origin``; with ``expect``, only if its source has that SHA-256 (checked before it runs)."""
    path = Path(origin)
    if not path.is_file():
        what = "is a folder, not a Python file" if path.is_dir() else "does not exist"
        raise PluginError(f"plugin {origin} {what}: give the .py file that registers your method (or a module name)")
    source = path.read_bytes()
    sha = content_sha({path.name: source})
    _expected(origin, sha, expect)
    if sha in _loaded:
        return _loaded[sha]
    for old in [p for p in _loaded.values() if p.kind == "file" and p.origin == origin]:
        unload(old)   # the file was edited since it was loaded in this process (a notebook): the new code replaces it
    stem = re.sub(r"\W", "_", path.stem)
    plugin = Plugin("file", origin, f"mpifed_plugin_{stem}_{sha[:12]}", sha, path.parent, (path.name,),
                    sources={path.name: source}, aliases=legacy_shas("file", {path.name: source}) - {sha})
    return _register(plugin, lambda: _exec_file(plugin.module, path, source))


def _exec_file(module_name: str, path: Path, source: bytes) -> None:
    """Run ``source`` (the bytes hashed, not the file read again) as the module ``module_name`` of ``path``."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)


def _load_module(name: str, sys_path: str | None = None, entry: importlib.metadata.EntryPoint | None = None,
                 expect: str | None = None) -> Plugin:
    """Import the module ``name`` (``sys_path`` first on the path); with ``expect``, only if its
    package's source has that hash (checked before it runs)."""
    if not _MODULE.fullmatch(name):
        raise PluginError(f"plugin {name!r} is neither a Python file (ending in .py) nor a module name (like "
                          f"mylab.methods)")
    top = name.split(".")[0]
    with _on_path(sys_path):
        found = importlib.util.find_spec(top)
    if found is None:
        raise PluginError(f"plugin module {name} cannot be found: no module named {top!r} on the Python path. "
                          f"Install its package, add its folder to PYTHONPATH, or name the file (ending in .py)")
    root, sources = _module_source(found)
    sha = content_sha(sources)
    _expected(f"module {name}", sha, expect)
    if sha in _loaded:
        return _loaded[sha]
    plugin = Plugin("entry point" if entry else "module", name, name, sha, root, tuple(sources), sys_path=sys_path,
                    sources=sources, aliases=legacy_shas("module", sources) - {sha})
    if entry is not None:
        plugin.entry_point = f"{entry.name} = {entry.value}"
        dist = getattr(entry, "dist", None)
        plugin.package = f"{dist.name} {dist.version}" if dist is not None else "(unknown package)"

    def run() -> None:
        with _on_path(sys_path):
            module = importlib.import_module(name)
            if entry is not None and entry.attr:
                hook = getattr(module, entry.attr, None)
                if not callable(hook):
                    raise PluginError(f"{plugin.label}: {entry.value} is not a function of {name}; an entry point "
                                      f"names a module, or a function that registers the plugin's entries")
                hook()
    return _register(plugin, run, already=name in sys.modules)


class _NotExpected(PluginError):
    def __init__(self, label: str, sha: str, expect: str) -> None:
        super().__init__(f"plugin {label} is not the code expected (SHA-256 {sha[:12]}... there, {expect[:12]}... "
                         f"expected): it changed while it was being loaded, or it is other code; nothing of it ran")
        self.sha = sha


def _expected(label: str, sha: str, expect: str | None) -> None:
    if expect is not None and sha != expect:
        raise _NotExpected(label, sha, expect)


def _register(plugin: Plugin, run: Any, already: bool = False) -> Plugin:
    """Import the plugin with ``run()``, note what it registered and check it; on any failure leave
    nothing of it registered or imported."""
    for registry in KINDS.values():
        registry.names()   # mpifed's own entries first, so that a plugin's never count as theirs
    before = {kind: registry.items() for kind, registry in KINDS.items()}
    modules_before = set(sys.modules)
    try:
        run()
    except PluginError:
        _undo(plugin, before, modules_before)
        raise
    except RegistryError as exc:
        _undo(plugin, before, modules_before)
        raise PluginError(f"plugin {plugin.label}: {exc}") from None
    except BaseException as exc:
        _undo(plugin, before, modules_before)
        if not isinstance(exc, Exception):
            raise
        raise PluginError(f"plugin {plugin.label} failed to import: {type(exc).__name__}: {exc}{_where(exc, plugin)}. "
                          f"Fix the file and run again") from None
    plugin.provides = [(kind, name) for kind, registry in KINDS.items()
                       for name, entry in registry.items().items() if before[kind].get(name) is not entry]
    if already and not plugin.provides:   # imported before it was named a plugin: its entries are registered
        plugin.provides = [(kind, name) for kind, registry in KINDS.items() for name, entry in registry.items().items()
                           if _defined_in(entry, plugin.origin.split(".")[0])]
    problems = [p for kind, name in plugin.provides for p in _entry_problems(kind, name, KINDS[kind].get(name))]
    if not plugin.provides or problems:
        _undo(plugin, before, modules_before)
        if problems:
            raise PluginError(f"plugin {plugin.label}: " + "; ".join(problems))
        raise PluginError(f"plugin {plugin.label} registers nothing: a plugin defines a method, model, data set, "
                          f"partition, client selection or aggregation and registers it, e.g. "
                          f"@ALGORITHMS.register(\"my_method\") above an Algorithm subclass (see docs/methods.md)")
    _loaded[plugin.sha256] = plugin
    _aliases.update(dict.fromkeys(plugin.aliases, plugin.sha256))
    return plugin


def _undo(plugin: Plugin, before: dict[str, dict[str, Any]], modules_before: set[str]) -> None:
    for kind, registry in KINDS.items():
        for name, entry in registry.items().items():
            if before[kind].get(name) is not entry:
                registry.forget(name)
    for name in set(sys.modules) - modules_before:
        if plugin.owns(name):
            sys.modules.pop(name, None)


def unload(plugin: Plugin) -> None:
    """Forget a plugin: its entries leave the registries and its modules ``sys.modules`` (a file
    reloaded after an edit; tests that load plugins in their own process)."""
    for kind, name in plugin.provides:
        KINDS[kind].forget(name)
    for name in [m for m in sys.modules if plugin.owns(m)]:
        del sys.modules[name]
    _loaded.pop(plugin.sha256, None)


def _defined_in(entry: Any, package: str) -> bool:
    module = getattr(entry, "__module__", "") or ""
    return module == package or module.startswith(package + ".")


def _where(exc: BaseException, plugin: Plugin) -> str:
    """`` (my_method.py, line 12)``: the last line of the plugin's own source the error passed through."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({exc.filename}, line {exc.lineno})"
    sources = {str((plugin.root / f).resolve()) for f in plugin.files}
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if str(Path(f.filename).resolve()) in sources]
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def load_installed() -> list[Plugin]:
    """The plugins installed packages declare (entry points of the group ``mpifed.plugins``), loaded
    on the first call in a process (none when MPIFED_DISABLE_PLUGIN_AUTOLOAD is set)."""
    global _installed_done
    if _installed_done:
        return [p for p in _loaded.values() if p.kind == "entry point"]
    if os.environ.get(AUTOLOAD_OFF):
        _installed_done = True
        return []
    seen: set[str] = set()
    for entry in importlib.metadata.entry_points(group=GROUP):
        if entry.value in seen:   # one distribution found twice on the path
            continue
        seen.add(entry.value)
        try:
            _load_module(entry.module, entry=entry)
        except PluginError as exc:
            raise PluginError(f"{exc}. (An installed plugin is loaded by every mpifed command: uninstall its "
                              f"package, or set {AUTOLOAD_OFF}=1 to start without installed plugins)") from None
    _installed_done = True
    return [p for p in _loaded.values() if p.kind == "entry point"]


def load_again(how: dict[str, Any]) -> Plugin:
    """On another rank: load the code :meth:`Plugin.how_to_load` describes, and check it is the same."""
    try:
        if how["kind"] == "file":
            return _load_file(how["path"], expect=how["sha256"])
        return _load_module(how["module"], how.get("sys_path"), expect=how["sha256"])
    except _NotExpected as exc:
        raise PluginError(f"plugin {how['label']} has other code on this rank than on rank 0 (SHA-256 "
                          f"{exc.sha[:12]}... here, {how['sha256'][:12]}... there): every node must see the "
                          f"same file or install the same version") from None


def loaded() -> list[Plugin]:
    """The plugins loaded in this process, in the order they were loaded."""
    return list(_loaded.values())


def provider(kind: str, name: str) -> Plugin | None:
    """The loaded plugin that registered ``name`` in the registry of ``kind`` (None: mpifed's own)."""
    return next((p for p in _loaded.values() if (kind, name) in p.provides), None)


# ------------------------------------------------------------------ a run's record of its code
def keep_copies(run_dir: Path, used: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """Copy every loaded plugin's source into ``run_dir/plugins/<name>-<hash>/`` (once: a copy of the
    same hash is kept as it is) and return their records; ``used``: the (kind, name) entries the run
    chose, which mark the plugins it depends on."""
    used = set(used)
    out = []
    for p in _loaded.values():
        folder = Path(COPIES) / p.copy_name
        target = run_dir / folder
        if not target.is_dir():
            tmp = run_dir / COPIES / f".{folder.name}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            for rel, data in p.sources.items():
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                (tmp / rel).write_bytes(data)
            os.replace(tmp, target)
        out.append(p.record(bool(used & set(p.provides)), str(folder)))
    return out


def restore(records: list[dict[str, Any]], run_dir: Path, what: str, changed: Literal["refuse", "copy", "accept"],
            trust: bool = False, allow: str = ALLOW) -> list[Plugin]:
    """Load the code of the recorded plugins a run used (``records``: its provenance's; ``what``
    names the run in messages).

    A plugin whose code (by hash) is loaded already is taken as it is. Any other is run only with
    ``trust`` (``allow`` says in messages how the user allows it): its origin when its source still
    has the recorded hash, else the run's copy, checked against the hash. Without ``trust`` it is an
    :class:`UntrustedCode` naming each such plugin and its copy, and nothing is loaded. Where other
    code is loaded under a recorded plugin's names (the file edited, another version installed):
    ``refuse`` is an error (``--resume``: the run would continue with other code than it trained
    with), ``copy`` loads the run's own code in its place (``mpifed evaluate``), ``accept`` takes the
    changed code (``--resume --trust-changed-code``: loaded already, or from where the run's came)."""
    load_installed()
    used = [_checked_record(r, run_dir, what) for r in records if r.get("used")]
    learn_aliases(used, run_dir)
    out: list[Plugin] = []
    pending: list[tuple[dict[str, Any], list[Plugin]]] = []
    for rec in used:
        known = _loaded.get(canonical(rec["sha256"]))
        if known is not None:
            out.append(known)
            continue
        replaced = _other_code_under_its_names(rec, run_dir, what, changed)
        if changed == "accept" and replaced:   # the changed code, given again: it continues the run
            out.extend(replaced)
        else:
            pending.append((rec, replaced))
    if pending and not trust:
        raise UntrustedCode(_untrusted(what, run_dir, [rec for rec, _ in pending], allow))
    for rec, replaced in pending:
        for p in replaced:
            unload(p)
        now_sha = _origin_hash(rec)
        if now_sha == canonical(rec["sha256"]):
            plugin = _load_recorded_origin(rec)
        elif now_sha is not None and changed == "refuse":
            raise _changed(rec, now_sha, run_dir, what)
        elif now_sha is not None and changed == "accept":
            plugin = load(rec["origin"] if rec["kind"] == "file" else rec["module"])
        else:
            plugin = load_copy(rec, run_dir, what)
        plugin.from_run = True
        out.append(plugin)
    return list(dict.fromkeys(out))


def _other_code_under_its_names(rec: dict[str, Any], run_dir: Path, what: str,
                                changed: Literal["refuse", "copy", "accept"]) -> list[Plugin]:
    """The loaded plugins that a recorded plugin's code would replace (another version of the same
    file or module); an error where its names are taken by other code, or, with ``refuse``, by
    another version of it."""
    provides = [tuple(item.split(" ", 1)) for item in rec["provides"]]
    have = {p for k, n in provides if (p := provider(k, n)) is not None}
    if not have and not any(k in KINDS and n in KINDS[k] for k, n in provides):
        return []
    same = [p for p in have if rec["origin"] in (p.origin, p.recorded_origin) or p.module == rec["module"]]
    if same and changed == "refuse":
        raise _changed(rec, same[0].sha256, run_dir, what)
    if not same:
        now = ", ".join(f"plugin {p.label} (SHA-256 {p.sha256[:12]}...)" for p in have) or "mpifed's own entries"
        fix = "Leave out the --plugin or plugins: entry that loads it"
        if any(p.kind == "entry point" for p in have):
            fix = (f"Set {AUTOLOAD_OFF}=1 so that the installed package is not loaded (the run's own code then comes "
                   f"from its copy, with {TRUST_FLAG}), or install the version the run was made with")
        raise PluginError(f"{what} was made with {_recorded_label(rec)} (SHA-256 {rec['sha256'][:12]}...) for "
                          f"{', '.join(rec['provides'])}, but this process has {now} under those names: the code "
                          f"differs. {fix}")
    return same


def _untrusted(what: str, run_dir: Path, records: list[dict[str, Any]], allow: str) -> str:
    """Which code from outside mpifed the run needs, where its copies are, and how to allow it."""
    lines = []
    for rec in records:
        copy = run_dir / rec["copy"] / rec["files"][0] if rec.get("copy") else None
        kept = f"; its copy: {copy}" if copy is not None and copy.is_file() else "; the run keeps no copy of it"
        lines.append(f"{_recorded_label(rec)} (SHA-256 {rec['sha256'][:12]}..., for "
                     f"{', '.join(rec['provides']) or 'nothing named'}){kept}")
    return (f"{what}: the run was made with code from outside mpifed, which mpifed runs only when you say so: "
            f"{'; '.join(lines)}. Nothing of it was loaded. A run folder from someone else can hold any code: read "
            f"it, then {allow}")


def _checked_record(rec: dict[str, Any], run_dir: Path, what: str) -> dict[str, Any]:
    """A recorded plugin as provenance.json holds it, checked before anything of it is used: its kind,
    hash, module name and files well formed, and its copy a folder of the run's own ``plugins/``,
    reached through no link."""
    def bad(why: str) -> PluginError:
        return PluginError(f"{what}: its provenance.json records a plugin {why}; mpifed refuses that record in "
                           f"every case. Put back the run's own provenance.json, or leave the run out")
    if rec.get("kind") not in ("file", "module", "entry point"):
        raise bad(f"of an unknown kind ({rec.get('kind')!r})")
    if not isinstance(rec.get("sha256"), str) or not _SHA256.fullmatch(rec["sha256"]):
        raise bad(f"without a SHA-256 ({rec.get('sha256')!r})")
    if not isinstance(rec.get("module"), str) or not _MODULE.fullmatch(rec["module"]):
        raise bad(f"whose module is not a module name ({rec.get('module')!r})")
    if not isinstance(rec.get("origin"), str):
        raise bad(f"whose origin is not a path or module name ({rec.get('origin')!r})")
    provides = rec.get("provides", [])
    if not isinstance(provides, list) or not all(isinstance(x, str) and " " in x for x in provides):
        raise bad(f"whose entries are not (kind name) pairs ({provides!r})")
    files = rec.get("files")
    if not isinstance(files, list) or not files or not all(_relative_inside(f) for f in files) or (
            rec["kind"] == "file" and (len(files) != 1 or "/" in files[0] or not files[0].endswith(".py"))):
        raise bad(f"with files that are not its own source files, relative to its copy ({files!r})")
    copy = rec.get("copy")
    if copy is None:
        return {**rec, "provides": provides}
    parts = copy.split("/") if isinstance(copy, str) else []
    if len(parts) != 2 or parts[0] != COPIES or not _relative_inside(copy):
        raise bad(f"whose copy is not a folder of the run's {COPIES}/ ({copy!r})")
    folder = run_dir / copy
    linked = [p for p in (run_dir / COPIES, folder, *(folder / f for f in files)) if p.is_symlink()]
    linked += [folder / q for f in files for q in Path(f).parents if q != Path(".") and (folder / q).is_symlink()]
    if linked or (folder.exists() and not folder.resolve().is_relative_to(run_dir.resolve())):
        raise bad(f"whose copy is reached through a link ({linked[0] if linked else folder}), so its code is not "
                  f"the run's own")
    return {**rec, "provides": provides}


def _relative_inside(path: Any) -> bool:
    """Whether ``path`` is a relative path that stays below its folder (no ``..``, not absolute)."""
    if not isinstance(path, str) or not path or "\\" in path or "\0" in path:
        return False
    parts = path.split("/")
    return not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _changed(rec: dict[str, Any], now_sha: str, run_dir: Path, what: str) -> PluginError:
    keep = f" (the run keeps a copy: {run_dir / rec['copy']})" if rec.get("copy") else ""
    return PluginError(f"{what}: the code of {_recorded_label(rec)} changed since the run started (SHA-256 "
                       f"{rec['sha256']} then, {now_sha} now), so the run would continue with other code than it "
                       f"was trained with. Put back the code it started with{keep}, or start a new run (another "
                       f"run.name), or, to continue this run with the changed code (a fix after the method failed; "
                       f"its provenance records both), add {CHANGED_FLAG}")


def load_copy(rec: dict[str, Any], run_dir: Path, what: str) -> Plugin:
    """Load a run's recorded copy of a plugin (a record :func:`restore` checked), after checking it
    against the recorded hash."""
    if not rec.get("copy"):
        raise PluginError(f"{what} was made with {_recorded_label(rec)}, which is not there any more, and the run "
                          f"keeps no copy of it: install or restore it")
    folder = run_dir / rec["copy"]
    files = list(rec["files"])
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise PluginError(f"{what}: the run's copy of {_recorded_label(rec)} is missing ({folder / missing[0]} "
                          f"is not there), and its origin is not there either: restore the copy or the origin")
    sources = {rel: read_bytes(folder / rel) for rel in files}
    sha = content_sha(sources)
    if rec["sha256"] not in {sha} | legacy_shas(rec["kind"], sources):
        raise PluginError(f"{what}: the run's copy of {_recorded_label(rec)} in {folder} was altered (SHA-256 "
                          f"{sha[:12]}... now, {rec['sha256'][:12]}... recorded): its code is not the code the run "
                          f"used. Restore the copy or the origin")
    if rec["kind"] == "file":
        plugin = _load_file(str(folder / files[0]), expect=sha)
    else:
        plugin = _load_module(rec["module"], sys_path=str(folder), expect=sha)
    plugin.recorded_origin = rec["origin"]
    return plugin


def _recorded_label(rec: dict[str, Any]) -> str:
    if rec.get("kind") == "entry point":
        return f"the installed plugin {rec.get('entry_point')} ({rec.get('package')})"
    return f"plugin {rec['origin']}" if rec.get("kind") == "file" else f"plugin module {rec['origin']}"


def _origin_hash(rec: dict[str, Any]) -> str | None:
    """The hash of a recorded plugin's source where it came from, now; None when it is not there."""
    if rec["kind"] == "file":
        path = Path(rec["origin"])
        return content_sha({path.name: path.read_bytes()}) if path.is_file() else None
    found = importlib.util.find_spec(rec["module"].split(".")[0])
    if found is None:
        return None
    return content_sha(_module_source(found)[1])


def _load_recorded_origin(rec: dict[str, Any]) -> Plugin:
    if rec["kind"] == "file":
        return _load_file(rec["origin"], expect=canonical(rec["sha256"]))
    return _load_module(rec["module"], expect=canonical(rec["sha256"]))


# ------------------------------------------------------------------ hashing
def content_sha(sources: dict[str, bytes]) -> str:
    """A plugin's hash, from its files' content alone: the SHA-256 of its one non-blank file (what
    ``sha256sum`` prints), or of its non-blank files' SHA-256s, sorted, one per line. A file and a
    package that holds the same code with an empty ``__init__.py`` have the same hash; a renamed
    file is the same code."""
    digests = sorted(hashlib.sha256(data).hexdigest() for data in sources.values() if data.strip())
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256("".join(f"{d}\n" for d in digests).encode()).hexdigest()


def legacy_shas(kind: str, sources: dict[str, bytes]) -> set[str]:
    """The hashes runs recorded for these sources before :func:`content_sha`: a file's SHA-256, or
    for a module (or an entry point's) the SHA-256 of its files' relative paths and SHA-256s."""
    if kind == "file":
        return {hashlib.sha256(data).hexdigest() for data in sources.values()}
    h = hashlib.sha256()
    for rel in sorted(sources):
        h.update(f"{rel}\0{hashlib.sha256(sources[rel]).hexdigest()}\n".encode())
    return {h.hexdigest()}


def canonical(sha: str) -> str:
    """The content hash of the code a recorded hash names: ``sha`` itself, or, for a hash of an older
    scheme, the hash of the same code now (known once that code is loaded, or a run's copy of it was
    read by :func:`learn_aliases`)."""
    return _aliases.get(sha, sha)


def learn_aliases(records: Iterable[dict[str, Any]], run_dir: Path) -> None:
    """Note, for :func:`canonical`, the content hash of each recorded plugin (a record :func:`restore`
    checks, or provenance's) whose copy in ``run_dir`` still has the recorded hash: its files are read
    and hashed, never run. A record without a readable copy, or with a copy altered, is left as it is."""
    for rec in records:
        sha, copy, files = rec.get("sha256"), rec.get("copy"), rec.get("files")
        if sha in _aliases or not isinstance(copy, str) or not isinstance(files, list) or \
                not all(_relative_inside(f) for f in [copy, *files]):
            continue
        try:
            sources = {rel: read_bytes(run_dir / copy / rel) for rel in files}
        except OSError:
            continue
        now = content_sha(sources)
        if sha != now and sha in legacy_shas(str(rec.get("kind")), sources):
            _aliases[sha] = now


def _module_source(found: importlib.machinery.ModuleSpec) -> tuple[Path, dict[str, bytes]]:
    """The folder and the .py files of a top-level module, by path relative to the folder: its file,
    or every file of its package."""
    if found.submodule_search_locations:
        package = Path(list(found.submodule_search_locations)[0])
        files = {str(p.relative_to(package.parent)): p for p in package.rglob("*.py")
                 if "__pycache__" not in p.parts and not p.is_symlink()}
        return package.parent, {rel: files[rel].read_bytes() for rel in sorted(files)}
    if not found.origin or not found.origin.endswith(".py"):
        raise PluginError(f"plugin module {found.name} is not Python source ({found.origin}): a plugin must be .py "
                          "files")
    origin = Path(found.origin)
    return origin.parent, {origin.name: origin.read_bytes()}


class _on_path:
    """``folder`` first on sys.path for the duration (a module loaded from a run's copy)."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder

    def __enter__(self) -> None:
        if self.folder:
            sys.path.insert(0, self.folder)

    def __exit__(self, *_: Any) -> None:
        if self.folder and self.folder in sys.path:
            sys.path.remove(self.folder)


# ------------------------------------------------------------------ what a registered entry must be
def _entry_problems(kind: str, name: str, entry: Any) -> list[str]:
    """Why a plugin's entry does not fit its registry's interface (empty when it does)."""
    import dataclasses
    where = f"{kind} {name!r} ({getattr(entry, '__qualname__', type(entry).__name__)})"
    options = getattr(entry, "Options", None)
    if options is None or not dataclasses.is_dataclass(options):
        return [f"{where} has no Options dataclass (its config keys; use mpifed.options.NoOptions when it has none)"]
    if kind == "algorithm":
        from mpifed.algorithms.base import role_problems
        return [f"{where}: {p}" for p in role_problems(entry)]
    needed = {"model": "build", "dataset": "load", "partition": "split", "selection": "select",
              "aggregation": "aggregate"}[kind]
    if not callable(getattr(entry, needed, None)):
        return [f"{where} has no {needed}() (see docs/methods.md for what a {kind} defines)"]
    return []
