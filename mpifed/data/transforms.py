"""Batch transforms on the device: stored inputs to what the model takes.

:class:`BatchTransform` turns uint8 images into normalised floats, with augmentation;
:class:`TokenTransform` turns stored token ids and masks (text) into int64 tensors.
Both have ``train(x, gen)`` and ``eval(x)``, so the training loop and every method treat
them alike.

Everything works on whole batches (no per-sample Python), with random numbers drawn
from the client's own generator so that training is reproducible whichever worker
runs it; they are drawn on the generator's device (a worker on a GPU gets a CUDA
generator), so augmenting a batch never waits for the host. The order is torchvision's
in the papers' code: random crop (padding with black before normalising, as
``RandomCrop(padding=p)``), horizontal flip, random rotation (``RandomRotation(d)``:
nearest neighbour, black corners), normalisation, then Cutout (zeroing a square after
normalising, as FedNTD's Cutout(16) does).
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F


def rotate(x: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Each image of ``x`` (B x C x H x W) rotated counter-clockwise about its centre by its angle
    in ``degrees`` (B), nearest neighbour, zeros outside (torchvision's RandomRotation defaults)."""
    a = degrees.to(x.dtype) * (math.pi / 180.0)
    cos, sin = torch.cos(a), torch.sin(a)
    zero = torch.zeros_like(a)
    # the sampling grid maps each output pixel to the input pixel it comes from (the inverse rotation)
    theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


class BatchTransform:
    """``train(x, gen)``: augment + normalise; ``eval(x)``: normalise only."""

    def __init__(self, mean: list[float], std: list[float], crop_padding: int, flip: bool, cutout: int,
                 device: torch.device | str, rotation: float = 0.0) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.inv_std = 1.0 / torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        self.crop_padding = crop_padding
        self.flip = flip
        self.cutout = cutout
        self.rotation = rotation
        self.device = torch.device(device)

    @property
    def augments(self) -> bool:
        return bool(self.crop_padding or self.flip or self.cutout or self.rotation)

    def eval(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() * (1.0 / 255.0) - self.mean) * self.inv_std

    def train(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        x = x.float() * (1.0 / 255.0)
        b, _, h, w = x.shape
        if self.crop_padding:
            p = self.crop_padding
            offsets = torch.randint(0, 2 * p + 1, (b, 2), generator=gen, device=gen.device).to(self.device)
            padded = torch.nn.functional.pad(x, (p, p, p, p))
            rows = (offsets[:, :1] + torch.arange(h, device=self.device)).view(b, 1, h, 1)
            cols = (offsets[:, 1:] + torch.arange(w, device=self.device)).view(b, 1, 1, w)
            x = padded[torch.arange(b, device=self.device).view(b, 1, 1, 1),
                       torch.arange(x.shape[1], device=self.device).view(1, -1, 1, 1), rows, cols]
        if self.flip:
            mirror = (torch.rand(b, generator=gen, device=gen.device) < 0.5).to(self.device).view(b, 1, 1, 1)
            x = torch.where(mirror, x.flip(-1), x)
        if self.rotation:
            x = rotate(x, ((torch.rand(b, generator=gen, device=gen.device) * 2 - 1) * self.rotation).to(self.device))
        x = (x - self.mean) * self.inv_std
        if self.cutout:
            centre = torch.stack([torch.randint(0, h, (b,), generator=gen, device=gen.device),
                                  torch.randint(0, w, (b,), generator=gen, device=gen.device)], 1).to(self.device)
            half = self.cutout // 2
            ys = torch.arange(h, device=self.device).view(1, h)
            xs = torch.arange(w, device=self.device).view(1, w)
            in_y = (ys >= (centre[:, :1] - half)) & (ys < (centre[:, :1] + half))
            in_x = (xs >= (centre[:, 1:] - half)) & (xs < (centre[:, 1:] + half))
            keep = ~(in_y.view(b, 1, h, 1) & in_x.view(b, 1, 1, w))
            x = x * keep
        return x


class TokenTransform:
    """Text batches: a dict of stored integer arrays (token ids, attention mask) to int64
    tensors for the model; there is no augmentation."""

    augments = False

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)

    def eval(self, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.long() for k, v in x.items()}

    def train(self, x: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
        return self.eval(x)


def make_transform(manifest: Any, augment: Any, device: torch.device | str) -> BatchTransform | TokenTransform:
    """The transform for a prepared data set (its manifest) with the config's ``data.augment``."""
    if manifest.modality == "text":
        return TokenTransform(device)
    return BatchTransform(manifest.mean, manifest.std,
                          manifest.crop_padding if augment.crop_padding is None else augment.crop_padding,
                          manifest.flip if augment.flip is None else augment.flip, augment.cutout, device,
                          augment.rotation)
