import numpy as np
import pytest

from mpifed.data.partitions import PARTITIONS, PartitionError, hold_out_per_class, split_summary


def labels(n=2000, classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, classes, size=n)


def split(name, y, clients, seed=1, groups=None, **opts):
    p = PARTITIONS[name]
    return p.split(y, clients, np.random.default_rng(seed), p.Options(**opts), groups)


@pytest.mark.parametrize("name,opts", [("iid", {}), ("dirichlet", {"beta": 0.3}), ("shards", {"shards_per_client": 2})])
def test_every_sample_exactly_once(name, opts):
    y = labels()
    parts = split(name, y, 17, **opts)
    assert len(parts) == 17
    allidx = np.concatenate(parts)
    assert len(allidx) == len(y) and len(np.unique(allidx)) == len(y)


@pytest.mark.parametrize("name,opts", [("iid", {}), ("dirichlet", {"beta": 0.3}), ("shards", {"shards_per_client": 3})])
def test_deterministic_in_seed(name, opts):
    y = labels()
    a, b, c = split(name, y, 10, 5, **opts), split(name, y, 10, 5, **opts), split(name, y, 10, 6, **opts)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))


def skew(parts, y):
    counts = split_summary(parts, y, 10)
    local = counts / counts.sum(1, keepdims=True)
    glob = counts.sum(0) / counts.sum()
    return float(np.mean(0.5 * np.abs(local - glob).sum(1)))


def test_dirichlet_skew_grows_as_beta_shrinks():
    y = labels(5000)
    s = [np.mean([skew(split("dirichlet", y, 10, seed, beta=beta), y) for seed in range(5)]) for beta in (100.0, 1.0, 0.1)]
    assert s[0] < s[1] < s[2]
    assert s[0] < 0.1 and s[2] > 0.5


def test_dirichlet_min_size_and_impossible_settings():
    y = labels(500)
    parts = split("dirichlet", y, 10, beta=0.1, min_size=20)
    assert min(len(p) for p in parts) >= 20
    with pytest.raises(PartitionError, match="min_size"):
        split("dirichlet", y, 10, beta=0.1, min_size=60)
    with pytest.raises(PartitionError, match="did not give every one"):
        split("dirichlet", y, 10, beta=0.001, min_size=45, max_tries=3)


def test_shards_give_each_client_s_shards():
    y = np.repeat(np.arange(10), 100)  # 1000 samples, 10 classes
    parts = split("shards", y, 10, shards_per_client=2)
    sizes = [len(p) for p in parts]
    assert sizes == [100] * 10  # 20 shards of 50
    for p in parts:
        assert len(np.unique(y[p])) <= 2
    uneven = split("shards", labels(1003), 7, shards_per_client=3)
    assert max(map(len, uneven)) - min(map(len, uneven)) <= 3


def test_too_many_clients():
    with pytest.raises(PartitionError, match="lower data.num_clients"):
        split("iid", labels(5), 10)
    with pytest.raises(PartitionError, match="shards"):
        split("shards", labels(10), 10, shards_per_client=2)


def test_hold_out_per_class():
    y = labels(1000)
    held, rest = hold_out_per_class(y, 7, np.random.default_rng(0))
    assert np.bincount(y[held], minlength=10).tolist() == [7] * 10
    assert len(np.intersect1d(held, rest)) == 0 and len(held) + len(rest) == 1000
    with pytest.raises(PartitionError, match="server_holdout_per_class"):
        hold_out_per_class(y, 500, np.random.default_rng(0))


def test_label_k_gives_each_client_k_classes():
    y = labels(3000)
    parts = split("label_k", y, 8, k=3)
    assert all(len(np.unique(y[p])) == 3 for p in parts)
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx) == len(y)   # 8 x 3 >= 10 classes: every class drawn here
    with pytest.raises(PartitionError, match="exceeds"):
        split("label_k", y, 4, k=11)


@pytest.mark.parametrize("opts", [{"distribution": "dirichlet", "beta": 0.3}, {"distribution": "power_law", "exponent": 1.5}])
def test_quantity_skew_keeps_labels_iid(opts):
    y = labels(20000)
    parts = split("quantity", y, 10, min_size=50, **opts)
    sizes = np.array([len(p) for p in parts])
    assert sizes.sum() == len(y) and sizes.min() >= 50 and sizes.max() > 3 * sizes.min()
    big = parts[int(np.argmax(sizes))]
    assert np.abs(np.bincount(y[big], minlength=10) / len(big) - 0.1).max() < 0.03


def test_natural_and_domain_need_groups():
    y = labels(100)
    groups = np.repeat(np.arange(10), 10)
    parts = split("natural", y, 3, groups=groups)
    assert sorted(len(np.unique(groups[p])) for p in parts) == [3, 3, 4]
    assert len(np.concatenate(parts)) == 100
    with pytest.raises(PartitionError, match="writers"):
        split("natural", y, 3)
    dom = split("domain", y, 10, groups=groups)
    assert [set(groups[p]) for p in dom] == [{g} for g in range(10)]
