"""``mpifed.api``: the public path of :mod:`mpifed.entry.api` (see docs/architecture.md)."""
import sys

from mpifed.entry import api as _home
from mpifed.entry.api import *  # noqa: F403  (its names, for type checkers)

sys.modules[__name__] = _home
