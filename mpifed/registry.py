"""``mpifed.registry``: the public path of :mod:`mpifed.plugin.registry` (see docs/architecture.md)."""
import sys

from mpifed.plugin import registry as _home
from mpifed.plugin.registry import *  # noqa: F403  (its names, for type checkers)

sys.modules[__name__] = _home
