"""The configs shipped inside the package (the repository's ``configs/``, installed as package
data, with the files they name, such as a tokenizer's vocab.txt), so that a pip-installed
mpifed runs the quick start and the paper configs without a clone.

``--config configs/papers/fedntd/cifar10-shard2.yaml`` (or the path without ``configs/``)
reads the file from the current directory when it exists there, else the shipped copy; a
``configs/...`` folder in a config (``data.tokenizer``) is found the same way. ``mpifed config``
(:mod:`mpifed.entry.configs`) lists and copies them.
"""
from __future__ import annotations

from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def find_config(path: str | Path) -> Path:
    """``path`` if it exists, else the shipped config it names (with or without the leading
    ``configs/``), else ``path`` unchanged (for the caller's 'does not exist' message)."""
    found = _shipped(path)
    return found if found.is_file() else Path(path)


def find_folder(path: str | Path) -> Path:
    """``path`` if it exists, else the shipped folder it names (a ``configs/...`` path), else ``path``."""
    found = _shipped(path)
    return found if found.is_dir() else Path(path)


def _shipped(path: str | Path) -> Path:
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts and path.parts[0] == "configs" else path.parts
    return CONFIGS.joinpath(*parts) if parts else CONFIGS


def shipped() -> list[str]:
    """Every shipped config, as the ``configs/...`` path that ``--config`` accepts."""
    return sorted(f"configs/{p.relative_to(CONFIGS).as_posix()}" for p in CONFIGS.rglob("*.yaml"))
