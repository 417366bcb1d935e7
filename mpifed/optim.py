"""``mpifed.optim``: the public path of :mod:`mpifed.local.optim` (see docs/architecture.md)."""
import sys

from mpifed.local import optim as _home
from mpifed.local.optim import *  # noqa: F403  (its names, for type checkers)

sys.modules[__name__] = _home
