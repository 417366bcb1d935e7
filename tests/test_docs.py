"""The documentation that is generated from the code stays in sync with it."""
from pathlib import Path

import pytest

from mpifed.entry.docs import pages

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name,text", sorted(pages().items()))
def test_generated_page_is_current(name, text):
    assert (REPO / "docs" / name).read_text() == text, f"docs/{name} is stale: run python -m mpifed.docs"


def test_readme_test_command_is_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in readme
