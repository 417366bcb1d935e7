"""Figures: curves against round with a band over seeds, per-class accuracy and partition heatmaps.

Needs matplotlib (``pip install 'mpifed[plots]'``); only :mod:`mpifed.report` and
``python -m mpifed.prepare --plot`` import this module, so the trainer never needs it.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:  # the message below says what to install
    plt = None

INSTALL = "plots need matplotlib: pip install 'mpifed[plots]'"


class PlotsUnavailable(ImportError):
    """matplotlib is not installed."""


def require() -> None:
    """Raise :class:`PlotsUnavailable` (naming the extra to install) when matplotlib is missing."""
    if plt is None:
        raise PlotsUnavailable(INSTALL)


@dataclass
class Curve:
    """One method's values against round: the mean over seeds and its sample std (None: one seed)."""

    label: str
    rounds: np.ndarray
    mean: np.ndarray
    std: np.ndarray | None


def curves(path: Path, title: str, panels: list[tuple[str, list[Curve]]]) -> Path:
    """One panel per (y label, curves), side by side, x = round; a shaded band of mean ± std."""
    require()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.9), squeeze=False)
    for ax, (ylabel, lines) in zip(axes[0], panels):
        for c in lines:
            (line,) = ax.plot(c.rounds, c.mean, label=c.label, linewidth=1.6, marker="o" if len(c.rounds) < 12 else None,
                              markersize=3)
            if c.std is not None:
                ax.fill_between(c.rounds, c.mean - c.std, c.mean + c.std, color=line.get_color(), alpha=0.22, linewidth=0)
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, framealpha=0.85)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def heatmap(path: Path, title: str, values: np.ndarray, rows: list[str], xlabel: str, ylabel: str, colorbar: str,
            fmt: str = "{:.2f}", vmin: float | None = None, vmax: float | None = None) -> Path:
    """``values`` (rows x columns) as a heatmap with labelled rows, numbered columns and, when
    it fits, the values written in the cells (NaN cells stay blank)."""
    require()
    n_rows, n_cols = values.shape
    fig, ax = plt.subplots(figsize=(min(2.5 + 0.55 * n_cols, 16), min(1.6 + 0.4 * n_rows, 14)))
    image = ax.imshow(np.ma.masked_invalid(values), aspect="auto", cmap="viridis", vmin=vmin, vmax=vmax,
                      interpolation="nearest")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    step_x = max(1, n_cols // 25)
    ax.set_xticks(range(0, n_cols, step_x))
    if len(rows) <= 40:
        ax.set_yticks(range(n_rows), rows)
    if n_rows * n_cols <= 400:
        top = np.nanmax(values) if np.isfinite(values).any() else 0
        for i in range(n_rows):
            for j in range(n_cols):
                if np.isfinite(values[i, j]):
                    dark = values[i, j] < (vmin if vmin is not None else 0) + 0.6 * ((vmax if vmax is not None else top) - (vmin or 0))
                    ax.text(j, i, fmt.format(values[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
    fig.colorbar(image, ax=ax, label=colorbar)
    ax.set_title(textwrap.fill(title, 30 + 6 * min(n_cols, 16)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
