"""Every registered network: output shape and parameter count (counted by hand in the comments)."""
import pytest
import torch

from mpifed.models import build_model
from mpifed.models.base import Classifier, ProjectionHead
from mpifed.registry import MODELS

CASES = [
    # name, options, input, classes, parameters
    ("digits_cnn", {}, (1, 8, 8), 10, 151_306),
    ("fedavg_cnn", {}, (1, 28, 28), 10, 1_663_370),   # 832 + 51,264 + 3136*512+512 + 5,130
    ("fedavg_cnn", {}, (3, 32, 32), 10, 2_156_490),   # 2,432 + 51,264 + 4096*512+512 + 5,130
    ("lenet5", {}, (3, 32, 32), 10, 62_006),          # 456 + 2,416 + 48,120 + 10,164 + 850
    ("femnist_cnn", {}, (1, 28, 28), 62, 48_846),     # 156 + 2,416 + 30,840 + 10,164 + 5,270
    ("resnet8", {"norm": "group"}, (3, 32, 32), 10, 78_042),
    ("resnet8", {"norm": "none"}, (3, 32, 32), 10, 78_042 - 2 * (16 + 2 * 16 + 2 * 32 + 32 + 2 * 64 + 64)),
    ("resnet10", {"norm": "batch_nostats"}, (3, 32, 32), 10, 4_903_242),
    ("resnet18", {}, (3, 32, 32), 10, 11_173_962),
    ("resnet50", {}, (3, 32, 32), 100, 23_705_252),
    ("alexnet", {}, (3, 64, 64), 10, 57_063_498),
    ("vgg11", {}, (3, 32, 32), 10, 9_750_922),
]


@pytest.mark.parametrize("name,options,shape,classes,params", CASES, ids=[f"{c[0]}-{c[2]}-{c[1]}" for c in CASES])
def test_shape_and_parameter_count(name, options, shape, classes, params):
    model = build_model(name, MODELS.get(name).Options(**options), shape, classes).eval()
    assert model(torch.zeros(2, *shape)).shape == (2, classes)
    assert sum(p.numel() for p in model.parameters()) == params


@pytest.mark.parametrize("name,options,shape,classes,params", CASES, ids=[f"{c[0]}-{c[2]}-{c[1]}" for c in CASES])
def test_features_and_head(name, options, shape, classes, params):
    """The model contract: forward(x) = head(features(x)), features of width feature_dim."""
    torch.manual_seed(0)
    model = build_model(name, MODELS.get(name).Options(**options), shape, classes).eval()
    x = torch.randn(2, *shape)
    with torch.no_grad():
        z = model.features(x)
        assert isinstance(model, Classifier) and z.shape == (2, model.feature_dim) and model.num_classes == classes
        assert torch.equal(model.head(z), model(x))
        assert model.classifier.in_features == model.feature_dim


def test_projection_head_replaces_the_classifier():
    base = build_model("fedavg_cnn", MODELS.get("fedavg_cnn").Options(), (1, 28, 28), 10)
    net = ProjectionHead(base, 256)
    names = [n for n, _ in net.named_parameters()]
    assert not any(n.startswith("base.classifier") for n in names)      # the unused classifier is gone
    # 1,663,370 - (512*10+10) for the old classifier, + 512*512+512 + 512*256+256, + 256*10+10
    assert sum(p.numel() for p in net.parameters()) == 1_663_370 - 5_130 + 262_656 + 131_328 + 2_570
    x = torch.randn(3, 1, 28, 28)
    assert net.features(x).shape == (3, 256) and net(x).shape == (3, 10)


def test_group_norm_uses_16_channels_per_group():
    model = build_model("resnet8", MODELS.get("resnet8").Options(norm="group"), (3, 32, 32), 10)
    groups = sorted({(m.num_groups, m.num_channels) for m in model.modules() if isinstance(m, torch.nn.GroupNorm)})
    assert groups == [(1, 16), (2, 32), (4, 64)]


def test_batchnorm_without_running_statistics():
    model = build_model("resnet10", MODELS.get("resnet10").Options(norm="batch_nostats"), (3, 32, 32), 10)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(m.running_mean is None for m in bns)
