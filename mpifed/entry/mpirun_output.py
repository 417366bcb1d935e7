"""mpirun's stderr as the launcher passes it on: the ranks' lines as they come, without the NUL
bytes Open MPI's prterun writes (which make ``grep`` call a log binary), and without the two
banners Open MPI prints when a rank ends the job with MPI_Abort ("MPI_ABORT was invoked on rank
N ..." and "prterun has exited due to process rank N ... calling abort"): the rank has already
said why, and the launcher's last line says how the job ended. Every other banner is kept."""
from __future__ import annotations

import re
import sys
import threading
from typing import IO, Callable

_RULE = re.compile(r"-{74}\s*")     # Open MPI's help banners open and close with a rule of 74 dashes
_LONGEST = 60                        # lines: a "banner" longer than any of Open MPI's is passed on as it is
_ABORT = ("MPI_ABORT was invoked on rank", "calling\n\"abort\"", "calling \"abort\"")


def _abort_banner(block: list[str]) -> bool:
    text = "".join(block)
    return any(mark in text for mark in _ABORT)


class Relay:
    """Copies ``source`` (bytes) to ``write`` line by line in a thread of its own, filtered as the module says."""

    def __init__(self, source: IO[bytes], write: Callable[[str], None] | None = None) -> None:
        self.source = source
        self.out = write or _to_stderr
        self.thread = threading.Thread(target=self._run, name="mpirun-stderr", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        banner: list[str] | None = None
        pending = b""
        while True:
            chunk = self.source.read1(65536) if hasattr(self.source, "read1") else self.source.read(65536)
            if not chunk:
                break
            pending += chunk.replace(b"\0", b"")
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace") + "\n"
                if banner is None and _RULE.fullmatch(line):
                    banner = [line]
                elif banner is not None:
                    banner.append(line)
                    if _RULE.fullmatch(line) or len(banner) > _LONGEST:
                        if not (_RULE.fullmatch(line) and _abort_banner(banner)):
                            self.write("".join(banner))
                        banner = None
                else:
                    self.write(line)
        rest = "".join(banner or []) + pending.decode(errors="replace")
        if rest:
            self.write(rest)

    def write(self, text: str) -> None:
        try:
            self.out(text)
        except (OSError, ValueError):     # the launcher's stderr is gone: keep draining, or mpirun would block
            self.out = _discard

    def join(self, timeout: float = 10.0) -> None:
        """Wait until everything mpirun wrote has been passed on (it has ended)."""
        self.thread.join(timeout)


def _discard(text: str) -> None:
    pass


def _to_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()
