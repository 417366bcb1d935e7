"""The documentation that is generated from the code stays in sync with it."""
from pathlib import Path

import pytest

from mpifed.entry import docs
from mpifed.plugin.registry import ALGORITHMS

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stale():
    return docs.stale_pages(REPO / "docs")


@pytest.mark.parametrize("name", sorted(docs.pages()))
def test_generated_page_is_current(name, stale):
    assert name not in stale, f"docs/{name} is stale: run python -m mpifed.docs"


def test_a_page_is_checked_only_for_the_entries_it_was_generated_from(tmp_path):
    for name, text in docs.pages().items():
        (tmp_path / name).write_text(text)
    assert docs.stale_pages(tmp_path) == []
    without = docs.pages({("algorithm", "fedprox")})
    assert "| `fedprox` |" not in without["algorithms.md"]
    assert "`algorithm: fedprox`" not in without["config-reference.md"]
    assert "| `fedprox` |" in docs.pages()["algorithms.md"]
    assert docs.listed_entries(without["algorithms.md"])["algorithm"] == [
        n for n in ALGORITHMS.names() if n != "fedprox"]
    (tmp_path / "algorithms.md").write_text(without["algorithms.md"])
    (tmp_path / "config-reference.md").write_text(without["config-reference.md"])
    assert docs.stale_pages(tmp_path) == []                 # a method the pages do not list yet: a one-file change
    (tmp_path / "algorithms.md").write_text(without["algorithms.md"].replace("# Algorithms", "# Methods"))
    assert docs.stale_pages(tmp_path) == ["algorithms.md"]  # what it lists must be what the code says
    gone = docs.pages()["algorithms.md"].replace("from algorithm: ", "from algorithm: fedgone, ")
    (tmp_path / "algorithms.md").write_text(gone)
    assert docs.stale_pages(tmp_path) == ["algorithms.md"]  # lists a method the code no longer registers
    (tmp_path / "algorithms.md").write_text("edited by hand\n")
    assert docs.stale_pages(tmp_path) == ["algorithms.md"]
    (tmp_path / "models.md").unlink()
    assert docs.stale_pages(tmp_path) == ["algorithms.md", "models.md"]


def test_the_check_command_writes_nothing_and_says_which_page_is_stale(monkeypatch, capsys):
    monkeypatch.setattr(docs, "stale_pages", lambda folder: ["models.md"])
    assert docs.main(["--check"]) == 1
    assert capsys.readouterr().out == "docs/models.md is stale: run python -m mpifed.docs\n"
    monkeypatch.setattr(docs, "stale_pages", lambda folder: [])
    assert docs.main(["--check"]) == 0


def test_readme_test_command_is_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in readme
