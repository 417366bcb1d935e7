"""ResNets for small images, built from torchvision's residual blocks, with selectable normalisation.

torchvision is imported only when a ResNet is built: importing it costs every rank about
160 MB of memory and 1.7 s of start-up, which runs of the small CNNs do not need."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Literal

import torch
from torch import nn

from mpifed.models.base import Classifier
from mpifed.plugin.options import opt
from mpifed.plugin.registry import MODELS


@dataclass
class ResNetOptions:
    norm: Literal["batch", "batch_nostats", "group", "none"] = opt(
        "batch", "normalisation: BatchNorm, BatchNorm without running statistics (FedNTD's ResNets), "
                 "GroupNorm (FedGKD), or none")
    group_channels: int = opt(16, "channels per GroupNorm group (FedGKD: 16, i.e. GN(1,16), GN(2,32), GN(4,64))", min=1)


def norm_layer(options: ResNetOptions) -> Callable[[int], nn.Module]:
    if options.norm == "batch":
        return nn.BatchNorm2d
    if options.norm == "batch_nostats":
        return partial(nn.BatchNorm2d, track_running_stats=False)
    if options.norm == "group":
        return lambda channels: nn.GroupNorm(max(1, channels // options.group_channels), channels)
    return lambda channels: nn.Identity()


class CifarResNet(Classifier):
    """The CIFAR ResNet of He et al. (Sec. 4.2): 3x3 stem, three stages of 16/32/64 channels,
    global average pooling (the 64 features), a linear classifier. ResNet-(6n+2) has n blocks per stage."""

    def __init__(self, blocks_per_stage: int, in_channels: int, num_classes: int,
                 norm: Callable[[int], nn.Module]) -> None:
        from torchvision.models.resnet import BasicBlock
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), norm(16), nn.ReLU(inplace=True))
        layers, width = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(blocks_per_stage):
                s = stride if i == 0 else 1
                down = None
                if s != 1 or width != planes:
                    down = nn.Sequential(nn.Conv2d(width, planes, 1, stride=s, bias=False), norm(planes))
                layers.append(BasicBlock(width, planes, stride=s, downsample=down, norm_layer=norm))
                width = planes
        self.layers = nn.Sequential(*layers)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(64, num_classes)
        self.feature_dim, self.num_classes = 64, num_classes
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.layers(self.stem(x)))


@MODELS.register("resnet8")
class ResNet8:
    """FedGKD's ResNet-8 (one BasicBlock per 16/32/64 stage). FedGKD uses GroupNorm with 16
    channels per group: ``model: {name: resnet8, norm: group, group_channels: 16}``."""

    Options = ResNetOptions

    @staticmethod
    def build(options: ResNetOptions, image_shape: tuple[int, ...], num_classes: int) -> Classifier:
        return CifarResNet(1, image_shape[0], num_classes, norm_layer(options))


class TorchvisionResNet(Classifier):
    """torchvision's ResNet with the CIFAR stem (3x3 stride-1 first convolution, no max-pool);
    the features are the pooled output of the last stage, the classifier its ``fc``."""

    def __init__(self, block: str, layers: list[int], options: ResNetOptions, image_shape, num_classes: int) -> None:
        from torchvision.models import resnet
        super().__init__()
        net = resnet.ResNet(getattr(resnet, block), layers, num_classes=num_classes, norm_layer=norm_layer(options))
        net.conv1 = nn.Conv2d(image_shape[0], 64, 3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.body = nn.Sequential(net.conv1, net.bn1, net.relu, net.layer1, net.layer2, net.layer3, net.layer4,
                                  net.avgpool, nn.Flatten())
        self.classifier = net.fc
        self.feature_dim, self.num_classes = net.fc.in_features, num_classes

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@MODELS.register("resnet10")
class ResNet10:
    """ResNet-10 as FedNTD's App. G.3 uses it: BasicBlocks [1, 1, 1, 1] (64-512 channels), CIFAR stem.
    FedNTD's BatchNorm keeps no running statistics: ``norm: batch_nostats``.

    The layers are those of FedNTD's ``train_tools/models/resnet.py`` (1x1 convolution + BatchNorm
    shortcuts, 4x4 average pooling of the 32x32 input's last stage); the convolutions start from
    torchvision's Kaiming-normal initialisation, where FedNTD's code keeps PyTorch's default
    (Kaiming-uniform, a = sqrt(5))."""

    Options = ResNetOptions

    @staticmethod
    def build(options, image_shape, num_classes):
        return TorchvisionResNet("BasicBlock", [1, 1, 1, 1], options, image_shape, num_classes)


@MODELS.register("resnet18")
class ResNet18:
    """ResNet-18: BasicBlocks [2, 2, 2, 2], CIFAR stem."""

    Options = ResNetOptions

    @staticmethod
    def build(options, image_shape, num_classes):
        return TorchvisionResNet("BasicBlock", [2, 2, 2, 2], options, image_shape, num_classes)


@MODELS.register("resnet50")
class ResNet50:
    """ResNet-50 (Bottlenecks [3, 4, 6, 3]) with the CIFAR stem, as FedCSD's and FedCAD's CIFAR-100
    code (MOON's ResNet-50) and FedGKD's Tiny-ImageNet model use it."""

    Options = ResNetOptions

    @staticmethod
    def build(options, image_shape, num_classes):
        return TorchvisionResNet("Bottleneck", [3, 4, 6, 3], options, image_shape, num_classes)
