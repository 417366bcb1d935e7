"""Registry of federated algorithms: every module in this package that defines a subclass
of :class:`~mpifed.algorithms.base.Algorithm` with a ``name`` is found automatically, so a
new method is one new file here."""
from __future__ import annotations

import importlib
import pkgutil

from mpifed.algorithms.base import Algorithm

_REGISTRY: dict[str, type[Algorithm]] = {}


def _discover() -> dict[str, type[Algorithm]]:
    if not _REGISTRY:
        for info in pkgutil.iter_modules(__path__):
            if info.name == "base":
                continue
            module = importlib.import_module(f"{__name__}.{info.name}")
            for obj in vars(module).values():
                if isinstance(obj, type) and issubclass(obj, Algorithm) and obj.__module__ == module.__name__:
                    _REGISTRY[obj.name] = obj
    return _REGISTRY


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered as ``name``."""
    registry = _discover()
    if name not in registry:
        raise KeyError(f"unknown algorithm {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name]


def options_registry() -> dict[str, type]:
    """name -> Options dataclass, for config validation."""
    return {name: cls.Options for name, cls in _discover().items()}
