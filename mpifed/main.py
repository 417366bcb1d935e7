"""``python -m mpifed.main``: the public path of :mod:`mpifed.entry.main` (see docs/architecture.md)."""
import sys

from mpifed.entry import main as _home
from mpifed.entry.main import *  # noqa: F403  (its names, for type checkers)

if __name__ == "__main__":
    sys.exit(_home.main())
sys.modules[__name__] = _home
