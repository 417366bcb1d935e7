"""A table as LaTeX that compiles as it is, for a paper: a ``table`` float with its caption and
label, booktabs rules, the numbers aligned on the decimal point by siunitx (or plain text), every
name escaped. In each setting the best method is in bold, and with it every method whose paired 95%
interval against the best (seed by seed, unadjusted) contains 0: the methods the seeds cannot tell
from the best. A cell with fewer seeds than the table declares says its n.

The document needs ``\\usepackage{booktabs}`` and, for aligned numbers, ``\\usepackage{siunitx}``
(:data:`PREAMBLE`); ``plain`` numbers need booktabs alone.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Iterable

from mpifed.run import results
from mpifed.tables.stats import paired
from mpifed.tables.summary import Summary

PREAMBLE = "\\usepackage{booktabs}\n\\usepackage{siunitx}\n"
NUMBERS = ("siunitx", "plain")
_SPECIAL = {"\\": "\\textbackslash{}", "{": "\\{", "}": "\\}", "$": "\\$", "&": "\\&", "#": "\\#", "^": "\\^{}",
            "_": "\\_", "~": "\\textasciitilde{}", "%": "\\%", "±": "$\\pm$"}


def escape(text: str) -> str:
    """``text`` as pdflatex prints it literally (``fedprox_mu=0.01`` -> ``fedprox\\_mu=0.01``): LaTeX's
    special characters escaped, a Greek letter as its math symbol (``α`` -> ``$\\alpha$``), accents
    on their letters by LaTeX's own accents dropped (``é`` -> ``e``), any other character outside
    ASCII as ``?``."""
    return "".join(_SPECIAL.get(ch, ch) if ch.isascii() or ch in _SPECIAL else _non_ascii(ch) for ch in text)


_LATIN_CAPITALS = {"alpha": "A", "beta": "B", "epsilon": "E", "zeta": "Z", "eta": "H", "iota": "I", "kappa": "K",
                   "mu": "M", "nu": "N", "omicron": "O", "rho": "P", "tau": "T", "chi": "X"}   # no macro of their own


def _non_ascii(ch: str) -> str:
    found = re.fullmatch(r"GREEK (SMALL|CAPITAL) LETTER (?:FINAL )?([A-Z]+)", unicodedata.name(ch, ""))
    if found:
        small, letter = found.group(1) == "SMALL", found.group(2).lower()
        if small:
            return "o" if letter == "omicron" else f"$\\{letter}$"
        return _LATIN_CAPITALS.get(letter) or f"$\\{letter.capitalize()}$"
    plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    return escape(plain) if plain else "?"


def lower_is_better(s: Summary) -> bool:
    """Whether the table's metric is better lower: a loss, or rounds to a target."""
    return "loss" in s.metric.column or s.columns[0].startswith("T(")


def bold(by_seed: dict[str, dict[int, float]], lower: bool) -> set[str]:
    """The best of ``by_seed`` (name -> seed -> value) by its mean, and every other whose paired 95%
    interval against the best contains 0 (those with fewer than two seeds in common are not bold)."""
    have = {m: v for m, v in by_seed.items() if v}
    if not have:
        return set()
    top = (min if lower else max)(have, key=lambda m: sum(have[m].values()) / len(have[m]))
    out = {top}
    for m, values in have.items():
        found = paired(values, have[top]) if m != top else None
        if found is not None and found.low <= 0 <= found.high:
            out.add(m)
    return out


def digits(column: str) -> int:
    """Decimals a column's numbers are given with: 1 for rounds to a target, else 2."""
    return 1 if column.startswith("T(") else 2


def number(stat: results.Stat, places: int, numbers: str, strong: bool, full: int) -> str:
    """One cell: ``71.29 \\pm 0.35`` (siunitx reads it as a value and its uncertainty) or the plain
    ``71.29 $\\pm$ 0.35``, bold where ``strong``, ``(n=2)`` after it where fewer than ``full`` seeds."""
    if not stat.values:
        return "{--}" if numbers == "siunitx" else "--"
    pm = "\\pm" if numbers == "siunitx" else "$\\pm$"
    text = f"{stat.mean:.{places}f}" + (f" {pm} {stat.std:.{places}f}" if stat.std is not None else "")
    n = f"(n={stat.n})" if stat.n < full else ""
    if numbers == "siunitx":
        return ("\\bfseries " if strong else "") + text + (f"{{\\,{n}}}" if n else "")
    return (f"\\textbf{{{text}}}" if strong else text) + (f" {n}" if n else "")


def column_spec(cells: Iterable[results.Stat], places: int, numbers: str) -> str:
    """A column's alignment: an siunitx ``S`` column sized for its numbers, or ``c``."""
    if numbers != "siunitx":
        return "c"
    stats = [c for c in cells if c.values]
    whole = max((len(str(int(abs(c.mean)))) for c in stats), default=1)
    spread = max((len(str(int(c.std))) for c in stats if c.std is not None), default=0)
    sign = "-" if any(c.mean < 0 for c in stats) else ""
    uncertainty = f" \\pm {spread}.{places}" if spread else ""
    post = "(n=00)" if any(c.n < max(s.n for s in stats) for c in stats) else ""
    return (f"S[table-format={sign}{whole}.{places}{uncertainty}, separate-uncertainty, detect-weight, mode=text"
            + (f", table-space-text-post={{\\,{post}}}" if post else "") + "]")


def latex_table(s: Summary, caption: str | None = None, label: str = "tab:results", numbers: str = "siunitx") -> str:
    """The summary ``s`` as a LaTeX table float: methods down, settings (x columns) across."""
    heads = [(setting, column) for setting in s.settings for column in s.columns]
    full = s.declared_seeds or max((stat.n + stat.missing for stat in s.cells.values()), default=0)
    lower = lower_is_better(s)
    strong = {setting: bold({m: s.by_seed.get((setting, m), {}) for m in s.methods
                             if (setting, m) not in s.unpaired}, lower) for setting in s.settings}
    specs = [column_spec([s.cells.get((st, m, c), results.Stat([])) for m in s.methods], digits(c), numbers)
             for st, c in heads]
    unit = " (\\%)" if s.percent else ""
    said = escape(caption) if caption is not None else (
        f"{escape(s.title)}: {escape(s.metric.label)}{unit}, mean $\\pm$ sample standard deviation over {full} "
        f"seeds (n where fewer finished). Bold: the best, and every method whose paired 95\\% interval against it "
        f"contains 0.")
    head_cells = [escape(st if len(s.columns) == 1 else f"{st}: {c}") for st, c in heads]
    wrap = (lambda h: f"{{{h}}}") if numbers == "siunitx" else (lambda h: h)
    lines = ["\\begin{table}[t]", "\\centering", f"\\caption{{{said}}}",
             f"\\label{{{label}}}", "\\begin{tabular}{l" + "".join(specs) + "}", "\\toprule",
             "Method & " + " & ".join(wrap(h) for h in head_cells) + " \\\\", "\\midrule"]
    for m in s.methods:
        cells = [number(s.cells.get((st, m, c), results.Stat([])), digits(c), numbers,
                        i == 0 and m in strong[st], full)
                 for st in s.settings for i, c in enumerate(s.columns)]
        lines.append(f"{escape(s.name(m))} & " + " & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    return "\n".join(lines) + "\n"

