"""Local steps: nothing in them waits for the host."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import run_debug, tiny, watch_local_steps
from mpifed.registry import ALGORITHMS
from test_method_behaviour import CASES

AUGMENT = ["data.augment.crop_padding=2", "data.augment.flip=true", "data.augment.rotation=10", "data.augment.cutout=4",
           "data.dataset.channels=3", "data.dataset.size=12", "train.grad_clip=1.0", "train.rounds=2"]

# operations whose result the host must read: on a GPU each one waits for the device
HOST_READS = {"aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero", "aten::masked_select", "aten::_unique2",
              "aten::unique_consecutive", "aten::equal"}


class HostReads(TorchDispatchMode):
    """Records the operations that read a tensor's values on the host (``.item()``, ``bool(t)``, a
    boolean mask, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        masks = args[1] if name.startswith("aten::index") and len(args) > 1 and isinstance(args[1], (list, tuple)) else []
        if name in HOST_READS or any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in masks):
            self.found.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.e2e
@pytest.mark.parametrize("method", sorted(ALGORITHMS.names()))
def test_no_local_step_reads_tensors_on_the_host(method, tmp_path, monkeypatch):
    """Each method's step and batch making (augmentation on, its own term on) ask the host for no
    tensor's value: on a GPU such a read stops the CPU until the GPU catches up (the GPU test
    checks the device side under torch.cuda.set_sync_debug_mode)."""
    mode = HostReads()
    watch_local_steps(monkeypatch, lambda: mode)
    on = [o for o in CASES[method][0] if not o.startswith("train.participation")]
    run_debug(tiny(tmp_path, f"algorithm.name={method}", *AUGMENT, *on))
    assert mode.found == [], sorted(set(mode.found))


def test_the_host_read_detector_sees_a_boolean_mask_and_item():
    x = torch.randn(4, 3)
    with HostReads() as mode:
        x[x > 0].sum()
        x.sum().item()
    assert mode.found == ["aten::index", "aten::_local_scalar_dense"]


def test_losses_run_on_meta_tensors():
    """No loss has an output shape that depends on the data (a meta tensor has none)."""
    from mpifed import losses as L
    from mpifed.algorithms.feddistill import class_logit_distillation
    from mpifed.algorithms.fedproto import prototype_loss

    def m(*shape):
        return torch.randn(*shape, device="meta", requires_grad=True)
    y = torch.zeros(8, dtype=torch.long, device="meta")
    known = torch.ones(10, device="meta")
    losses = [L.kd_loss(m(8, 10), m(8, 10), 2.0), L.ntd_loss(m(8, 10), m(8, 10), y, 2.0),
              *[L.csd_loss(m(8, 10), m(8, 10), y, m(10, 10), 2.0, mask=k) for k in ("adaptive", "forcible", "none")],
              L.cad_loss(m(8, 10), m(8, 10), y, m(10), 2.0), L.moon_loss(m(8, 5), m(8, 5), m(8, 5), 0.5),
              class_logit_distillation(m(8, 10), y, m(10, 10), known, 2.0), prototype_loss(m(8, 5), y, m(10, 5), known)]
    for loss in losses:
        assert loss.device.type == "meta" and loss.shape == ()
        loss.backward()
