"""Per-client state that persists across rounds (SCAFFOLD's control variate, a previous model).

Clients move between workers from round to round, so their state lives in files of the
run directory that any worker can read: ``client_state/<cid>/r<round>.pt``, one version
per round the client trained in. A worker loads the newest version written before the
current round; versions that a resume from any checkpoint still on disk could need are
kept, older ones are deleted, newer ones are discarded on resume.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

_VERSION = re.compile(r"^r(\d+)\.pt$")


class ClientStateStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _versions(self, cid: int) -> list[int]:
        folder = self.root / str(cid)
        if not folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _VERSION.match(p.name)))

    def load(self, cid: int, rnd: int) -> dict[str, Any] | None:
        """The client's state as written in its latest round before ``rnd`` (None if it never trained)."""
        before = [v for v in self._versions(cid) if v < rnd]
        if not before:
            return None
        return torch.load(self.root / str(cid) / f"r{before[-1]}.pt", map_location="cpu", weights_only=False)

    def save(self, cid: int, rnd: int, state: dict[str, Any], keep_from_round: int) -> None:
        """Write the state after round ``rnd`` (atomically) and delete the versions that no resume at
        round ``keep_from_round`` or later can need."""
        folder = self.root / str(cid)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".r{rnd}.pt.tmp{os.getpid()}"
        torch.save({k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in state.items()}, tmp)
        os.replace(tmp, folder / f"r{rnd}.pt")
        needed = [v for v in self._versions(cid) if v < keep_from_round]
        keep_from = needed[-1] if needed else 0
        for v in self._versions(cid):
            if v < keep_from:
                (folder / f"r{v}.pt").unlink(missing_ok=True)

    def discard_from(self, rnd: int) -> None:
        """Delete every version written in round ``rnd`` or later (on resume from a checkpoint at ``rnd``)."""
        if not self.root.is_dir():
            return
        for folder in self.root.iterdir():
            for p in folder.iterdir():
                m = _VERSION.match(p.name)
                if (m and int(m.group(1)) >= rnd) or p.name.startswith("."):
                    p.unlink(missing_ok=True)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
