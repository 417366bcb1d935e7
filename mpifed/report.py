"""``python -m mpifed.report``: the public path of :mod:`mpifed.entry.report` (see docs/architecture.md)."""
import sys

from mpifed.entry import report as _home
from mpifed.entry.report import *  # noqa: F403  (its names, for type checkers)

if __name__ == "__main__":
    sys.exit(_home.main())
sys.modules[__name__] = _home
