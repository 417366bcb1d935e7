"""How each method is drawn in every figure of a report: its colour, line style and marker.

A method's look is fixed by the method, never by what else a folder holds: a label that is, in every
setting where it appears, the only label of its algorithm is drawn as that algorithm (FedNTD's look,
whether the runs are a table's ``fedntd`` or a folder's ``digits-lda0.1-fedntd``); labels that share
an algorithm within a setting take looks of their own, after every registered algorithm's, in name
order (a colour a method of the report holds passed over). Greyscale styles keep methods apart by
line style and marker, in black and greys that survive black-and-white printing. Imports no
plotting library.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# 20 colours that stay apart in print: tab10's, then Dark2's and four more
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#000000",
           "#6a3d9a", "#b15928"]
GREYS = ["#000000", "#4d4d4d", "#808080", "#a6a6a6"]
LINESTYLES: list[Any] = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 2))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h"]


@dataclass(frozen=True)
class Style:
    """One method's look: its colour, its line style (a matplotlib dash pattern) and its marker."""

    colour: str
    linestyle: Any
    marker: str


def method_keys(labels_by_setting: dict[str, list[str]], algorithm: dict[str, str | None]) -> dict[str, str]:
    """What each label is drawn as: its algorithm's display name where it is the only label of that
    algorithm in every setting it appears in; else the label itself."""
    shared = {label for labels in labels_by_setting.values() for label in labels
              if algorithm.get(label) is not None
              and sum(1 for other in labels if algorithm.get(other) == algorithm[label]) > 1}
    labels = dict.fromkeys(label for labels in labels_by_setting.values() for label in labels)
    return {label: algorithm[label] if algorithm.get(label) is not None and label not in shared else label
            for label in labels}


def styles(keys: dict[str, str], fixed: list[str], greyscale: bool = False) -> dict[str, Style]:
    """Each label's :class:`Style` from its key (:func:`method_keys`): a key in ``fixed`` (every
    registered algorithm's display name, in a fixed order) takes that place; the other keys take the
    places after them, in name order, passing over those whose colour a key of ``keys`` in ``fixed``
    holds (so that no two methods of a report share a colour while the palette lasts)."""
    slot = {k: i for i, k in enumerate(fixed)}
    taken = {slot[k] % len(PALETTE) for k in keys.values() if k in slot}
    place = len(fixed)
    for key in sorted({k for k in keys.values() if k not in slot}):
        while place % len(PALETTE) in taken and len(taken) < len(PALETTE):
            place += 1
        slot[key] = place
        taken.add(place % len(PALETTE))
        place += 1
    return {label: _style(slot[key], greyscale) for label, key in keys.items()}


def _style(slot: int, greyscale: bool) -> Style:
    colour = GREYS[slot % len(GREYS)] if greyscale else PALETTE[slot % len(PALETTE)]
    return Style(colour, LINESTYLES[slot % len(LINESTYLES)], MARKERS[slot % len(MARKERS)])
