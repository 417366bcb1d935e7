"""``python -m mpifed.table``: the public path of :mod:`mpifed.entry.table` (see docs/architecture.md)."""
import sys

from mpifed.entry import table as _home
from mpifed.entry.table import *  # noqa: F403  (its names, for type checkers)

if __name__ == "__main__":
    sys.exit(_home.main())
sys.modules[__name__] = _home
