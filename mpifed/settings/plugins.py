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
package (its helpers are part of its code). Its hash is the file's SHA-256 (what ``sha256sum``
prints), or for a package the SHA-256 of its files' relative paths and hashes. A plugin must
register at least one entry (``@ALGORITHMS.register("name")``); a name mpifed or another plugin
has already taken, an entry that does not fit its registry's interface, or an import that fails
is a :class:`PluginError` naming the plugin and the fix, with nothing of it left registered.

A run keeps a copy of each plugin's source (:func:`keep_copies`); :func:`restore` loads the
code a recorded run used (for ``--resume``, ``mpifed evaluate`` and the readers of runs).
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

from mpifed.plugin.options import ConfigError
from mpifed.plugin.registry import ALGORITHMS, DATASETS, MODELS, PARTITIONS, Registry, RegistryError

GROUP = "mpifed.plugins"                    # the entry-point group installed plugins declare
AUTOLOAD_OFF = "MPIFED_DISABLE_PLUGIN_AUTOLOAD"
COPIES = "plugins"                          # a run directory's folder of plugin copies
KINDS: dict[str, Registry] = {"algorithm": ALGORITHMS, "model": MODELS, "dataset": DATASETS,
                              "partition": PARTITIONS}


class PluginError(ConfigError):
    """A plugin cannot be loaded, or a recorded plugin's code is not the code a run used."""


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
    sources: dict[str, bytes] = field(default_factory=dict, repr=False)   # the files as hashed (and run, for a file)

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


def _load_file(origin: str) -> Plugin:
    path = Path(origin)
    if not path.is_file():
        what = "is a folder, not a Python file" if path.is_dir() else "does not exist"
        raise PluginError(f"plugin {origin} {what}: give the .py file that registers your method (or a module name)")
    source = path.read_bytes()
    sha = hashlib.sha256(source).hexdigest()
    if sha in _loaded:
        return _loaded[sha]
    for old in [p for p in _loaded.values() if p.kind == "file" and p.origin == origin]:
        unload(old)   # the file was edited since it was loaded in this process (a notebook): the new code replaces it
    stem = re.sub(r"\W", "_", path.stem)
    plugin = Plugin("file", origin, f"mpifed_plugin_{stem}_{sha[:12]}", sha, path.parent, (path.name,),
                    sources={path.name: source})
    return _register(plugin, lambda: _exec_file(plugin.module, path, source))


def _exec_file(module_name: str, path: Path, source: bytes) -> None:
    """Run ``source`` (the bytes hashed, not the file read again) as the module ``module_name`` of ``path``."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)


def _load_module(name: str, sys_path: str | None = None, entry: importlib.metadata.EntryPoint | None = None) -> Plugin:
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
        raise PluginError(f"plugin {name!r} is neither a Python file (ending in .py) nor a module name (like "
                          f"mylab.methods)")
    top = name.split(".")[0]
    with _on_path(sys_path):
        found = importlib.util.find_spec(top)
    if found is None:
        raise PluginError(f"plugin module {name} cannot be found: no module named {top!r} on the Python path. "
                          f"Install its package, add its folder to PYTHONPATH, or name the file (ending in .py)")
    root, sources = _module_source(found)
    sha = _sha_tree(sources)
    if sha in _loaded:
        return _loaded[sha]
    plugin = Plugin("entry point" if entry else "module", name, name, sha, root, tuple(sources), sys_path=sys_path,
                    sources=sources)
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
        raise PluginError(f"plugin {plugin.label} registers nothing: a plugin defines a method, model, data set or "
                          f"partition and registers it, e.g. @ALGORITHMS.register(\"my_method\") above an Algorithm "
                          f"subclass (see docs/methods.md)")
    _loaded[plugin.sha256] = plugin
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
    if how["kind"] == "file":
        plugin = _load_file(how["path"])
    else:
        plugin = _load_module(how["module"], how.get("sys_path"))
    if plugin.sha256 != how["sha256"]:
        raise PluginError(f"plugin {how['label']} has other code on this rank than on rank 0 (SHA-256 "
                          f"{plugin.sha256[:12]}... here, {how['sha256'][:12]}... there): every node must see the "
                          f"same file or install the same version")
    return plugin


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


def restore(records: list[dict[str, Any]], run_dir: Path, what: str,
            changed: Literal["refuse", "copy", "keep"]) -> list[Plugin]:
    """Load the code of the recorded plugins a run used (``records``: its provenance's; ``what``
    names the run in messages). Each one's origin is loaded when its source still has the recorded
    hash, else the run's copy, checked against the hash. Where the origin's code changed (the file
    edited, another version installed): ``refuse`` is an error (``--resume``: the run would
    continue with other code than it trained with), ``copy`` loads the run's copy instead
    (``mpifed evaluate``: the run's own code), ``keep`` keeps what is loaded (readers of a run's
    records, who need only its names)."""
    load_installed()
    out = []
    for rec in (r for r in records if r.get("used")):
        provides = [tuple(item.split(" ", 1)) for item in rec.get("provides", [])]
        have = {p for k, n in provides if (p := provider(k, n)) is not None}
        if have and all(p.sha256 == rec["sha256"] for p in have):
            out.extend(p for p in have if p not in out)
            continue
        if have or any(k in KINDS and n in KINDS[k] for k, n in provides):
            if changed == "keep":
                continue
            same = [p for p in have if rec["origin"] in (p.origin, p.recorded_origin) or p.module == rec["module"]]
            if same and changed == "refuse":
                raise _changed(rec, same[0].sha256, run_dir, what)
            if not same:
                now = ", ".join(f"plugin {p.label} (SHA-256 "
                                f"{p.sha256[:12]}...)" for p in have) or "mpifed's own entries"
                raise PluginError(f"{what} was made with {_recorded_label(rec)} (SHA-256 {rec['sha256'][:12]}...) "
                                  f"for {', '.join(rec.get('provides', []))}, but this process has {now} under those "
                                  f"names: the code differs. Leave out the --plugin or plugins: entry that loads it")
            for p in same:
                unload(p)
        now_sha = _origin_hash(rec)
        if now_sha == rec["sha256"]:
            out.append(_load_recorded_origin(rec))
        elif now_sha is not None and changed == "refuse":
            raise _changed(rec, now_sha, run_dir, what)
        else:
            out.append(load_copy(rec, run_dir, what))
    return out


def _changed(rec: dict[str, Any], now_sha: str, run_dir: Path, what: str) -> PluginError:
    keep = f" (the run keeps a copy: {run_dir / rec['copy']})" if rec.get("copy") else ""
    return PluginError(f"{what}: the code of {_recorded_label(rec)} changed since the run started (SHA-256 "
                       f"{rec['sha256']} then, {now_sha} now), so the run would continue with other code than it "
                       f"was trained with. Put back the code it started with{keep}, or start a new run (another "
                       f"run.name)")


def load_copy(rec: dict[str, Any], run_dir: Path, what: str) -> Plugin:
    """Load a run's recorded copy of a plugin, after checking it against the recorded hash."""
    if not rec.get("copy"):
        raise PluginError(f"{what} was made with {_recorded_label(rec)}, which is not there any more, and the run "
                          f"keeps no copy of it: install or restore it")
    folder = run_dir / rec["copy"]
    files = list(rec.get("files") or [])
    missing = [f for f in files if not (folder / f).is_file() or (folder / f).is_symlink()]
    if missing or not files:
        raise PluginError(f"{what}: the run's copy of {_recorded_label(rec)} is missing "
                          f"({folder / (missing or ['?'])[0]} "
                          f"is not there), and its origin is not there either: restore the copy or the origin")
    sha = _sha_file(folder / files[0]) if rec["kind"] == "file" else _sha_tree(
        {rel: (folder / rel).read_bytes() for rel in files})
    if sha != rec["sha256"]:
        raise PluginError(f"{what}: the run's copy of {_recorded_label(rec)} in {folder} was altered (SHA-256 "
                          f"{sha[:12]}... now, {rec['sha256'][:12]}... recorded): its code is not the code the run "
                          f"used. Restore the copy or the origin")
    if rec["kind"] == "file":
        plugin = _load_file(str(folder / files[0]))
    else:
        plugin = _load_module(rec["module"], sys_path=str(folder))
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
        return _sha_file(path) if path.is_file() else None
    found = importlib.util.find_spec(rec["module"].split(".")[0]) if re.fullmatch(r"[\w.]+", rec["module"]) else None
    if found is None:
        return None
    return _sha_tree(_module_source(found)[1])


def _load_recorded_origin(rec: dict[str, Any]) -> Plugin:
    if rec["kind"] == "file":
        return _load_file(rec["origin"])
    if rec["kind"] == "entry point":
        load_installed()
        found = next((p for p in _loaded.values() if p.sha256 == rec["sha256"]), None)
        if found is not None:
            return found
    return _load_module(rec["module"])


# ------------------------------------------------------------------ hashing
def _sha_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _sha_tree(sources: dict[str, bytes]) -> str:
    """A package's hash: the SHA-256 of its files' relative paths and SHA-256s, in path order."""
    h = hashlib.sha256()
    for rel in sorted(sources):
        h.update(f"{rel}\0{hashlib.sha256(sources[rel]).hexdigest()}\n".encode())
    return h.hexdigest()


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
    needed = {"model": "build", "dataset": "load", "partition": "split"}[kind]
    if not callable(getattr(entry, needed, None)):
        return [f"{where} has no {needed}() (see docs/methods.md for what a {kind} defines)"]
    return []
