"""A run's trained model, rebuilt from its directory alone, and its evaluation on a data set.

The network is the run's (its ``model`` with the method's extensions, e.g. MOON's projection
head, from the run's own plugin code when it used any) with the weights of ``model.pt``, in eval
mode; the transform turns inputs as the data set stores them (uint8 images, N x C x H x W, or
token ids) into what the network takes, with the normalisation the run trained with. Evaluated
on the run's own test set, with the run's thread count, the accuracy is the one the run
recorded (``final_test_acc``): the same code on the same batches.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import yaml

from mpifed.settings import config, plugins
from mpifed.run import provenance
from mpifed.data.prepared import Manifest
from mpifed.preparation.build import ensure_prepared
from mpifed.data.raw import class_names
from mpifed.data.store import load_eval_batches
from mpifed.data.transforms import BatchTransform, TokenTransform, make_transform
from mpifed.local.evaluation import evaluate_share, evaluation_figures, validation
from mpifed.local.flat import FlatModel
from mpifed.local.inference import InferenceCopy
from mpifed.models import build_model
from mpifed.round.protocol import evaluation_layout
from mpifed.plugin.registry import ALGORITHMS, DATASETS
from mpifed.run.rundir import RunDir
from mpifed.run.record import RunRecord


class TrainedError(ValueError):
    """A run directory whose model cannot be rebuilt or evaluated, with what to do."""


@dataclass
class Trained:
    """A run's model: the network (eval mode), the transform its inputs need, and what it was trained on."""

    path: Path
    config: config.Config
    manifest: Manifest
    module: torch.nn.Module
    inputs: BatchTransform | TokenTransform   # stored inputs to what the network takes (its eval())
    class_names: list[str]

    @property
    def transform(self) -> Callable[[Any], Any]:
        """Inputs as the data set stores them (uint8 images N x C x H x W, or token ids) to the network's."""
        return self.inputs.eval

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device


def load(run_dir: str | Path, device: str | torch.device = "cpu", trust: bool = False,
         allow: str = plugins.ALLOW) -> Trained:
    """Rebuild the model of the run in ``run_dir`` (its plugins restored from its record: the same
    code loaded already, else, with ``trust``, the run's own; its data prepared again if its prepared
    folder is gone); ``allow``: how messages tell the user to give ``trust``."""
    path = Path(run_dir)
    run = RunDir(path)
    if not run.holds_run():
        raise TrainedError(f"{path}: no run there (no config.yaml); give a run directory, e.g. runs/<name>")
    if not RunRecord(path).model_file.is_file():
        state = run.state() or "no status"
        raise TrainedError(f"{path} has no model.pt: the run is not finished ({state}), or it ran with "
                           f"run.save_model=false. Finish it with --resume {path}")
    plugins.restore(provenance.recorded_plugins(path), path, f"the run in {path}", changed="copy", trust=trust,
                    allow=allow)
    try:
        cfg = config.build(run.read_config())
    except (OSError, yaml.YAMLError) as exc:
        raise TrainedError(f"{path}/config.yaml cannot be read ({exc})") from None
    manifest = ensure_prepared(cfg, log=lambda _: None)
    net = build_model(cfg.model.name, cfg.model.options, manifest.input_shape, manifest.num_classes)
    net = ALGORITHMS.get(cfg.algorithm.name).extend_model(net, cfg.algorithm.options).to(device)
    try:
        weights = torch.load(RunRecord(path).model_file, map_location=device, weights_only=True)
        net.load_state_dict(weights)
    except Exception as exc:  # a damaged file fails inside torch in many ways
        raise TrainedError(f"{path}/model.pt cannot be loaded into the run's {cfg.model.name} ({type(exc).__name__}: "
                           f"{exc}): the file is damaged or from another run") from None
    transform = make_transform(manifest, cfg.data.augment, device)
    names = class_names(DATASETS.get(cfg.data.dataset.name), manifest.num_classes) or [
        str(c) for c in range(manifest.num_classes)]
    return Trained(path, cfg, manifest, net.eval(), transform, list(names))


def evaluate(trained: Trained, data: str = "test", overrides: list[str] | None = None) -> dict[str, Any]:
    """The model's figures on ``data``: ``test`` (the run's test set: test_acc, test_loss,
    per_class_acc, and per_group_acc where the data set has groups), ``val`` (its validation set:
    val_acc, val_loss), or a config file whose data set takes the place of the run's (the same
    classes and input shape; ``overrides`` are applied on top, e.g. data.test_subset=0)."""
    cfg, manifest = trained.config, trained.manifest
    if data not in ("test", "val"):
        _, d = config.load([data], overrides or [], base=cfg.to_dict())
        manifest = ensure_prepared(config.build(d), log=lambda _: None)
        if (manifest.num_classes, tuple(manifest.input_shape)) != (trained.manifest.num_classes,
                                                                    tuple(trained.manifest.input_shape)):
            raise TrainedError(f"--data {data}: its data set has {manifest.num_classes} classes of shape "
                               f"{tuple(manifest.input_shape)}, the model was trained on "
                               f"{trained.manifest.num_classes} of "
                               f"{tuple(trained.manifest.input_shape)}: it cannot be evaluated there")
    elif data == "val" and not manifest.val_size:
        raise TrainedError(f"{trained.path} holds no validation set (data.val_size is 0); evaluate on test")
    with _threads(cfg.resources.threads):
        test = data != "val"
        batch = cfg.train.eval_batch_size
        batches = load_eval_batches(manifest, batch, 0, 1, trained.device, test=test)
        layout = evaluation_layout(manifest.test_size if test else 0, batch, manifest.num_classes,
                                   len(manifest.group_names), manifest.val_size)
        flat = FlatModel(trained.module)
        totals = layout.views(evaluate_share(InferenceCopy(flat), trained.inputs, batches, layout))
    out = evaluation_figures(totals, manifest.test_class_counts, manifest.test_group_counts,
                    manifest.group_names) if test else {}
    if manifest.val_size:
        out.update(validation(totals, manifest.val_size))
    if not test:
        out = {k: v for k, v in out.items() if k.startswith("val")}
    out["samples"] = manifest.test_size if test else manifest.val_size
    return out


@contextmanager
def _threads(count: int) -> Iterator[None]:
    """torch's thread count as the run had it (it changes CPU results in the last digits), then back."""
    before = torch.get_num_threads()
    if count > 0:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
