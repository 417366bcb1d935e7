"""The model zoo: ``model.name`` in the config picks an entry of :data:`mpifed.plugin.registry.MODELS`.

An entry is a class with ``Options`` (its config keys) and
``build(options, input_shape, num_classes) -> Classifier`` (see :mod:`mpifed.models.base`);
it registers itself with ``@MODELS.register("name")`` in any module of this package.
"""
from __future__ import annotations

from typing import Any

from mpifed.models.base import Classifier
from mpifed.plugin.registry import MODELS


def build_model(name: str, options: Any, input_shape: tuple[int, ...], num_classes: int) -> Classifier:
    """The network ``name`` for inputs of ``input_shape`` (C, H, W for images) and ``num_classes`` outputs."""
    return MODELS.get(name).build(options, tuple(input_shape), num_classes)
