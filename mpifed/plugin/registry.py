"""Named plug-ins of one kind (algorithms, models, data sets, partitions, server optimisers, selections,
aggregations), one way for all.

An entry registers itself where it is defined, with an explicit name::

    @ALGORITHMS.register("fedprox")
    class FedProx(Algorithm): ...

A registry fills itself on first use by importing the modules it is told about (every
module of a package, or a single module), so a new entry is one new file in that
package. A name registered twice is an error at import time. Registering is all a plug-in
module does with a registry while it is imported: a look-up then (which would need the
entries still being imported) is an error.

An entry may define ``check_config(cfg) -> list[str]``: the problems of the rest of the
run's configuration for this entry, each naming the fix (:func:`mpifed.settings.validate.entry_checks`).
This module imports nothing of mpifed; reading a registry imports its plug-ins.
"""
from __future__ import annotations

import difflib
import importlib
import pkgutil
import re
from typing import Callable, Generic, Iterable, Iterator, TypeVar

T = TypeVar("T")

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class RegistryError(RuntimeError):
    """A registration is invalid (a duplicate or malformed name)."""


class Registry(Generic[T]):
    """Entries of one kind by name, discovered from ``modules`` (packages are walked)."""

    def __init__(self, kind: str, *modules: str) -> None:
        self.kind = kind
        self.modules = modules
        self._entries: dict[str, T] = {}
        self._loaded = False
        self._loading = False

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: add the decorated object under ``name`` (lower-case letters, digits, '_')."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise RegistryError(f"{self.kind} name {name!r} must be lower-case letters, digits and '_', starting with "
                                "a letter")

        def add(entry: T) -> T:
            old = self._entries.get(name)
            if old is not None and old is not entry:
                raise RegistryError(f"{self.kind} {name!r} is registered twice: by {_where(old)} and by "
                                    f"{_where(entry)}; rename one of them")
            self._entries[name] = entry
            return entry
        return add

    def _load(self) -> None:
        if self._loaded:
            return
        if self._loading:
            raise RegistryError(f"the {self.kind} registry was read while its modules were being imported; a module "
                                f"of {', '.join(self.modules)} must not look {self.kind}s up at import time "
                                f"(do it inside a function)")
        self._loading = True
        try:
            for name in self.modules:
                module = importlib.import_module(name)
                if hasattr(module, "__path__"):
                    for info in pkgutil.iter_modules(module.__path__):
                        importlib.import_module(f"{name}.{info.name}")
        finally:
            self._loading = False
        self._loaded = True

    def get(self, name: str) -> T:
        """The entry ``name``; an unknown name raises KeyError naming the nearest known one."""
        self._load()
        if name not in self._entries:
            close = nearest(name, self._entries)
            hint = f" Did you mean {close!r}?" if close else ""
            raise KeyError(f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(sorted(self._entries))}")
        return self._entries[name]

    def display_name(self, name: str) -> str:
        """How papers write the entry: the first word of its docstring when that word is ``name`` in
        another case or spelling (fedntd: FedNTD, fedgkd_plus: FedGKD+), else ``name``."""
        words = (self.get(name).__doc__ or "").split()
        first = words[0].rstrip(":,.") if words else ""
        return first if _fold(first) == _fold(name) else name

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def forget(self, name: str) -> None:
        """Remove the entry ``name`` (a plugin being unloaded, or reloaded after its file changed)."""
        self._entries.pop(name, None)

    def items(self) -> dict[str, T]:
        self._load()
        return dict(sorted(self._entries.items()))

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def nearest(name: object, known: Iterable[str]) -> str | None:
    """The known name ``name`` most likely means: the same letters and digits in another case or
    spelling (FedNTD: fedntd, FedGKD+: fedgkd_plus), else the closest spelling, else None."""
    known = list(known)
    folded = {_fold(k): k for k in known}
    if _fold(name) in folded:
        return folded[_fold(name)]
    close = difflib.get_close_matches(str(name).lower(), known, n=1, cutoff=0.5)
    return close[0] if close else None


def _fold(name: object) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower().replace("+", "plus"))


def _where(entry: object) -> str:
    return f"{getattr(entry, '__module__', '?')}.{getattr(entry, '__qualname__', type(entry).__name__)}"


ALGORITHMS: Registry = Registry("algorithm", "mpifed.algorithms")
MODELS: Registry = Registry("model", "mpifed.models")
DATASETS: Registry = Registry("data set", "mpifed.data.sets")
PARTITIONS: Registry = Registry("partition", "mpifed.data.partitions")
SERVER_OPTIMIZERS: Registry = Registry("server optimizer", "mpifed.federation.server_optimizers")
SELECTORS: Registry = Registry("selection", "mpifed.federation.selection")
AGGREGATIONS: Registry = Registry("aggregation", "mpifed.federation.async_rules")
