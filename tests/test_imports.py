"""The modules of mpifed depend on each other one way: no import cycle, at import time or at run time,
and no import up the layers of docs/architecture.md's module table.

The graph is read from the source: every import a module can run (at module level or inside
a function; ``if TYPE_CHECKING:`` blocks excluded), and every registry it reads (reading a
registry imports the registry's plug-in modules). Registering (``@ALGORITHMS.register``) is
not a read. A package's ``__init__`` counts for what it imports itself, not for the imports of
its submodules.
"""
from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mpifed
from mpifed import registry

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


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST):
    """Every node under ``node``, skipping the bodies of ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if _type_checking(child):
            for other in child.orelse:
                yield other
                yield from _walk(other)
            continue
        yield child
        yield from _walk(child)


def dependencies(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The mpifed modules that module ``name`` imports or reads through a registry."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    deps: set[str] = set()
    registry_names: dict[str, str] = {}      # local name -> registry name (ALGORITHMS, ...)
    registry_module: set[str] = set()        # local names bound to the mpifed.registry module
    nodes = list(_walk(tree))
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
                    if target == "mpifed.registry":
                        registry_module.add(alias.asname or alias.name)
                elif base in modules:
                    deps.add(base)
                    if base == "mpifed.registry" and alias.name in REGISTRIES:
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


def layers(text: str) -> list[tuple[str, list[str]]]:
    """The module table of docs/architecture.md's "Modules, one way down", top layer first:
    (layer, its modules as written, e.g. ``data.store`` or ``algorithms/*``)."""
    section = text.split("## Modules, one way down", 1)[1].split("\n## ", 1)[0]
    rows = [re.match(r"\| ([^|]+) \| ([^|]+) \|", line) for line in section.splitlines()]
    return [(m.group(1).strip(), re.findall(r"`([a-z_./*]+)`", m.group(2)))
            for m in rows if m and m.group(1).strip() not in ("layer", "---")]


def layer_of(module: str, table: list[tuple[str, list[str]]]) -> int | None:
    """The index in ``table`` of the layer listing ``module`` (``mpifed.x.y``), or None."""
    name = module.removeprefix("mpifed.")
    for index, (_, modules) in enumerate(table):
        for entry in modules:
            package = entry.removesuffix("/*").replace("/", ".")
            if name == package or (entry.endswith("/*") and name.startswith(package + ".")):
                return index
    return None


def upward_imports(graph: dict[str, set[str]], table: list[tuple[str, list[str]]]) -> list[str]:
    """Every dependency of a module on one in a layer above its own, as 'a (layer) -> b (layer)'."""
    found = []
    for module, deps in sorted(graph.items()):
        own = layer_of(module, table)
        for dep in sorted(deps):
            other = layer_of(dep, table)
            if own is not None and other is not None and other < own:
                found.append(f"{module} ({table[own][0]}) -> {dep} ({table[other][0]})")
    return found


def test_every_module_sits_in_one_layer_of_the_architecture_table():
    table = layers(ARCHITECTURE.read_text())
    listed = [entry for _, modules in table for entry in modules]
    assert len(listed) == len(set(listed)), "a module is listed in two layers"
    packages = {"mpifed", "mpifed.data"}            # bare packages: their __init__ imports nothing
    assert all(not import_graph()[p] for p in packages)
    unlisted = sorted(m for m in module_files() if m not in packages and layer_of(m, table) is None)
    assert not unlisted, f"add these to docs/architecture.md's module table: {unlisted}"


def test_no_module_imports_a_layer_above_its_own():
    found = upward_imports(import_graph(), layers(ARCHITECTURE.read_text()))
    assert not found, ("imports up docs/architecture.md's layers (move a module, or the import):\n"
                       + "\n".join(found))


def test_an_upward_import_is_found():
    table = [("top", ["main"]), ("middle", ["config"]), ("plug-ins", ["algorithms/*"])]
    graph = {"mpifed.main": {"mpifed.config"}, "mpifed.config": {"mpifed.algorithms.fedavg"},
             "mpifed.algorithms.fedavg": {"mpifed.config"}}
    assert upward_imports(graph, table) == ["mpifed.algorithms.fedavg (plug-ins) -> mpifed.config (middle)"]


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_a_cycle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_registry_reads_and_function_level_imports_count():
    graph = import_graph()
    assert "mpifed.algorithms.fedprox" in graph["mpifed.config"]       # config reads ALGORITHMS
    assert "mpifed.registry" in graph["mpifed.algorithms.fedprox"]        # registering is an import, not a read
    assert "mpifed.algorithms.fedavg" not in graph["mpifed.algorithms.fedprox"]
    assert "mpifed.checkpoint" in graph["mpifed.main"]                   # a function-level import


def test_plugins_import_nothing_of_the_config():
    """Algorithms, models, data sets and partitions take their option helpers from mpifed.options;
    mpifed.options imports nothing of mpifed, and importing a plug-in does not load the config."""
    graph = import_graph()
    assert graph["mpifed.options"] == set()
    code = ("import sys; import mpifed.algorithms.fedprox, mpifed.models.resnet, mpifed.data.sets.cifar, "
            "mpifed.data.partitions; print('mpifed.config' in sys.modules)")
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
    """mpifed.main blocks the stop signals before numpy or torch start their threads, so importing
    it must not load them."""
    code = "import sys, mpifed.main; print(sorted(m for m in ('numpy', 'torch', 'mpi4py') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
