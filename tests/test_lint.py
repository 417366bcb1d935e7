"""The code passes the linter: ruff, with pyproject.toml's settings (pycodestyle and pyflakes, lines
of at most 120 columns), over the package, the tests and the benchmarks."""
import subprocess
import sys

from conftest import REPO


def test_ruff_finds_nothing():
    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "mpifed", "tests", "benchmarks"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"ruff check (fix these, or run `ruff check --fix`):\n{p.stdout}{p.stderr}"
