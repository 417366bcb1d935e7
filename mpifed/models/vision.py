"""Larger classic networks: AlexNet (Office-Caltech-10) and VGG-11 (FedNTD)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn

from mpifed.models.base import SplitNet
from mpifed.plugin.options import NoOptions, opt
from mpifed.plugin.registry import MODELS


@MODELS.register("alexnet")
class AlexNet:
    """AlexNet as FedBN uses it on Office-Caltech-10 (the setup FedCSD Table II follows): torchvision's
    AlexNet layers (Conv 11x11/4 64, 5x5 192, 3x3 384, 256, 256; adaptive 6x6 pool; FC 4096, 4096,
    the features) with BatchNorm after every convolution and hidden linear layer (``norm: none``
    drops it; dropout is not used, as in FedBN)."""

    @dataclass
    class Options:
        norm: Literal["batch", "none"] = opt("batch", "BatchNorm after convolutions and hidden FC layers (FedBN), or "
                                                      "none")

    @staticmethod
    def build(options, image_shape, num_classes):
        bn2 = nn.BatchNorm2d if options.norm == "batch" else (lambda c: nn.Identity())
        bn1 = nn.BatchNorm1d if options.norm == "batch" else (lambda c: nn.Identity())
        body = nn.Sequential(
            nn.Conv2d(image_shape[0], 64, 11, stride=4, padding=2), bn2(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), bn2(192), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), bn2(384), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), bn2(256), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), bn2(256), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.AdaptiveAvgPool2d(6), nn.Flatten(),
            nn.Linear(256 * 36, 4096), bn1(4096), nn.ReLU(inplace=True),
            nn.Linear(4096, 4096), bn1(4096), nn.ReLU(inplace=True))
        return SplitNet(body, nn.Linear(4096, num_classes))


@MODELS.register("vgg11")
class VGG11:
    """VGG-11 (configuration A) without BatchNorm, as FedNTD's code has it: 3x3 convolutions
    64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M; then FC 512, FC 512 (the features),
    FC classes (for 32x32 inputs the convolutions end at 512 x 1 x 1)."""

    Options = NoOptions

    @staticmethod
    def build(options, image_shape, num_classes):
        layers, c = [], image_shape[0]
        for v in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                conv = nn.Conv2d(c, v, 3, padding=1)
                nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(conv.bias)
                layers += [conv, nn.ReLU(inplace=True)]
                c = v
        h = image_shape[1] // 32
        w = image_shape[2] // 32
        body = nn.Sequential(*layers, nn.Flatten(), nn.Linear(512 * h * w, 512), nn.ReLU(inplace=True),
                             nn.Linear(512, 512), nn.ReLU(inplace=True))
        return SplitNet(body, nn.Linear(512, num_classes))
