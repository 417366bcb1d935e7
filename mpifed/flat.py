"""``mpifed.flat``: the public path of :mod:`mpifed.local.flat` (see docs/architecture.md)."""
import sys

from mpifed.local import flat as _home
from mpifed.local.flat import *  # noqa: F403  (its names, for type checkers)

sys.modules[__name__] = _home
