"""``mpifed.config``: the public path of :mod:`mpifed.settings.config` (see docs/architecture.md); and
``python -m mpifed.config``, which is ``mpifed config`` (:mod:`mpifed.entry.configs`)."""
import sys

from mpifed.settings import config as _home
from mpifed.settings.config import *  # noqa: F403  (its names, for type checkers)

if __name__ == "__main__":
    from mpifed.entry.configs import main
    sys.exit(main())
sys.modules[__name__] = _home
