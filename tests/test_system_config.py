"""The ``system:`` section and the ``selection:`` choice: off by default (a run's identity is the one it
had before them), checked with errors that name the fix."""
import pytest

from mpifed.plugin.options import ConfigError
from mpifed.settings import config


def test_defaults_leave_the_identity_of_a_run_unchanged():
    cfg, d = config.load(None, [])
    assert not cfg.system.clock and cfg.selection.name == "uniform"
    fingerprint = config.math_fingerprint(d)
    assert "system" not in fingerprint and "selection" not in fingerprint
    _, on = config.load(None, ["system.clock=true"])
    assert config.math_fingerprint(on)["system"]["clock"] is True
    _, oort = config.load(None, ["selection.name=oort"])
    assert config.math_fingerprint(oort)["selection"]["name"] == "oort"


def test_a_checkpoint_from_before_the_sections_resumes():
    _, d = config.load(None, [])
    stored = config.math_fingerprint(d)
    changed, _ = config.checkpoint_changes(stored, d)
    assert changed == []


@pytest.mark.parametrize("sets, says", [
    (["system.dropout=0.2"], "set system.clock=true"),
    (["system.clock=true", "system.availability=on-off"], "set system.deadline"),
    (["selection.name=oorrt"], "Did you mean 'oort'"),
    (["system.clock=true", "system.overcommit=0.5"], "overcommit"),
    (["system.clock=true", "system.deadline=10", "system.availability=on-off", "system.availability_trace=x.csv"],
     "leave system.availability at always"),
])
def test_invalid_settings_name_the_fix(sets, says):
    with pytest.raises(ConfigError, match=says.replace(".", r"\.").replace("(", r"\(")):
        config.load(None, sets)
