"""``python -m mpifed COMMAND ...``: the ``mpifed`` command (:mod:`mpifed.entry.commands`)."""
import sys

from mpifed.entry.commands import main

sys.exit(main())
