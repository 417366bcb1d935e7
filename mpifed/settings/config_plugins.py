"""The plugins a config names (``--plugin``, a file's ``plugins:``, a ``plugins=`` override), and the
code of the entries a config chooses (its ``code`` section)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mpifed.plugin.options import ConfigError
from mpifed.settings import plugins as plugin_code
from mpifed.settings.overrides import parse_override
from mpifed.settings.schema import CodeConfig, Config


def plugin_specs(value: Any, source: str, relative_to: Path | None) -> list[str]:
    """A ``plugins`` value (a file or module, or a list of them) as a list of specs, file paths made
    absolute relative to ``relative_to`` (the folder of the file that names them; None: the current folder)."""
    if value is None:
        return []
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not all(isinstance(v, str) and v.strip() for v in listed):
        raise ConfigError(f"{source}: plugins must be a list of Python files or modules, e.g. plugins: "
                          f"[my_method.py, mylab.methods], got {value!r}")
    return [plugin_code.resolve_spec(v.strip(), relative_to) for v in listed]


def named_plugins(layers: list[dict[str, Any]], overrides: list[str],
                  plugins: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The plugin specs of ``plugins``, the ``plugins=`` overrides and the files' layers (popped from
    them), in that order without repeats; and those overrides."""
    specs = plugin_specs(list(plugins), "--plugin", None)
    given = [o for o in overrides if o.split("=", 1)[0].strip() == "plugins"]
    for text in given:
        specs += plugin_specs(parse_override(text)["plugins"], f"override {text!r}", None)
    for layer in layers:
        specs += layer.pop("plugins", [])
    return list(dict.fromkeys(specs)), given


def code_of(cfg: Config) -> CodeConfig:
    """The hash of the plugin that defines each entry ``cfg`` chooses (None: mpifed's own), from the
    code loaded in this process."""
    found = {kind: plugin_code.provider(kind, name) for kind, name in chosen_entries(cfg)}
    return CodeConfig(**{kind: p.sha256 if p else None for kind, p in found.items()})


def chosen_entries(cfg: Config) -> list[tuple[str, str]]:
    """The (kind, name) of each registry entry ``cfg`` chooses, as :mod:`mpifed.settings.plugins` names them."""
    return [("algorithm", cfg.algorithm.name), ("model", cfg.model.name), ("dataset", cfg.data.dataset.name),
            ("partition", cfg.data.partition.name), ("selection", cfg.selection.name),
            ("aggregation", cfg.aggregation.name)]
