"""A non-editable install in a fresh virtual environment runs everything from outside the repository."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.e2e


def test_pip_installed_mpifed_runs_without_a_clone(tmp_path):
    venv = tmp_path / "venv"        # pip and setuptools come from the system site-packages
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    str(REPO)], check=True, cwd=tmp_path, capture_output=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MPIFED_MPI")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"

    def run(*cmd):
        p = subprocess.run(list(cmd), cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{cmd}: {p.stdout}\n{p.stderr}"
        return p.stdout

    where = run("python", "-c", "import mpifed; print(mpifed.__file__)")
    assert where.startswith(str(venv)), where
    from mpifed import __version__
    for tool in ("mpifed", "mpifed-prepare", "mpifed-table"):
        assert run(tool, "--version").strip() == f"mpifed {__version__}"
    assert "--download" in run("mpifed-prepare", "--help")
    assert "configs/papers/fedntd/table1.table.yaml" in run("mpifed", "config", "list").split()
    out = run("mpifed", "run", "--config", "configs/quickstart.yaml", "--set", "train.rounds=1", "run.name=q")
    assert "round 1/1" in out
    assert json.loads((work / "runs" / "q" / "status.json").read_text())["state"] == "finished"
