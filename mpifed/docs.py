"""``python -m mpifed.docs``: the public path of :mod:`mpifed.entry.docs` (see docs/architecture.md)."""
import sys

from mpifed.entry import docs as _home
from mpifed.entry.docs import *  # noqa: F403  (its names, for type checkers)

if __name__ == "__main__":
    sys.exit(_home.main())
sys.modules[__name__] = _home
