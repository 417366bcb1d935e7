"""``mpifed.options``: the public path of :mod:`mpifed.plugin.options` (see docs/architecture.md)."""
import sys

from mpifed.plugin import options as _home
from mpifed.plugin.options import *  # noqa: F403  (its names, for type checkers)

sys.modules[__name__] = _home
