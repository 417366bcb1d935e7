"""A new method is one file: the example of docs/methods.md, and a copy of a shipped method under a
new name, dropped into a copy of the package, are found by the registry, train, pass the checks
that enumerate methods, and get their generated docs, with no other file touched."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO

NAME = "fedavg_smooth"
COPY = "fedntd_copy"      # mpifed/algorithms/fedntd.py under another name


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
    shipped = (REPO / "mpifed" / "algorithms" / "fedntd.py").read_text()
    assert shipped.count('@ALGORITHMS.register("fedntd")') == 1
    (tmp_path / "mpifed" / "algorithms" / f"{COPY}.py").write_text(
        shipped.replace('@ALGORITHMS.register("fedntd")', f'@ALGORITHMS.register("{COPY}")'))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    def run(*args):
        p = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"{args}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        return p.stdout

    found = run("-c", f"from mpifed.registry import ALGORITHMS; print(ALGORITHMS.get('{NAME}').__module__)")
    assert found.strip() == f"mpifed.algorithms.{NAME}"
    # the copy's own checks that enumerate methods, and the new method's term against FedAvg (trains 3 short
    # runs); its generated pages need not list the two files git does not track yet
    run("-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "tests/test_docs.py", "tests/test_imports.py",
        "tests/test_steps.py::test_which_methods_capture_their_step_follows_from_what_they_declare",
        "tests/test_server_state.py", "tests/test_report.py::test_a_method_keeps_its_colour_in_every_figure",
        "tests/test_method_behaviour.py::test_every_switch_names_an_option_of_its_method",
        *[f"tests/test_method_behaviour.py::test_the_method_term_acts[{name}]" for name in (NAME, COPY)])
    run("-m", "mpifed.docs")
    listed = (tmp_path / "docs" / "algorithms.md").read_text()
    assert f"`{NAME}`" in listed and "FedAvg with label smoothing" in listed and "`smoothing` = `0.1`" in listed
    assert f"`{COPY}`" in listed
    assert NAME not in (REPO / "docs" / "algorithms.md").read_text()
    run("-m", "mpifed.docs", "--check")                                              # the written pages are current
    subprocess.run(git + ["add", "mpifed/algorithms"], check=True, capture_output=True, timeout=120)
    (tmp_path / "docs" / "algorithms.md").write_text((REPO / "docs" / "algorithms.md").read_text())
    stale = subprocess.run([sys.executable, "-m", "mpifed.docs", "--check"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
    assert stale.returncode == 1 and "docs/algorithms.md is stale" in stale.stdout   # tracked: it must be listed
