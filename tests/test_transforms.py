"""Batch augmentation on the device: crop, flip, rotation, Cutout; evaluation only normalises."""
import torch

from mpifed.data.transforms import BatchTransform, rotate


def image(b=1, c=1, h=8, w=8):
    return torch.arange(b * c * h * w, dtype=torch.float32).view(b, c, h, w)


def test_rotation_by_right_angles_equals_rot90_and_zero_is_identity():
    x = image(2, 3)
    assert torch.equal(rotate(x, torch.zeros(2)), x)
    assert torch.equal(rotate(x, torch.full((2,), 90.0)), torch.rot90(x, 1, dims=(2, 3)))      # counter-clockwise
    assert torch.equal(rotate(x, torch.tensor([180.0, -90.0]))[0], torch.rot90(x[0], 2, dims=(1, 2)))
    assert torch.equal(rotate(x, torch.tensor([180.0, -90.0]))[1], torch.rot90(x[1], -1, dims=(1, 2)))


def test_rotation_fills_black_corners_and_keeps_the_centre():
    x = torch.full((1, 1, 9, 9), 200.0)
    out = rotate(x, torch.tensor([45.0]))
    assert out[0, 0, 0, 0] == 0 and out[0, 0, 4, 4] == 200.0


def test_train_transform_rotates_within_the_range_and_is_reproducible():
    tf = BatchTransform([0.0], [1.0], 0, False, 0, "cpu", rotation=15)
    x = torch.randint(0, 255, (16, 1, 12, 12), dtype=torch.uint8)
    a = tf.train(x, torch.Generator().manual_seed(3))
    b = tf.train(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and tf.augments
    assert not torch.equal(a, tf.eval(x))                 # rotated: some pixels moved
    assert torch.allclose(tf.eval(x), x.float() / 255.0)  # evaluation never augments
    x90 = BatchTransform([0.0], [1.0], 0, False, 0, "cpu", rotation=90).train(x, torch.Generator().manual_seed(3))
    black = [(t == 0).float().mean().item() for t in (a, x90)]
    assert black[0] < black[1] < 0.5                      # at most 15 degrees loses less than up to 90 degrees


def test_crop_flip_and_cutout_keep_shapes_and_statistics():
    tf = BatchTransform([0.5], [0.25], 4, True, 4, "cpu")
    x = torch.randint(0, 255, (32, 1, 16, 16), dtype=torch.uint8)
    out = tf.train(x, torch.Generator().manual_seed(0))
    assert out.shape == (32, 1, 16, 16)
    zeros_after_cutout = (out == 0).flatten(1).sum(1)
    assert torch.all(zeros_after_cutout >= 1)             # every sample lost a (clipped) square
    plain = BatchTransform([0.5], [0.25], 0, False, 0, "cpu")
    assert not plain.augments and torch.equal(plain.train(x, torch.Generator()), plain.eval(x))
