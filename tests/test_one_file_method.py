"""A new method is one file: the example of docs/methods.md, and copies of three shipped methods under
new names, dropped into a copy of the package (and committed there), are found by the registry, train, pass
the unit checks of every test file that reads the registry, docs included, and get their generated docs
when ``python -m mpifed.docs`` is run, with no other file touched."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

NAME = "fedavg_smooth"
SHIPPED = ("fedprox", "fedntd", "fedgkd")     # each copied to mpifed/algorithms/<name>_copy.py
REGISTER = re.compile(r'@ALGORITHMS\.register\("(\w+)"\)')


def renamed(source: str) -> tuple[str, list[str]]:
    """A method file's source with each method it registers renamed ``<name>_copy``, and those new names."""
    names = [f"{name}_copy" for name in REGISTER.findall(source)]
    return REGISTER.sub(lambda m: f'@ALGORITHMS.register("{m.group(1)}_copy")', source), names


def example() -> str:
    """The whole method file that docs/methods.md shows under "Adding an algorithm"."""
    guide = (REPO / "docs" / "methods.md").read_text()
    found = re.search(rf"`mpifed/algorithms/{NAME}\.py`.*?```python\n(.*?)```", guide, re.S)
    assert found, f"docs/methods.md shows no mpifed/algorithms/{NAME}.py example"
    return found.group(1)


@pytest.mark.e2e
def test_a_method_file_in_a_copy_of_the_package_is_all_a_new_method_needs(tmp_path):
    for part in ("mpifed", "tests", "docs", ".ci"):
        shutil.copytree(REPO / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md", ".gitignore"):
        shutil.copy(REPO / part, tmp_path)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the package as shipped"]):
        subprocess.run(git + command, check=True, capture_output=True, timeout=120)
    (tmp_path / "mpifed" / "algorithms" / f"{NAME}.py").write_text(example())
    copies = []
    for shipped in SHIPPED:
        source, names = renamed((REPO / "mpifed" / "algorithms" / f"{shipped}.py").read_text())
        assert f"{shipped}_copy" in names
        (tmp_path / "mpifed" / "algorithms" / f"{shipped}_copy.py").write_text(source)
        copies += names
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def run(*args):
        p = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"{args}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        return p.stdout

    found = run("-c", f"from mpifed.registry import ALGORITHMS; print(ALGORITHMS.get('{NAME}').__module__)")
    assert found.strip() == f"mpifed.algorithms.{NAME}"
    subprocess.run(git + ["add", "mpifed/algorithms"], check=True, capture_output=True, timeout=120)
    subprocess.run(git + ["commit", "-q", "-m", "four method files"], check=True, capture_output=True, timeout=120)
    # committed or not, the new files are all a method needs: the unit checks of every test file that reads the
    # registry, and the new methods' terms against FedAvg (trains short runs); the generated pages, written
    # before the new files, are checked for the methods they list
    readers = sorted(f"tests/{path.name}" for path in (tmp_path / "tests").glob("test_*.py")
                     if "ALGORITHMS" in path.read_text() and path.name != "test_one_file_method.py")
    run("-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "unit", *readers)
    collected = run("-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", "tests/test_method_behaviour.py")
    acting = [name for name in (NAME, *copies) if f"test_the_method_term_acts[{name}]" in collected]
    assert {NAME, *(f"{shipped}_copy" for shipped in SHIPPED)} <= set(acting)
    terms = [f"tests/test_method_behaviour.py::test_the_method_term_acts[{name}]" for name in acting]
    run("-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *terms)
    run("-m", "mpifed.docs", "--check")
    run("-m", "mpifed.docs")
    listed = (tmp_path / "docs" / "algorithms.md").read_text()
    assert f"`{NAME}`" in listed and "FedAvg with label smoothing" in listed and "`smoothing` = `0.1`" in listed
    assert all(f"`{name}`" in listed for name in copies)
    assert NAME not in (REPO / "docs" / "algorithms.md").read_text()
    run("-m", "mpifed.docs", "--check")                                              # the written pages are current
    (tmp_path / "mpifed" / "algorithms" / "fedprox_copy.py").unlink()
    stale = subprocess.run([sys.executable, "-m", "mpifed.docs", "--check"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert stale.returncode == 1 and "docs/algorithms.md is stale" in stale.stdout   # lists a method now gone
