"""A non-editable install in a fresh virtual environment runs everything from outside the repository."""
import json
import os
import site
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
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    see_these_tests_packages(venv)
    build = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
                            "--no-build-isolation", str(REPO)], cwd=tmp, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
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


def see_these_tests_packages(venv):
    """Give ``venv`` the packages of the interpreter running the tests (pip, setuptools, wheel and
    mpifed's dependencies), after its own: a .pth file that adds this interpreter's site folders.
    (``venv --system-site-packages`` would give the base interpreter's instead, which inside a
    virtualenv or a conda env lacks them.)"""
    folders = [d for d in dict.fromkeys([*site.getsitepackages(), *(
        [site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]) if os.path.isdir(d)]
    own = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(own, "zz-tests-packages.pth"), "w") as f:
        f.write("".join(f"import site; site.addsitedir({d!r})\n" for d in folders))


def test_commands_and_a_debug_run_of_the_shipped_quick_start(installed):
    where = installed("python", "-c", "import mpifed; print(mpifed.__file__)")
    assert where.startswith(str(installed.venv)), where
    for tool in ("mpifed", "mpifed-prepare", "mpifed-table"):
        assert installed(tool, "--version").strip() == f"mpifed {__version__}"
    assert "--download" in installed("mpifed-prepare", "--help")
    vocab = installed("python", "-c", "from mpifed.data.tokenize import tokenizer_file; "
                                      "print(tokenizer_file('configs/repro/fedgkd/fortunes-wordpiece'))").strip()
    assert vocab.startswith(str(installed.venv)) and vocab.endswith("vocab.txt")
    assert "sbatch slurm/cpu.sbatch" in installed("mpifed", "slurm")
    assert (installed.work / "slurm" / "array.sbatch").is_file() and (installed.work / "slurm" / "common.sh").is_file()
    assert "configs/papers/fedntd/table1.table.yaml" in installed("mpifed", "config", "list").split()
    assert "run.name=mnist-shard2-fedavg-s0" in installed("mpifed-table", "configs/papers/fedntd/table1.table.yaml",
                                                          "--list", "--commands")
    out = installed("mpifed", "run", "--config", "configs/quickstart.yaml", "--set", "train.rounds=1", "run.name=q")
    assert "round 1/1" in out
    assert json.loads((installed.work / "runs" / "q" / "status.json").read_text())["state"] == "finished"


@pytest.mark.mpi
def test_mpifed_launch_without_a_clone(has_mpirun, installed):
    out = installed("mpifed", "launch", "-n", "3", "--config", "configs/quickstart.yaml", "--set", "train.rounds=1",
                    "run.name=q3")
    assert "MPI, 3 ranks" in out
    assert json.loads((installed.work / "runs" / "q3" / "status.json").read_text())["state"] == "finished"
