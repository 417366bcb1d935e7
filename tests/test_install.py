"""A non-editable install in a fresh virtual environment runs everything from outside the repository."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from mpifed import __version__

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """run(*command) in a folder outside the repository, with mpifed pip-installed (not editable) in a venv."""
    tmp = tmp_path_factory.mktemp("install")
    venv = tmp / "venv"        # pip, setuptools and the dependencies come from the system site-packages
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    str(REPO)], check=True, cwd=tmp, capture_output=True)
    work = tmp / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MPIFED_MPI", "PYTHON")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"

    def run(*cmd):
        p = subprocess.run(list(cmd), cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{cmd}: {p.stdout}\n{p.stderr}"
        return p.stdout
    run.work, run.venv = work, venv
    return run


def test_commands_and_a_debug_run_of_the_shipped_quick_start(installed):
    where = installed("python", "-c", "import mpifed; print(mpifed.__file__)")
    assert where.startswith(str(installed.venv)), where
    for tool in ("mpifed", "mpifed-prepare", "mpifed-table"):
        assert installed(tool, "--version").strip() == f"mpifed {__version__}"
    assert "--download" in installed("mpifed-prepare", "--help")
    assert "configs/papers/fedntd/table1.table.yaml" in installed("mpifed", "config", "list").split()
    assert "mnist-shard2-fedavg-s0" in installed("mpifed-table", "configs/papers/fedntd/table1.table.yaml", "--list")
    out = installed("mpifed", "run", "--config", "configs/quickstart.yaml", "--set", "train.rounds=1", "run.name=q")
    assert "round 1/1" in out
    assert json.loads((installed.work / "runs" / "q" / "status.json").read_text())["state"] == "finished"


@pytest.mark.mpi
def test_mpifed_launch_without_a_clone(has_mpirun, installed):
    out = installed("mpifed", "launch", "-n", "3", "--config", "configs/quickstart.yaml", "--set", "train.rounds=1",
                    "run.name=q3")
    assert "MPI, 3 ranks" in out
    assert json.loads((installed.work / "runs" / "q3" / "status.json").read_text())["state"] == "finished"
