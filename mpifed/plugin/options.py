"""What a plug-in (an algorithm, a model, a data set, a partition) declares its config keys with.

A registered entry's ``Options`` is a dataclass whose fields are made with :func:`opt`
(or :class:`NoOptions` when it has none); :mod:`mpifed.settings.config` validates them with the rest
of the configuration. A bad setting found only once a run starts (say, on the device a
worker got) is a :class:`ConfigError`, defined here too. This module imports nothing of
mpifed, so a plug-in never loads the configuration code, and the configuration can read the
plug-ins without a cycle.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A configuration problem, with a message that names the key and the fix."""


def opt(default: Any, help: str, *, min: float | None = None, max: float | None = None,
        exclusive_min: bool = False, math: bool = True) -> Any:
    """A config field with its help text and allowed range.

    ``math=False`` marks keys that do not change the numbers a run produces (logging,
    checkpoint frequency, resources); a resumed run may change them.
    """
    meta = {"help": help, "min": min, "max": max, "exclusive_min": exclusive_min, "math": math}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class NoOptions:
    """For registry entries without options."""
