"""``python -m mpifed.data.vocab``: the public path of :mod:`mpifed.entry.vocab` (see docs/architecture.md)."""
import sys

from mpifed.entry import vocab as _home
from mpifed.entry.vocab import *  # noqa: F403  (its names, for type checkers)

if __name__ == "__main__":
    sys.exit(_home.main())
sys.modules[__name__] = _home
