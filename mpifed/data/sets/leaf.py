"""FEMNIST in LEAF's JSON format: ``train/*.json`` and ``test/*.json``, each
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [[784 floats]], "y": [...]}}}``."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpifed.data.image_rows import ImageRows
from mpifed.data.raw import DataMissing, Dataset, RawData, select
from mpifed.plugin.options import opt
from mpifed.plugin.registry import DATASETS


def read_leaf(folder: Path, writer_ids: dict[str, int],
              images: ImageRows | None = None) -> tuple[np.ndarray | ImageRows, np.ndarray, np.ndarray]:
    """Images (N x 1 x 28 x 28 uint8), labels and writer ids of every JSON file in ``folder``; with
    ``images``, the images are appended there (a file at a time) instead of held in memory."""
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataMissing(f"no LEAF JSON files in {folder}")
    xs: list[np.ndarray] = []
    ys, gs = [], []
    for path in files:
        try:
            d = json.loads(path.read_text())
            users = d["users"]
            for user, count in zip(users, d["num_samples"]):
                data = d["user_data"][user]
                x = np.asarray(data["x"], dtype=np.float32)
                if x.shape != (count, 784) or len(data["y"]) != count:
                    raise ValueError(f"user {user}: {x.shape} images and {len(data['y'])} labels, num_samples says "
                                     f"{count}")
                x = np.rint(np.clip(x, 0, 1) * 255).astype(np.uint8).reshape(-1, 1, 28, 28)
                if images is not None:
                    images.append(x)
                else:
                    xs.append(x)
                ys.append(np.asarray(data["y"], dtype=np.int64))
                gs.append(np.full(count, writer_ids.setdefault(user, len(writer_ids)), dtype=np.int64))
        except (KeyError, json.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"{path} is not a LEAF JSON file ({exc})") from None
    return images if images is not None else np.concatenate(xs), np.concatenate(ys), np.concatenate(gs)


@DATASETS.register("femnist")
class Femnist(Dataset):
    """FEMNIST (LEAF): 28x28 handwritten characters of ~3,500 writers, 62 classes (10 digits, 52
    letters). Every training sample keeps its writer, for the ``natural`` partition (writers
    grouped into clients, as FedCAD groups ~2,000 writers into 10 clients). ``digits_only``
    keeps the 10 digit classes. The test set is the union of LEAF's per-writer test splits. The
    training images go to a temporary file as each JSON file is read (LEAF's full FEMNIST is 805,263
    of them), so preparing holds one JSON file, not the data set."""

    @dataclass
    class Options:
        root: str = opt("data/raw/femnist", "folder with LEAF's train/ and test/ JSON folders (leaf/data/femnist/data)")
        digits_only: bool = opt(False, "keep only the digit classes 0-9")

    title = "FEMNIST"
    class_names = tuple("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")   # LEAF's label order
    needs = ("train/", "test/")
    how_to_get = ("Make LEAF's train/ and test/ folders of JSON files with LEAF's preprocess.sh and set "
                  "data.dataset.root to the folder that holds them")

    @classmethod
    def load(cls, options) -> RawData:
        root = cls.root(options)
        writers: dict[str, int] = {}
        trx, try_, trg = read_leaf(root / "train", writers, ImageRows((1, 28, 28)))
        tex, tey, _ = read_leaf(root / "test", writers)
        classes = 62
        if options.digits_only:
            keep, keep_te = try_ < 10, tey < 10
            trx, try_, trg = select(trx, np.flatnonzero(keep)), try_[keep], trg[keep]
            tex, tey = tex[keep_te], tey[keep_te]
            classes = 10
        return RawData(trx, try_, tex, tey, classes, f"LEAF FEMNIST JSON in {root} ({len(writers)} writers)",
                       train_groups=trg, files=sorted(root.glob("t*/*.json")))
