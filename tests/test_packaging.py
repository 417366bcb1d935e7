"""The package asks for ranges of its dependencies; the versions the tests ran with are constraints
that the README's commands pass to pip, so installing mpifed never replaces an environment's torch."""
import configparser
import re

from conftest import REPO


def requirements() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    lines += [line for value in cfg["options.extras_require"].values() for line in value.splitlines()]
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def test_the_metadata_pins_nothing_exactly():
    pinned = [r for r in requirements() if "==" in r or "===" in r]
    assert not pinned, f"setup.cfg pins {pinned}: give a range, and the tested version in constraints.txt"
    torch = next(r for r in requirements() if re.match(r"torch\b", r) and not r.startswith("torchvision"))
    assert ">=" in torch and "<" in torch, torch


def test_constraints_hold_a_tested_version_of_every_core_requirement_and_the_readme_uses_them():
    lines = [line.strip() for line in (REPO / "constraints.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    pinned = dict(line.split("==") for line in lines)
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    core = {re.split(r"[<>=!~ ;\[]", line.split("#")[0].strip(), maxsplit=1)[0].lower()
            for line in cfg["options"]["install_requires"].splitlines() if line.split("#")[0].strip()}
    missing = core - {name.lower() for name in pinned}
    assert not missing, f"constraints.txt lacks {missing}"
    readme = (REPO / "README.md").read_text()
    commands = re.findall(r"```bash\n(pip install[^\n]*)\n```", readme)
    assert len(commands) == 2 and all(c.startswith("pip install -c constraints.txt ") for c in commands), commands
