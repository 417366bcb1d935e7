"""Small convolutional networks of the papers and the quick start."""
from __future__ import annotations

import torch
from torch import nn

from mpifed.config import NoOptions
from mpifed.models import register


def _flat_size(features: nn.Module, image_shape: tuple[int, int, int]) -> int:
    with torch.no_grad():
        return int(features(torch.zeros(1, *image_shape)).numel())


@register("digits_cnn")
class DigitsCNN:
    """Quick-start CNN for 8x8 inputs: Conv 3x3 32, Conv 3x3 64, max-pool, FC 128."""

    Options = NoOptions

    @staticmethod
    def build(options: NoOptions, image_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
        features = nn.Sequential(
            nn.Conv2d(image_shape[0], 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        n = _flat_size(features, image_shape)
        return nn.Sequential(features, nn.Linear(n, 128), nn.ReLU(), nn.Linear(128, num_classes))


@register("fedavg_cnn")
class FedAvgCNN:
    """McMahan et al.'s CNN as FedNTD uses it: Conv 5x5 32 (pad 2), max-pool, Conv 5x5 64 (pad 2),
    max-pool, FC 512, FC classes. 3136 features for 28x28x1 inputs, 4096 for 32x32x3."""

    Options = NoOptions

    @staticmethod
    def build(options: NoOptions, image_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
        features = nn.Sequential(
            nn.Conv2d(image_shape[0], 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        n = _flat_size(features, image_shape)
        return nn.Sequential(features, nn.Linear(n, 512), nn.ReLU(), nn.Linear(512, num_classes))


@register("lenet5")
class LeNet5:
    """FedCAD's CIFAR-10 CNN (NIID-Bench/MOON's simple CNN): Conv 5x5 6, max-pool, Conv 5x5 16,
    max-pool, FC 120, FC 84, FC classes (no padding: 16 x 5 x 5 features for 32x32 inputs)."""

    Options = NoOptions

    @staticmethod
    def build(options: NoOptions, image_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
        features = nn.Sequential(
            nn.Conv2d(image_shape[0], 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        n = _flat_size(features, image_shape)
        return nn.Sequential(features, nn.Linear(n, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_classes))


@register("femnist_cnn")
class FemnistCNN:
    """The simple 2-conv CNN FedCSD uses on FEMNIST (its ref. [18], MOON; NIID-Bench's
    SimpleCNNMNIST): Conv 5x5 6, max-pool, Conv 5x5 16, max-pool, FC 120, FC 84, FC classes
    (16 x 4 x 4 features for 28x28 inputs; 62 classes for FEMNIST)."""

    Options = NoOptions
    build = LeNet5.build
