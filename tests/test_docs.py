"""The documentation that is generated from the code stays in sync with it."""
from pathlib import Path

from mpifed import config

REPO = Path(__file__).resolve().parents[1]


def test_config_reference_is_current():
    doc = (REPO / "docs" / "config-reference.md").read_text()
    assert config.reference().strip() in doc, "regenerate docs/config-reference.md (see its first lines)"


def test_readme_test_command_is_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in readme
