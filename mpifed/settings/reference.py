"""The config's reference: every key with its default and help, then each choice's own options
(``--config-reference``, the generated docs page)."""
from __future__ import annotations

import dataclasses
import json
from typing import Collection

from mpifed.settings.keys import dotted
from mpifed.settings.schema import Choice, Config, type_hints


def reference(leave_out: Collection[tuple[str, str]] = ()) -> str:
    """Markdown tables of every key (default and help), then of each choice's own options, except for the
    (choice, name) pairs in ``leave_out`` (such as ``("algorithm", "fedavg")``)."""
    rows: list[str] = []
    choices: list[tuple[str, dataclasses.Field]] = []

    def table(cls: type, path: str) -> list[str]:
        out = []
        hints = type_hints(cls)
        for f in dataclasses.fields(cls):
            key = dotted(path, f.name)
            tp = hints[f.name]
            if dataclasses.is_dataclass(tp) and "registry" not in f.metadata:
                out += table(tp, key)
                continue
            if "registry" in f.metadata:
                choices.append((key, f))
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default
            shown = default.name if isinstance(default, Choice) else default
            out.append(f"| `{key}` | `{json.dumps(shown)}` | {f.metadata.get('help', '')} |")
        return out

    head = "| key | default | meaning |\n| --- | --- | --- |\n"
    rows = table(Config, "")
    parts = [head + "\n".join(rows)]
    for key, f in choices:
        for name, options in sorted(f.metadata["registry"]().items()):
            if (key, name) in leave_out:
                continue
            sub = table(options, key)
            body = head + "\n".join(sub) if sub else "(no options)"
            parts.append(f"### `{key}: {name}`\n\n{body}")
    return "\n\n".join(parts)
