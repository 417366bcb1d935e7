"""The model contract: a feature extractor and a classifier, ``forward = head(features(x))``.

Every network in the zoo is a :class:`Classifier`. Methods that work on representations
(MOON, FedProto, FedGen) read ``features(x)`` and call ``head(z)`` on features of their
own; a method that needs more (MOON's projection head) wraps the network in another
``Classifier`` instead of changing every model.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Classifier(nn.Module):
    """``features(x)`` -> [B, feature_dim]; ``head(z)`` -> [B, num_classes] logits.

    The classifier module is the attribute ``classifier``; ``feature_dim`` is its input size.
    """

    feature_dim: int
    num_classes: int

    def features(self, x: Any) -> torch.Tensor:
        raise NotImplementedError

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.classifier(z)

    def forward(self, x: Any) -> torch.Tensor:
        return self.head(self.features(x))


class SplitNet(Classifier):
    """A network given as two modules: ``body`` (input -> features) and a linear ``classifier``."""

    def __init__(self, body: nn.Module, classifier: nn.Linear) -> None:
        super().__init__()
        self.body = body
        self.classifier = classifier
        self.feature_dim = classifier.in_features
        self.num_classes = classifier.out_features

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class ProjectionHead(Classifier):
    """MOON's network (Li et al., CVPR 2021, Sec. 3.2): the base network's features through a
    two-layer MLP projection (SimCLR's: Linear d->d, ReLU, Linear d->``dim``), and a new linear
    classifier on the projected representation, which is what ``features`` returns. The base
    network's own classifier is removed (it would train nothing)."""

    def __init__(self, base: Classifier, dim: int) -> None:
        super().__init__()
        d = base.feature_dim
        del base.classifier
        self.base = base
        self.projection = nn.Sequential(nn.Linear(d, d), nn.ReLU(inplace=True), nn.Linear(d, dim))
        self.classifier = nn.Linear(dim, base.num_classes)
        self.feature_dim = dim
        self.num_classes = base.num_classes

    def features(self, x: Any) -> torch.Tensor:
        return self.projection(self.base.features(x))
