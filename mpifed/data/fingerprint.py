"""A fingerprint of the raw files a prepared folder was made from, and the check against it.

The manifest records each raw file's absolute path, size and modification time, and each
file's SHA-256 when they are small enough to hash at every start-up (``HASH_LIMIT`` bytes in
all). A run compares the files on disk with it before using the shards: a file whose size or
content changed stops the run, naming that file (with no content hash, a newer modification
time counts as a change). A recorded file that no longer exists is not an error (the raw data
may be deleted once prepared). Manifests written before per-file hashes hold one SHA-256 over
all the files; they are still checked, naming the files whose time changed.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

HASH_LIMIT = 32 * 2**20


def fingerprint(files: list[Path]) -> dict[str, Any]:
    """The fingerprint of ``files`` (in their order)."""
    entries = []
    for f in files:
        if not os.path.exists(f):
            continue
        st = os.stat(f)
        entries.append({"path": str(Path(f).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    if sum(e["size"] for e in entries) <= HASH_LIMIT:
        for e in entries:
            e["sha256"] = _digest([Path(e["path"])])
    return {"files": entries}


def first_change(recorded: dict[str, Any]) -> str | None:
    """How the raw files differ from ``recorded`` (naming the changed files), or None."""
    present, touched, altered = [], [], []
    for e in recorded.get("files", []):
        path = Path(e["path"])
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if st.st_size != e["size"]:
            return f"{path} changed size ({e['size']} bytes when prepared, {st.st_size} now)"
        if e.get("sha256"):
            if _digest([path]) != e["sha256"]:  # the same bytes copied again (a newer time) are no change
                altered.append(path)
            continue
        if st.st_mtime_ns != e["mtime_ns"]:
            touched.append(path)
        present.append(path)
    if altered:
        return f"the content of {', '.join(str(p) for p in altered)} changed"
    if recorded.get("sha256") and len(present) == len(recorded["files"]):
        if _digest(present) == recorded["sha256"]:
            return None   # rewritten or copied again with the same bytes
        changed = touched or present
        return f"the content of the raw files ({', '.join(str(p) for p in changed)}) changed"
    if touched:
        return f"{touched[0]} was modified after the data was prepared"
    return None


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        if f.is_dir():   # a folder of images: its entries' names
            h.update("\n".join(sorted(os.listdir(f))).encode())
            continue
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()
