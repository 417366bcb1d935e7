"""Loading a config: the defaults, the YAML files, the ``--set`` overrides and the plugins they name,
validated into a :class:`~mpifed.settings.schema.Config`.

Each job has its module: the schema (:mod:`~mpifed.settings.schema`), the YAML layers
(:mod:`~mpifed.settings.layers`), the overrides (:mod:`~mpifed.settings.overrides`), validation
(:mod:`~mpifed.settings.validate`), the plugins a config names (:mod:`~mpifed.settings.config_plugins`),
fingerprints (:mod:`~mpifed.settings.fingerprint`), dotted keys (:mod:`~mpifed.settings.keys`) and
the reference (:mod:`~mpifed.settings.reference`). This module loads; it also names the config's
interface that code outside ``settings/`` uses (``mpifed.config`` is this module), listed in ``__all__``.
"""
from __future__ import annotations

from typing import Any

from mpifed.files.packaged import find_config
from mpifed.local.train_config import TrainConfig
from mpifed.plugin.options import ConfigError
from mpifed.settings import plugins as plugin_code
from mpifed.settings.config_plugins import chosen_entries, code_of, named_plugins, plugin_specs
from mpifed.settings.fingerprint import checkpoint_changes, digest, math_fingerprint, result_fingerprint
from mpifed.settings.keys import diff_keys, lookup
from mpifed.settings.layers import key_sources, merge, per_algorithm, read_yaml
from mpifed.settings.overrides import parse_override
from mpifed.settings.reference import reference
from mpifed.settings.schema import Config, ResourcesConfig, is_choice_path, to_dict
from mpifed.settings.validate import build, build_section, entry_checks, recorded

__all__ = ["Config", "ConfigError", "ResourcesConfig", "TrainConfig", "build", "checkpoint_changes", "chosen_entries",
           "code_of", "diff_keys", "digest", "entry_checks", "load", "load_plugins", "load_resources", "lookup",
           "math_fingerprint", "plugin_specs", "read_yaml", "recorded", "reference", "result_fingerprint", "to_dict"]


def load(paths: list[str] | None = None, overrides: list[str] | None = None,
         base: dict[str, Any] | None = None,
         plugins: list[str] | tuple[str, ...] = ()) -> tuple[Config, dict[str, Any]]:
    """Defaults (or ``base``, e.g. a run's saved config), then each YAML file (with its
    ``per_algorithm`` values for the chosen algorithm), then each ``key=value`` override;
    returns the config and its plain dict.

    Plugins are loaded first: ``plugins`` (a command line's ``--plugin``, relative to the current
    folder), then those the files and overrides name (:func:`read_yaml`); ``base``'s are only
    listed (a resumed run's code is restored from its record, :mod:`mpifed.run.resume`). The
    resolved ``code`` section holds the hash of each plugin that defines a chosen entry.

    ``per_algorithm`` lets a setting file hold the values a paper uses for a method on that
    setting (FedProx's mu per data set, say). They count as written in that file, once the
    algorithm is known: over the files before it, under the files after it (a method file
    that sets mu itself, for a sweep, wins), and under the command line's ``--set``.
    """
    layers = [read_yaml(find_config(p)) for p in paths or []]
    specs, given = named_plugins(layers, overrides or [], plugins)
    for spec in specs:
        plugin_code.load(spec)
    for p, layer in zip(paths or [], layers):
        _not_code(str(p), layer)
    data = merge(to_dict(Config()), base) if base else to_dict(Config())
    listed = data.get("plugins") if isinstance(data.get("plugins"), list) else []
    per_file = [per_algorithm(layer, str(p)) for p, layer in zip(paths or [], layers)]
    for layer in layers:
        data = merge(data, layer)

    # a choice's name first, so that `--set x.opt=1 x.name=y` keeps x.opt
    def picks_choice(o: str) -> bool:
        key = o.split("=", 1)[0].strip()
        return key.endswith(".name") or is_choice_path(tuple(key.split(".")))

    ordered: list[dict[str, Any]] = []
    chosen = data
    for text in sorted((o for o in overrides or [] if o not in given), key=lambda o: not picks_choice(o)):
        ordered.append(_not_code(f"override {text!r}", parse_override(text, chosen)))
        chosen = merge(chosen, ordered[-1])
    algorithm = chosen.get("algorithm", {})
    name = algorithm.get("name") if isinstance(algorithm, dict) else algorithm
    data = chosen   # the algorithm chosen by --set first: its section would replace the per_algorithm values
    for i, section in enumerate(per_file):
        if name in section:
            data = merge(data, section[name])
            for later in layers[i + 1:]:    # a later file still wins over an earlier file's per_algorithm
                data = merge(data, later)
    for o in ordered:
        data = merge(data, o)
    data["plugins"] = list(dict.fromkeys(listed + specs))
    where: dict[str, str] = {}
    for p in paths or []:
        where.update(key_sources(find_config(p)))
    for text in overrides or []:               # the command line's own value: the error names the key only
        where.pop(text.split("=", 1)[0].strip(), None)
    cfg = build(data, where)
    cfg.code = code_of(cfg)
    return cfg, cfg.to_dict()


def load_plugins(paths: list[str] | None = None, overrides: list[str] | None = None,
                 plugins: list[str] | tuple[str, ...] = ()) -> None:
    """Load the plugins a command names, as :func:`load` does first: ``plugins`` (``--plugin``), then
    those of its config files and of a ``plugins=`` override (before a resumed run's recorded code
    is checked against them)."""
    for spec in named_plugins([read_yaml(find_config(p)) for p in paths or []], overrides or [], plugins)[0]:
        plugin_code.load(spec)


def _not_code(source: str, layer: dict[str, Any]) -> dict[str, Any]:
    """``layer`` (a file's or an override's), unless it sets ``code``, which mpifed records itself."""
    if "code" in layer:
        raise ConfigError(f"{source}: 'code' is recorded by mpifed (the SHA-256 of each plugin a run uses), not a "
                          f"setting; remove it")
    return layer


def load_resources(paths: list[str] | None = None, overrides: list[str] | None = None,
                   base: dict[str, Any] | None = None) -> ResourcesConfig:
    """The ``resources`` section alone, from the layers :func:`load` reads (``base``, the files, the
    ``resources.*`` overrides), without the registries, so without importing torch: what a
    launcher needs before the ranks start. Raises ConfigError for a problem in that section."""
    section: Any = {}
    layers = [base or {}] + [read_yaml(find_config(p)) for p in paths or []]
    layers += [parse_override(o) for o in overrides or [] if o.split("=", 1)[0].strip().startswith("resources.")]
    for layer in layers:
        value = layer.get("resources")
        if value is not None:
            section = merge(section, value,
                            ("resources",)) if isinstance(value, dict) and isinstance(section, dict) else value
    return build_section(ResourcesConfig, section, "resources")
