"""Small convolutional networks of the papers and the quick start."""
from __future__ import annotations

import torch
from torch import nn

from mpifed.models.base import SplitNet
from mpifed.plugin.options import NoOptions
from mpifed.plugin.registry import MODELS


def _flat_size(features: nn.Module, image_shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return int(features(torch.zeros(1, *image_shape)).numel())


def _split(convs: nn.Sequential, image_shape: tuple[int, ...], hidden: list[int], num_classes: int) -> SplitNet:
    """Convolutions, then fully connected hidden layers with ReLU (the features), then the classifier."""
    layers: list[nn.Module] = [convs]
    width = _flat_size(convs, image_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return SplitNet(nn.Sequential(*layers), nn.Linear(width, num_classes))


@MODELS.register("digits_cnn")
class DigitsCNN:
    """Quick-start CNN for 8x8 inputs: Conv 3x3 32, Conv 3x3 64, max-pool, FC 128 (the features)."""

    Options = NoOptions

    @staticmethod
    def build(options: NoOptions, image_shape: tuple[int, ...], num_classes: int) -> SplitNet:
        convs = nn.Sequential(
            nn.Conv2d(image_shape[0], 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        return _split(convs, image_shape, [128], num_classes)


@MODELS.register("fedavg_cnn")
class FedAvgCNN:
    """McMahan et al.'s CNN as FedNTD uses it: Conv 5x5 32 (pad 2), max-pool, Conv 5x5 64 (pad 2),
    max-pool, FC 512 (the features), FC classes. 3136 inputs to FC 512 for 28x28x1, 4096 for 32x32x3."""

    Options = NoOptions

    @staticmethod
    def build(options: NoOptions, image_shape: tuple[int, ...], num_classes: int) -> SplitNet:
        convs = nn.Sequential(
            nn.Conv2d(image_shape[0], 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        return _split(convs, image_shape, [512], num_classes)


@MODELS.register("lenet5")
class LeNet5:
    """FedCAD's CIFAR-10 CNN (NIID-Bench/MOON's simple CNN): Conv 5x5 6, max-pool, Conv 5x5 16,
    max-pool, FC 120, FC 84 (the features), FC classes (no padding: 16 x 5 x 5 inputs to FC 120
    for 32x32 images)."""

    Options = NoOptions

    @staticmethod
    def build(options: NoOptions, image_shape: tuple[int, ...], num_classes: int) -> SplitNet:
        convs = nn.Sequential(
            nn.Conv2d(image_shape[0], 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        return _split(convs, image_shape, [120, 84], num_classes)


@MODELS.register("femnist_cnn")
class FemnistCNN:
    """The simple 2-conv CNN FedCSD uses on FEMNIST (its ref. [18], MOON; NIID-Bench's
    SimpleCNNMNIST): Conv 5x5 6, max-pool, Conv 5x5 16, max-pool, FC 120, FC 84, FC classes
    (16 x 4 x 4 inputs to FC 120 for 28x28 images; 62 classes for FEMNIST)."""

    Options = NoOptions
    build = LeNet5.build
