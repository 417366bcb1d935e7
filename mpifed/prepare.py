"""``python -m mpifed.prepare``: the public path of :mod:`mpifed.entry.prepare` (see docs/architecture.md)."""
import sys

from mpifed.entry import prepare as _home
from mpifed.entry.prepare import *  # noqa: F403  (its names, for type checkers)

if __name__ == "__main__":
    sys.exit(_home.main())
sys.modules[__name__] = _home
