"""Figures: curves with a band over seeds, per-class accuracy and partition heatmaps.

Needs matplotlib (``pip install 'mpifed[plots]'``); only :mod:`mpifed.tables.figures` and
``python -m mpifed.prepare --plot`` import this module, so the trainer never needs it.
Figures are sized and labelled for a paper: integer round ticks, a fixed look per method
(:mod:`mpifed.tables.figure_style`), a legend inside, outside or none, titles that say what was run.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
except ImportError:  # the message below says what to install
    plt = None

from mpifed.tables.curves import Bars, Curve

__all__ = ["Curve", "Layout", "PlotsUnavailable", "SIZES", "bars", "curves", "heatmap", "require"]

INSTALL = "plots need matplotlib: pip install 'mpifed[plots]'"
LEGENDS = ("inside", "outside", "none")


SIZES = {"column": 3.35, "page": 6.9}   # inches: one column and the full text width of a two-column paper
FONTS = {"font.size": 8, "axes.labelsize": 8, "axes.titlesize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7,
         "legend.fontsize": 7, "figure.titlesize": 8}   # no text below 7 pt at the size the figure is printed


@dataclass
class Layout:
    """How big a figure is printed, whether it carries a title and where its legend goes: ``width`` in
    inches (a preset of :data:`SIZES` or any; below 5 in the panels of a curves figure stack, one
    under the other), ``legend`` one of :data:`LEGENDS` (outside: beside the last panel)."""

    width: float = SIZES["page"]
    title: bool = True
    legend: str = "inside"


class PlotsUnavailable(ImportError):
    """matplotlib is not installed."""


def require() -> None:
    """Raise :class:`PlotsUnavailable` (naming the extra to install) when matplotlib is missing."""
    if plt is None:
        raise PlotsUnavailable(INSTALL)


def _panels(count: int, layout: Layout, sharey: bool = False) -> tuple[Any, np.ndarray]:
    """A figure of ``count`` panels side by side (stacked on a narrow figure) and its axes (2-d)."""
    require()
    stacked = layout.width < 5
    rows, cols = (count, 1) if stacked else (1, count)
    height = rows * layout.width * (0.62 if stacked else 0.8 / count) + (0.45 if layout.title else 0)
    with matplotlib.rc_context(FONTS):
        return plt.subplots(rows, cols, figsize=(layout.width, height), squeeze=False, sharey=sharey)


def _legend(ax: Any, layout: Layout) -> None:
    """The panel's legend, inside it or outside to its right (``layout.legend``)."""
    placed = {"loc": "upper left", "bbox_to_anchor": (1.02, 1.0), "borderaxespad": 0.0,
              "frameon": False} if layout.legend == "outside" else {"framealpha": 0.85}
    ax.legend(fontsize=FONTS["legend.fontsize"], **placed)


def curves(path: Path, title: str, subtitle: str, panels: list[tuple[str, list[Curve]]],
           layout: Layout = Layout(), xlabel: str = "round") -> Path:
    """One panel per (y label, curves), side by side (stacked on a narrow figure), x = round (or
    what ``xlabel`` says); each curve in its colour, line style and marker (as steps where it holds each
    value until the next x), with a shaded band of mean ± its half-width."""
    fig, axes = _panels(len(panels), layout)
    for i, (ax, (ylabel, lines)) in enumerate(zip(axes.flat, panels)):
        for c in lines:
            (line,) = ax.plot(c.rounds, c.mean, label=c.label, color=c.colour, linewidth=1.4, linestyle=c.linestyle,
                              marker=c.marker or ("o" if len(c.rounds) < 12 else None), markersize=3,
                              markevery=max(1, len(c.rounds) // 10), drawstyle="steps-post" if c.steps else "default")
            if c.band is not None:
                ax.fill_between(c.rounds, c.mean - c.band, c.mean + c.band, color=line.get_color(),
                                alpha=0.2, linewidth=0, step="post" if c.steps else None)
        ax.set_xlabel(xlabel, fontsize=FONTS["axes.labelsize"])
        ax.set_ylabel(ylabel, fontsize=FONTS["axes.labelsize"])
        ax.tick_params(labelsize=FONTS["xtick.labelsize"])
        if xlabel == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if (i == 0 and layout.legend == "inside") or (i == len(panels) - 1 and layout.legend == "outside"):
            _legend(ax, layout)
    if layout.title:
        _titles(fig, title, subtitle, int(layout.width * 11))
    return _save(fig, path)


def bars(path: Path, title: str, subtitle: str, panels: list[tuple[str, list[Bars]]], layout: Layout = Layout(),
         xlabel: str = "", ylabel: str = "") -> Path:
    """One panel per (title, histograms), side by side (stacked on a narrow figure), on one y scale: each
    histogram's bars in its colour, those of one panel side by side at each integer x, its legend text in the
    legend (inside: in every panel, as each panel's histograms have their own text)."""
    fig, axes = _panels(len(panels), layout, sharey=True)
    highest = max((float(h.per_run.max()) for _, hs in panels for h in hs if len(h.per_run)), default=0.0) or 1.0
    axes[0, 0].set_ylim(0, highest * (1.4 if layout.legend == "inside" else 1.05))   # room for the legend inside
    for i, (ax, (name, histograms)) in enumerate(zip(axes.flat, panels)):
        width = 0.8 / len(histograms)
        for k, h in enumerate(histograms):
            ax.bar(h.staleness - 0.4 + width * (k + 0.5), h.per_run, width, label=h.legend or h.label, color=h.colour)
        ax.set_title(name, fontsize=FONTS["axes.titlesize"])
        ax.set_xlabel(xlabel, fontsize=FONTS["axes.labelsize"])
        ax.set_ylabel(ylabel, fontsize=FONTS["axes.labelsize"])
        ax.tick_params(labelsize=FONTS["xtick.labelsize"])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, axis="y", alpha=0.3)
        if layout.legend == "inside" or (i == len(panels) - 1 and layout.legend == "outside"):   # each its own
            _legend(ax, layout)
    if layout.title:
        _titles(fig, title, subtitle, int(layout.width * 11))
    return _save(fig, path)


def heatmap(path: Path, title: str, subtitle: str, values: np.ndarray, rows: list[str], columns: list[str] | None,
            xlabel: str, ylabel: str, colorbar: str, fmt: str = "{:.2f}", vmin: float | None = None,
            vmax: float | None = None, layout: Layout = Layout()) -> Path:
    """``values`` (rows x columns) as a heatmap with labelled rows, columns named by ``columns``
    (numbered without) and, when it fits, the values written in the cells (NaN cells stay blank)."""
    require()
    n_rows, n_cols = values.shape
    named = columns is not None and n_cols <= 30
    height = min(1.1 + 0.24 * n_rows, 9.0) + (0.5 if named else 0) + (0.45 if layout.title else 0)
    with matplotlib.rc_context(FONTS):
        fig, ax = plt.subplots(figsize=(layout.width, height))
    image = ax.imshow(np.ma.masked_invalid(values), aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax,
                      interpolation="nearest")
    ax.set_xlabel(xlabel, fontsize=FONTS["axes.labelsize"])
    ax.set_ylabel(ylabel, fontsize=FONTS["axes.labelsize"])
    ax.tick_params(labelsize=FONTS["xtick.labelsize"])
    if named:
        ax.set_xticks(range(n_cols), columns, rotation=35 if max(len(c) for c in columns) > 3 else 0, ha="right"
                      if max(len(c) for c in columns) > 3 else "center", fontsize=FONTS["xtick.labelsize"])
    else:
        ax.set_xticks(range(0, n_cols, max(1, n_cols // 25)))
    if len(rows) <= 40:
        ax.set_yticks(range(n_rows), rows)
    if n_rows * n_cols <= 400 and (layout.width - 1.6) / n_cols >= 0.25:   # a cell holds "100" at 7 pt
        low = vmin if vmin is not None else 0
        high = vmax if vmax is not None else (np.nanmax(values) if np.isfinite(values).any() else 0)
        for i in range(n_rows):
            for j in range(n_cols):
                if np.isfinite(values[i, j]):
                    dark = values[i, j] < low + 0.6 * (high - low)
                    ax.text(j, i, fmt.format(values[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
    bar = fig.colorbar(image, ax=ax)
    bar.set_label(colorbar, fontsize=FONTS["axes.labelsize"])
    bar.ax.tick_params(labelsize=FONTS["ytick.labelsize"])
    if layout.title:
        _titles(fig, title, subtitle, int(layout.width * 11))
    return _save(fig, path)


def _titles(fig, title: str, subtitle: str, width: int) -> None:
    text = textwrap.fill(title, width)
    if subtitle:
        text += "\n" + textwrap.fill(subtitle, int(width * 1.2))
    fig.suptitle(text, fontsize=FONTS["figure.titlesize"])


def _save(fig, path: Path) -> Path:
    """``fig`` written to ``path``; a PDF or PostScript file embeds its fonts as TrueType (Type 42), not
    as Type 3, which many venues refuse."""
    fig.tight_layout()
    with matplotlib.rc_context({"pdf.fonttype": 42, "ps.fonttype": 42}):
        fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
