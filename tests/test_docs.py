"""The documentation that is generated from the code stays in sync with it."""
import inspect
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


def test_a_page_is_current_for_the_code_or_for_its_committed_part(tmp_path, monkeypatch):
    monkeypatch.setattr(docs, "uncommitted", lambda: set())
    for name, text in docs.pages().items():
        (tmp_path / name).write_text(text)
    assert docs.stale_pages(tmp_path) == []
    without = docs.pages({("algorithm", "fedprox")})
    assert "`fedprox`" not in without["algorithms.md"] and "algorithm: fedprox" not in without["config-reference.md"]
    assert "`fedprox`" in docs.pages()["algorithms.md"]
    (tmp_path / "algorithms.md").write_text(without["algorithms.md"])
    assert docs.stale_pages(tmp_path) == ["algorithms.md"]          # fedprox is committed: the page must list it
    monkeypatch.setattr(docs, "uncommitted", lambda: {("algorithm", "fedprox")})
    assert docs.stale_pages(tmp_path) == []                           # ... unless git does not track its file yet
    (tmp_path / "algorithms.md").write_text(docs.pages()["algorithms.md"])
    assert docs.stale_pages(tmp_path) == []                           # listing it already is current too
    (tmp_path / "algorithms.md").write_text("edited by hand\n")
    assert docs.stale_pages(tmp_path) == ["algorithms.md"]
    (tmp_path / "models.md").unlink()
    assert docs.stale_pages(tmp_path) == ["algorithms.md", "models.md"]


def test_uncommitted_names_the_plugins_whose_files_git_does_not_track(monkeypatch):
    fedprox = Path(inspect.getsourcefile(ALGORITHMS.get("fedprox")))
    monkeypatch.setattr(docs, "untracked_source_files", lambda: [fedprox, fedprox.parent / "notes.txt"])
    assert docs.uncommitted() == {("algorithm", "fedprox")}
    monkeypatch.setattr(docs, "untracked_source_files", lambda: None)      # not a git checkout
    assert docs.uncommitted() == set()


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
