"""``mpifed.losses``: the public path of :mod:`mpifed.local.losses` (see docs/architecture.md)."""
import sys

from mpifed.local import losses as _home
from mpifed.local.losses import *  # noqa: F403  (its names, for type checkers)

sys.modules[__name__] = _home
