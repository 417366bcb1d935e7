"""``python -m mpifed.evaluate``: the public path of :mod:`mpifed.entry.evaluate` (see docs/architecture.md)."""
import sys

from mpifed.entry import evaluate as _home
from mpifed.entry.evaluate import *  # noqa: F403  (its names, for type checkers)

if __name__ == "__main__":
    sys.exit(_home.main())
sys.modules[__name__] = _home
