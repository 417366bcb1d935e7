"""FedAvg's weighted aggregation and the split-invariant evaluation sums."""
import warnings

import numpy as np
import torch

import pytest

from conftest import small_setup
from mpifed.algorithms.base import ClientContext, Replies
from mpifed.settings.config import TrainConfig
from mpifed.data.store import ClientData, EvalBatch, eval_batch_ids
from mpifed.data.transforms import BatchTransform
from mpifed.local.evaluation import evaluate_share, forgetting, evaluation_figures, validation
from mpifed.options import NoOptions
from mpifed.round.protocol import build_layouts
from mpifed.registry import ALGORITHMS


@pytest.mark.parametrize("weighting,expected", [("samples", (5 * 1.0 + 20 * 2.0 + 75 * 4.0) / 100),
                                                ("uniform", (1.0 + 2.0 + 4.0) / 3)])
def test_weighted_average_with_uneven_clients(weighting, expected):
    setup = small_setup()
    train = TrainConfig(client_weights=weighting)
    algo = ALGORITHMS.get("fedavg")(NoOptions(), setup)
    client, server = algo.client(), algo.server(None)
    sums = build_layouts(algo.messages(), setup.num_floats, 0, 1, 1, 3, 0).sums
    workers = [sums.views(sums.empty()) for _ in range(2)]
    flat = setup.new_model()
    states = [torch.full((setup.num_floats,), v) for v in (1.0, 2.0, 4.0)]
    for k, (n, w) in enumerate(zip([5, 20, 75], states)):   # clients 0 and 1 on worker 0, client 2 on worker 1
        flat.load(w)
        ctx = ClientContext(k, 1, 0.1, flat, w, ClientData(k, torch.zeros(n, 1, 2, 2, dtype=torch.uint8),
                            torch.zeros(n, dtype=torch.int64)), None, torch.Generator(), train)
        for name, v in client.uplink(ctx).items():
            workers[0 if k < 2 else 1][name] += v
    totals = {k: workers[0][k] + workers[1][k] for k in ("model", "weight")}
    new = server.aggregate(1, states[0], Replies(totals, {}, []))
    assert new.dtype == torch.float32
    assert torch.allclose(new, torch.full_like(new, expected))


def make_batches(n=230, bs=50, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 255, (n, 1, 4, 4), generator=g, dtype=torch.uint8)
    y = torch.randint(0, classes, (n,), generator=g)
    return [EvalBatch(b, x[b * bs:(b + 1) * bs], y[b * bs:(b + 1) * bs], None) for b in range(-(-n // bs))], y


def test_evaluation_sums_do_not_depend_on_the_split():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4)).eval()
    tf = BatchTransform([0.5], [0.25], 0, False, 0, "cpu")
    batches, y = make_batches()
    packer = build_layouts(ALGORITHMS.get("fedavg")(NoOptions(), small_setup()).messages(), 1, 0,
                           230, 50, 4, 0).evaluation
    single = evaluate_share(model, tf, batches, packer)
    for workers in (2, 3, 7):
        total = np.zeros(packer.nbytes // 8)
        for w in range(workers):
            ids = eval_batch_ids([230], 50, w, workers)
            total += evaluate_share(model, tf, [batches[b] for _, b in ids], packer).view(np.float64)
        assert np.array_equal(total, single.view(np.float64))
    views = packer.views(single)
    result = evaluation_figures(views, np.bincount(y.numpy(), minlength=4), np.zeros(0), [])
    with torch.no_grad():
        logits = model(tf.eval(torch.cat([b.inputs for b in batches])))
    assert abs(result["test_acc"] - (logits.argmax(1) == y).double().mean().item()) < 1e-12
    assert abs(result["test_loss"] - torch.nn.functional.cross_entropy(logits, y).item()) < 1e-6
    assert len(result["per_class_acc"]) == 4


def test_validation_batches_share_the_pass_and_do_not_depend_on_the_split():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4)).eval()
    tf = BatchTransform([0.5], [0.25], 0, False, 0, "cpu")
    test, y = make_batches()
    val, vy = make_batches(n=120, seed=1)
    for b in val:
        b.val = True
    messages = ALGORITHMS.get("fedavg")(NoOptions(), small_setup()).messages()
    packer = build_layouts(messages, 1, 0, 230, 50, 4, 0, val_size=120).evaluation
    sets = [test, val]
    single = evaluate_share(model, tf, test + val, packer)
    for workers in (2, 3, 7):
        total = np.zeros(packer.nbytes // 8)
        for w in range(workers):
            mine = [sets[s][b] for s, b in eval_batch_ids([230, 120], 50, w, workers)]
            total += evaluate_share(model, tf, mine, packer).view(np.float64)
        assert np.array_equal(total, single.view(np.float64))
    views = packer.views(single)
    counts = np.bincount(y.numpy(), minlength=4)
    plain = build_layouts(messages, 1, 0, 230, 50, 4, 0).evaluation   # without a validation set
    assert plain.nbytes < packer.nbytes
    alone = evaluation_figures(plain.views(evaluate_share(model, tf, test, plain)), counts, np.zeros(0), [])
    assert evaluation_figures(views, counts, np.zeros(0), []) == alone
    result = validation(views, 120)
    with torch.no_grad():
        logits = model(tf.eval(torch.cat([b.inputs for b in val])))
    assert abs(result["val_acc"] - (logits.argmax(1) == vy).double().mean().item()) < 1e-12
    assert abs(result["val_loss"] - torch.nn.functional.cross_entropy(logits, vy).item()) < 1e-6
    assert eval_batch_ids([230, 120], 50, 1, 3) == [(0, 1), (0, 4), (1, 2)]   # batches 1, 4, 7 of 0..7


def test_forgetting_is_fedntd_eq5():
    history = [[0.5, 0.2], [0.9, 0.4], [0.6, 0.5]]
    # class 0 peaked at 0.9 and ends at 0.6; class 1 ends at its best, 0.1 above its earlier peak
    assert abs(forgetting(history) - ((0.9 - 0.6) + (0.4 - 0.5)) / 2) < 1e-12
    assert forgetting(history[:1]) is None
    with_absent = [[0.9, None, 0.4], [0.6, None, 0.5]]       # class 1 never in the test set: no warning, no term
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert abs(forgetting(with_absent) - ((0.9 - 0.6) + (0.4 - 0.5)) / 2) < 1e-12
        assert forgetting([[None, None], [None, None]]) is None
