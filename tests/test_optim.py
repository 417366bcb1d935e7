"""The flat optimisers equal torch.optim's arithmetic; the learning-rate schedules."""
import copy
import math

import pytest
import torch

from mpifed.settings.config import TrainConfig
from mpifed.local.flat import FlatModel
from mpifed.models import build_model
from mpifed.local.optim import make_optimizer, round_lr
from mpifed.options import NoOptions


@pytest.mark.parametrize("kind,wd", [("adam", 0.0), ("adam", 1e-2), ("adamw", 1e-2)])
def test_flat_adam_matches_torch(kind, wd):
    torch.manual_seed(0)
    a = build_model("digits_cnn", NoOptions(), (1, 8, 8), 10)
    b = copy.deepcopy(a)
    flat = FlatModel(a)
    cfg = TrainConfig(optimizer=kind, weight_decay=wd, adam_beta1=0.8, adam_beta2=0.99, adam_eps=1e-6)
    ours = make_optimizer(flat, 0.01, cfg)
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    theirs = cls(b.parameters(), lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=wd)
    for _ in range(5):
        x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
        ours.zero_grad()
        torch.nn.functional.cross_entropy(a(x), y).backward()
        ours.step()
        theirs.zero_grad()
        torch.nn.functional.cross_entropy(b(x), y).backward()
        theirs.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p, q, atol=1e-5, rtol=0)    # float rounding only: a wrong formula is off by ~1e-3


def test_schedules():
    exp = TrainConfig(lr=0.1, lr_decay=0.99)
    assert round_lr(exp, 0) == 0.1 and round_lr(exp, 10) == pytest.approx(0.1 * 0.99 ** 10)
    step = TrainConfig(lr=0.1, lr_schedule="step", lr_step_rounds=30, lr_step_factor=0.5)
    assert [round_lr(step, r) for r in (0, 29, 30, 61)] == pytest.approx([0.1, 0.1, 0.05, 0.025])
    cos = TrainConfig(lr=0.1, lr_schedule="cosine", lr_min=0.01, rounds=100)
    assert round_lr(cos, 0) == pytest.approx(0.1) and round_lr(cos, 50) == pytest.approx(0.055)
    assert round_lr(cos, 25) == pytest.approx(0.01 + 0.09 * (1 + math.cos(math.pi / 4)) / 2)


def test_cosine_schedule_makes_rounds_part_of_the_resume_check():
    from mpifed.settings import config
    _, d = config.load([], ["train.lr_schedule=cosine", "train.rounds=50"])
    _, e = config.load([], ["train.lr_schedule=cosine", "train.rounds=80"])
    assert config.diff_keys(config.math_fingerprint(d), config.math_fingerprint(e)) == ["train.rounds"]
    _, f = config.load([], ["train.rounds=80"])
    _, g = config.load([], ["train.rounds=50"])
    assert config.diff_keys(config.math_fingerprint(f), config.math_fingerprint(g)) == []
