"""The modules of mpifed depend on each other one way: no import cycle, at import time or at run time,
and no import up the folders of docs/architecture.md's tree (a module's layer is the folder it sits in).

The graph is read from the source: every import a module names (at module level, inside a
function, or under ``if TYPE_CHECKING:``, since a type a module names is one it depends on), and
every registry it reads (reading a
registry imports the registry's plug-in modules). Registering (``@ALGORITHMS.register``) is
not a read. A package's ``__init__`` counts for what it imports itself, not for the imports of
its submodules.
"""
from __future__ import annotations

import ast
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mpifed
from mpifed.plugin import registry

ROOT = Path(mpifed.__file__).parent
ARCHITECTURE = ROOT.parent / "docs" / "architecture.md"
REGISTRIES = {name: r for name, r in vars(registry).items() if isinstance(r, registry.Registry)}


def module_files() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def plugin_modules(r: registry.Registry, modules: dict[str, Path]) -> set[str]:
    """The modules a read of ``r`` imports."""
    out = set()
    for name in r.modules:
        out.add(name)
        if modules[name].name == "__init__.py":
            out |= {f"{name}.{info.name}" for info in pkgutil.iter_modules([str(modules[name].parent)])}
    return out


def dependencies(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The mpifed modules that module ``name`` imports or reads through a registry."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps: set[str] = set()
    registry_names: dict[str, str] = {}      # local name -> registry name (ALGORITHMS, ...)
    registry_module: set[str] = set()        # local names bound to the mpifed.plugin.registry module
    nodes = list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    deps.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in modules:
                    deps.add(target)
                    if target == "mpifed.plugin.registry":
                        registry_module.add(alias.asname or alias.name)
                elif base in modules:
                    deps.add(base)
                    if base == "mpifed.plugin.registry" and alias.name in REGISTRIES:
                        registry_names[alias.asname or alias.name] = alias.name
    decorators = {id(d.func.value) for n in nodes if isinstance(n, (ast.ClassDef, ast.FunctionDef))
                  for d in n.decorator_list
                  if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "register"}
    registering = {id(n.func.value) for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and n.func.attr == "register"} | decorators
    for node in nodes:
        read = None
        if isinstance(node, ast.Name) and node.id in registry_names and id(node) not in registering:
            if not isinstance(node.ctx, ast.Load):
                continue
            read = registry_names[node.id]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in registry_module
              and node.attr in REGISTRIES and id(node) not in registering):
            read = node.attr
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and (
                node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in registry_module):
            raise AssertionError(f"{name} reads a registry by a computed name; name it (ALGORITHMS, ...) so this "
                                 f"test can follow the read")
        if read is not None:
            deps |= plugin_modules(REGISTRIES[read], modules)
    deps.discard(name)
    return deps


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: dependencies(name, path, modules) for name, path in modules.items()}


def resolved(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with each import of a public path counted as an import of its home (the same module)."""
    public = aliases()
    return {m: deps if m in public else {public.get(d, d) for d in deps} for m, deps in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_cycle_through(graph, set(component)))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One cycle inside a strongly connected component: a shortest path from its first module back to it."""
    start = min(component)
    previous = {start: None}
    queue = [start]
    for v in queue:
        for w in sorted(graph[v] & component):
            if w == start:
                path = [v]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
            if w not in previous:
                previous[w] = v
                queue.append(w)
    raise AssertionError("not a strongly connected component")


def tree(text: str) -> list[str]:
    """The folders of docs/architecture.md's tree ("The tree, one way down"), top layer first."""
    section = text.split("## The tree, one way down", 1)[1].split("\n## ", 1)[0]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    return re.findall(r"^  ([a-z_]+)/ ", block, flags=re.M)


def alias_home(path: Path) -> str | None:
    """The home of a public-path module (one that puts another module in its place in ``sys.modules``,
    see docs/architecture.md), or None for a module of its own."""
    tree_ = ast.parse(path.read_text(), str(path))
    replaces = any(isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "sys.modules[__name__]"
                   for n in tree_.body)
    if not replaces:
        return None
    (home,) = [f"{n.module}.{n.names[0].name}" for n in tree_.body
               if isinstance(n, ast.ImportFrom) and n.names[0].asname == "_home"]
    return home


def aliases() -> dict[str, str]:
    """Every public path and its home module."""
    return {name: home for name, path in module_files().items() if (home := alias_home(path))}


def layer_of(module: str, folders: list[str]) -> int | None:
    """The index in ``folders`` of the folder holding ``module`` (``mpifed.<folder>...``), or None."""
    parts = module.split(".")
    return folders.index(parts[1]) if len(parts) > 1 and parts[1] in folders else None


def upward_imports(graph: dict[str, set[str]], folders: list[str]) -> list[str]:
    """Every dependency of a module on one in a layer above its own, as 'a (folder) -> b (folder)'."""
    found = []
    for module, deps in sorted(graph.items()):
        own = layer_of(module, folders)
        for dep in sorted(deps):
            other = layer_of(dep, folders)
            if own is not None and other is not None and other < own:
                found.append(f"{module} ({folders[own]}/) -> {dep} ({folders[other]}/)")
    return found


def test_every_module_sits_in_a_folder_of_the_tree():
    folders = tree(ARCHITECTURE.read_text())
    assert len(folders) == len(set(folders)), "a folder is listed twice"
    on_disk = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
    assert sorted(folders) == on_disk, f"docs/architecture.md's tree lists {sorted(folders)}; mpifed/ holds {on_disk}"
    public = aliases()
    top = {"mpifed", "mpifed.__main__"}
    loose = sorted(m for m in module_files() if m not in top and m not in public and layer_of(m, folders) is None)
    assert not loose, f"modules outside the tree's folders (move them into one): {loose}"
    assert not import_graph()["mpifed"]                # the package's __init__ imports nothing


def test_no_module_imports_a_layer_above_its_own():
    public = aliases()
    graph = {m: deps for m, deps in resolved(import_graph()).items() if m not in public}
    found = upward_imports(graph, tree(ARCHITECTURE.read_text()))
    assert not found, ("imports up docs/architecture.md's tree (move a module, or the import):\n"
                       + "\n".join(found))


def test_an_upward_import_is_found():
    folders = ["entry", "settings", "algorithms"]
    graph = {"mpifed.entry.main": {"mpifed.settings.config"}, "mpifed.settings.config": {"mpifed.algorithms.fedavg"},
             "mpifed.algorithms.fedavg": {"mpifed.settings.config"}}
    assert upward_imports(graph, folders) == [
        "mpifed.algorithms.fedavg (algorithms/) -> mpifed.settings.config (settings/)"]


def test_mpifeds_own_modules_import_homes_not_public_paths():
    """A public path is for code outside mpifed: inside, a module imports the home. A plug-in file (a
    method, model, data set or partition) may import either, since a user's file dropped into the
    package imports the public paths, as the docs show."""
    public = aliases()
    plugins = set().union(*(plugin_modules(r, module_files()) for r in REGISTRIES.values()))
    found = sorted(f"{m} imports {d} (import {public[d]})" for m, deps in import_graph().items()
                   if m not in public and m not in plugins for d in deps if d in public)
    assert not found, "\n".join(found)


def test_an_import_of_a_public_path_counts_as_one_of_its_home():
    graph = {"mpifed.algorithms.mine": {"mpifed.registry", "mpifed.local.losses"},
             "mpifed.registry": {"mpifed.plugin.registry"}}
    assert resolved(graph) == {"mpifed.algorithms.mine": {"mpifed.plugin.registry", "mpifed.local.losses"},
                               "mpifed.registry": {"mpifed.plugin.registry"}}


def test_every_public_path_is_its_home_module_and_documented():
    public = aliases()
    text = ARCHITECTURE.read_text().split("## Public paths", 1)[1].split("\n## ", 1)[0]
    documented = dict(re.findall(r"^\| `(mpifed[a-z_.]*)` \| `(mpifed[a-z_.]*)` \|", text, flags=re.M))
    assert documented == public, "docs/architecture.md's public paths differ from the modules that are public paths"
    code = ("import importlib, json; print(json.dumps({p: importlib.import_module(p).__name__ for p in %r}))"
            % sorted(public))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == public


def test_every_public_command_runs():
    """``python -m mpifed.X --help`` for every public path that is a command, and ``python -m mpifed``."""
    commands = [p for p, path in module_files().items()
                if alias_home(path) and 'if __name__ == "__main__":' in path.read_text()]
    assert {"mpifed.main", "mpifed.launch", "mpifed.mps", "mpifed.table", "mpifed.report"} <= set(commands)
    # one interpreter runs each as `python -m` does (runpy, as __main__): one start instead of a dozen
    code = ("import contextlib, io, json, runpy, sys\n"
            "said = {}\n"
            f"for name in {[*commands, 'mpifed']!r}:\n"
            "    sys.argv, out = [name, '--help'], io.StringIO()\n"
            "    try:\n"
            "        with contextlib.redirect_stdout(out):\n"
            "            runpy.run_module(name, run_name='__main__', alter_sys=True)\n"
            "        said[name] = ['no exit', out.getvalue()]\n"
            "    except SystemExit as exc:\n"
            "        said[name] = [exc.code, out.getvalue()]\n"
            "print(json.dumps(said))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    for command, (exit_code, out) in json.loads(p.stdout).items():
        assert exit_code in (0, None) and "usage" in out.lower(), f"python -m {command} --help: {exit_code} {out}"


def test_no_import_cycle():
    found = cycles(resolved(import_graph()))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_registry_reads_and_function_level_imports_count():
    graph = import_graph()
    assert "mpifed.algorithms.fedprox" in graph["mpifed.settings.validate"]     # validation reads ALGORITHMS
    assert "mpifed.plugin.registry" in graph["mpifed.algorithms.fedprox"]        # registering is an import, not a read
    assert "mpifed.algorithms.fedavg" not in graph["mpifed.algorithms.fedprox"]
    assert "mpifed.run.checkpoint" in graph["mpifed.entry.main"]                   # a function-level import


def test_imports_for_type_checking_and_inside_functions_count(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from mpifed.local.flat import FlatModel\n"
                    "else:\n    import mpifed.local.losses\n"
                    "def f():\n    from mpifed.data import raw\n")
    assert dependencies("mpifed.local.mine", path, module_files()) == {
        "mpifed.local.flat", "mpifed.local.losses", "mpifed.data.raw"}


def test_plugins_import_nothing_of_the_config():
    """Algorithms, models, data sets and partitions take their option helpers from mpifed.plugin.options;
    mpifed.plugin.options imports nothing of mpifed, and importing a plug-in loads nothing of settings/."""
    graph = import_graph()
    assert graph["mpifed.plugin.options"] == set()
    code = ("import sys; import mpifed.algorithms.fedprox, mpifed.models.resnet, mpifed.data.sets.cifar, "
            "mpifed.data.partitions; print(any(m.startswith('mpifed.settings') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]


def _package(tmp_path, monkeypatch, name: str, modules: dict[str, str]) -> None:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("from mpifed.registry import Registry\nTHINGS = Registry('thing', __name__)\n")
    for module, text in modules.items():
        (folder / f"{module}.py").write_text(f"from {name} import THINGS\n{text}")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_registry_read_while_its_modules_load_is_an_error(tmp_path, monkeypatch):
    _package(tmp_path, monkeypatch, "reentrant_things", {
        "a": "THINGS.register('a')(object)\n",
        "b": "THINGS.names()\n"})
    import reentrant_things
    with pytest.raises(registry.RegistryError, match="must not look things up at import time"):
        reentrant_things.THINGS.names()


def test_a_registry_whose_module_failed_to_import_loads_again(tmp_path, monkeypatch):
    _package(tmp_path, monkeypatch, "flaky_things", {
        "a": "THINGS.register('a')(object)\n",
        "b": "import os\nif os.environ.get('FLAKY_THINGS') != 'ok':\n    raise ImportError('not yet')\n"
             "THINGS.register('b')(object)\n"})
    import flaky_things
    with pytest.raises(ImportError, match="not yet"):
        flaky_things.THINGS.names()
    monkeypatch.setenv("FLAKY_THINGS", "ok")
    assert flaky_things.THINGS.names() == ["a", "b"]


def test_the_entry_point_imports_no_numerical_library():
    """mpifed.entry.main blocks the stop signals before numpy or torch start their threads, so importing
    it must not load them."""
    code = "import sys, mpifed.entry.main; print(sorted(m for m in ('numpy', 'torch', 'mpi4py') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
