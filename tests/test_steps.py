"""Local steps: nothing in them waits for the host; precision; what CUDA graph capture does on a CPU."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import run_debug, small_setup, tiny, watch_local_steps
from mpifed.algorithms.base import Client, ClientContext, role_problems
from mpifed.settings.config import ConfigError, TrainConfig
from mpifed.data.store import ClientData
from mpifed.data.transforms import BatchTransform
from mpifed.local.optim import make_optimizer
from mpifed.registry import ALGORITHMS
from mpifed.local.steps import LocalSteps, make_steps

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
        indexed = name.startswith("aten::index") and len(args) > 1 and isinstance(args[1], (list, tuple))
        masks = args[1] if indexed else []
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
    on = [o for o in ALGORITHMS.get(method).switches.on if not o.startswith("train.participation")]
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
    from mpifed.local import losses as L
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


# ------------------------------------------------------------------ the capturable optimisers
@pytest.mark.parametrize("kind, extra", [("sgd", {}), ("sgd", {"momentum": 0.0}), ("sgd", {"weight_decay": 1e-3}),
                                         ("adam", {"weight_decay": 1e-3}), ("adamw", {"weight_decay": 1e-2})])
def test_capturable_optimiser_follows_the_eager_one_across_clients(kind, extra):
    """One capturable optimiser, reset per client, takes the steps a fresh eager optimiser per
    client takes, up to float32 rounding."""
    cfg = TrainConfig(optimizer=kind, **extra)
    setup = small_setup()
    eager, graph = setup.new_model(), setup.new_model()
    graph.load(eager.floats)
    g = torch.Generator().manual_seed(0)
    shared = make_optimizer(graph, 0.1, cfg, capturable=True)
    for client, lr in enumerate((0.1, 0.05)):
        fresh = make_optimizer(eager, lr, cfg)
        shared.reset(lr)
        for _ in range(4):
            grad = torch.randn(setup.num_params, generator=g)
            for flat, opt in ((eager, fresh), (graph, shared)):
                opt.zero_grad()
                flat.grad.copy_(grad)
                opt.clip_grad_norm(1.0)
                opt.step()
        assert torch.allclose(graph.floats, eager.floats, rtol=1e-5, atol=1e-6), client


# ------------------------------------------------------------------ CUDA graphs on a CPU
def test_cuda_graphs_on_needs_a_gpu_and_auto_falls_back_to_eager():
    with pytest.raises(ConfigError, match="resources.cuda_graphs=on needs the workers on a GPU"):
        make_steps("fp32", "on", torch.device("cpu"))
    assert not make_steps("fp32", "auto", torch.device("cpu")).graphs
    assert not make_steps("fp32", "off", torch.device("cpu")).graphs


@pytest.mark.e2e
def test_cuda_graphs_on_with_cpu_workers_is_a_clear_error(tmp_path):
    p = run_debug(tiny(tmp_path, "resources.cuda_graphs=on"), check=False)
    assert p.returncode == 2 and "resources.cuda_graphs=on needs the workers on a GPU" in p.stderr
    assert "Traceback" not in p.stderr


def test_which_methods_capture_their_step_follows_from_what_they_declare():
    """A role's step is captured unless it collects per-batch sums (on_batch), makes its own step,
    optimiser or training loop, or names its own reason (eager). Read from each registered method's classes."""
    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        role = cls.Client
        own = [h for h in ("on_batch", "step", "optimizer", "train") if getattr(role, h) is not getattr(Client, h)]
        assert bool(role.eager_reason()) == bool(own or role.eager), name
        assert role_problems(cls) == [], name


def _context(setup, runner, samples=10):
    g = torch.Generator().manual_seed(0)
    data = ClientData(0, torch.randint(0, 255, (samples, 1, 2, 2), dtype=torch.uint8, generator=g),
                      torch.randint(0, 3, (samples,), generator=g))
    return ClientContext(0, 1, 0.1, setup.new_model(), torch.zeros(setup.num_floats), data,
                         BatchTransform([0.5], [0.5], 0, False, 0, "cpu"), torch.Generator().manual_seed(1),
                         setup.train, runner=runner)


def test_a_step_that_cannot_be_captured_says_so_once_and_runs_eagerly():
    class Weighted(Client):
        eager = "its loss reads a host-side table"

        def loss(self, ctx, batch, out):
            return 2 * F.cross_entropy(out.logits, batch.y)

    told = []
    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_epochs=2)
    runner = LocalSteps(graphs=True, log=told.append)       # graphs on, as on a GPU
    ctx = _context(setup, runner)
    Weighted(None, setup).train(ctx)
    assert ctx.steps == 6 and len(told) == 1
    assert "Weighted's local step is not captured (its loss reads a host-side table)" in told[0]
    assert "runs eagerly" in told[0]


def test_with_graphs_the_teacher_runs_per_batch():
    from mpifed.algorithms.teacher import Teacher
    setup = small_setup()
    teacher = Teacher(setup)
    assert teacher._cached(_context(setup, LocalSteps()))
    assert not teacher._cached(_context(setup, LocalSteps(graphs=True)))


# ------------------------------------------------------------------ precision
def test_bf16_autocast_only_with_bf16():
    setup = small_setup()
    x = torch.randn(4, 1, 2, 2)
    model = setup.new_model().model
    for precision, dtype in (("fp32", torch.float32), ("tf32", torch.float32), ("bf16", torch.bfloat16)):
        with make_steps(precision, "off", torch.device("cpu")).autocast(torch.device("cpu")):
            assert model(x).dtype == dtype, precision


def test_a_batch_shorter_than_the_batch_size_is_never_captured():
    asked = []

    class Asking(Client):
        @classmethod
        def eager_reason(cls):
            asked.append(1)
            return "not on a CPU"

    setup = small_setup()
    setup.train = TrainConfig(batch_size=4, local_epochs=1)
    ctx = _context(setup, LocalSteps(graphs=True), samples=6)   # one batch of 4, one of 2
    Asking(None, setup).train(ctx)
    assert ctx.steps == 2 and len(asked) == 1     # for the full batch only


def _tiny_distilbert_batch():
    pytest.importorskip("transformers")
    from mpifed.local.flat import FlatModel
    from mpifed.models.distilbert import DistilBert
    opts = DistilBert.Options(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=16)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 64, (16, 16), generator=g)
    lengths = torch.randint(4, 17, (16, 1), generator=g)
    mask = (torch.arange(16) < lengths).long()                  # padded texts of 4 to 16 tokens
    torch.manual_seed(0)
    return FlatModel(DistilBert.build(opts, (16,), 3)), {"input_ids": ids * mask, "attention_mask": mask}, \
        torch.randint(0, 3, (16,), generator=g)


def test_bf16_step_on_a_distilbert_shaped_model_agrees_with_fp32():
    """The tolerance docs/performance.md states for resources.precision=bf16: one step's loss within
    1%, its gradient within 2% (relative norm of the difference) and cosine >= 0.999."""
    from mpifed.algorithms.base import forward
    flat, x, y = _tiny_distilbert_batch()
    flat.model.eval()
    out = {}
    for precision in ("fp32", "bf16"):
        flat.zero_grad()
        with make_steps(precision, "off", torch.device("cpu")).autocast(torch.device("cpu")):
            logits = forward(flat.model, x).logits
            loss = F.cross_entropy(logits, y)
        loss.backward()
        out[precision] = (logits.dtype, loss.item(), flat.grad.clone())
    (dtype32, loss32, grad32), (dtype16, loss16, grad16) = out["fp32"], out["bf16"]
    assert dtype32 == torch.float32 and dtype16 == torch.bfloat16
    assert abs(loss16 - loss32) <= 0.01 * loss32
    assert (grad16 - grad32).norm() <= 0.02 * grad32.norm()
    assert F.cosine_similarity(grad16, grad32, dim=0) >= 0.999
