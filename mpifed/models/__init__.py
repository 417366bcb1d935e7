"""Registry of networks: ``model.name`` in the config picks one.

Each entry is a class with ``Options`` (its config keys) and
``build(options, image_shape, num_classes) -> nn.Module``. Models return logits.
"""
from __future__ import annotations

from typing import Callable

from torch import nn

MODELS: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    def add(cls: type) -> type:
        MODELS[name] = cls
        return cls
    return add


def build_model(name: str, options, image_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The network ``name`` for inputs of ``image_shape`` (C, H, W) and ``num_classes`` outputs."""
    return MODELS[name].build(options, tuple(image_shape), num_classes)


from mpifed.models import cnn, resnet, vision  # noqa: E402,F401  (registers the models)
