import json

import numpy as np
import pytest

from mpifed.data.partitions import PartitionError, hold_out_per_class, hold_out_stratified, split_summary
from mpifed.registry import PARTITIONS


def labels(n=2000, classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, classes, size=n)


def split(name, y, clients, seed=1, groups=None, **opts):
    p = PARTITIONS.get(name)
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
    s = [np.mean([skew(split("dirichlet", y, 10,
                             seed, beta=beta), y) for seed in range(5)]) for beta in (100.0, 1.0, 0.1)]
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


def test_hold_out_stratified_keeps_the_class_proportions():
    y = np.repeat([0, 1, 2], [50, 30, 20])
    held, rest = hold_out_stratified(y, 10, np.random.default_rng(0))
    assert np.bincount(y[held]).tolist() == [5, 3, 2]
    # shares 3.5, 2.1, 1.4: rounded down to 3, 2, 1, the one left over to the largest remainder (class 0)
    held, rest = hold_out_stratified(y, 7, np.random.default_rng(0))
    assert np.bincount(y[held]).tolist() == [4, 2, 1]
    assert np.array_equal(np.sort(np.concatenate([held, rest])), np.arange(100)) and list(rest) == sorted(rest)
    again, _ = hold_out_stratified(y, 7, np.random.default_rng(0))
    assert np.array_equal(held, again)
    with pytest.raises(PartitionError, match="data.val_size=100 leaves no training samples"):
        hold_out_stratified(y, 100, np.random.default_rng(0))


def test_label_k_gives_each_client_k_classes():
    y = labels(3000)
    parts = split("label_k", y, 8, k=3)
    assert all(len(np.unique(y[p])) == 3 for p in parts)
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx) == len(y)   # 8 x 3 >= 10 classes: every class drawn here
    with pytest.raises(PartitionError, match="exceeds"):
        split("label_k", y, 4, k=11)


@pytest.mark.parametrize("opts",
                         [{"distribution": "dirichlet", "beta": 0.3}, {"distribution": "power_law", "exponent": 1.5}])
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


@pytest.mark.parametrize("seed", range(4))
def test_natural_deals_shuffled_writers_to_clients_in_runs(seed):
    """Client k holds the rows, ascending, of the k-th of K nearly equal runs of the shuffled writers."""
    rng = np.random.default_rng(100 + seed)
    groups = rng.integers(0, 60, size=3000) * 5 + 11             # writer ids with gaps
    k = int(rng.integers(1, 50))
    parts = split("natural", labels(3000), k, seed=seed, groups=groups)
    ids = np.unique(groups)
    runs = np.array_split(np.random.default_rng(seed).permutation(ids), k)
    assert len(parts) == k
    for part, run in zip(parts, runs):
        assert np.array_equal(part, np.flatnonzero(np.isin(groups, run))) and part.dtype == np.int64


def test_dirichlet_chunks_gives_equal_clients_from_grouped_dirichlet_lists():
    y = labels(4000)
    parts = split("dirichlet_chunks", y, 20, beta=0.1, group=10)
    assert [len(p) for p in parts] == [200] * 20
    assert len(np.unique(np.concatenate(parts))) == 4000            # every sample once
    held = [len(np.unique(y[p])) for p in parts]
    assert min(held) < 10                                            # still skewed: some clients lack classes
    assert np.array_equal(np.concatenate(parts), np.concatenate(split("dirichlet_chunks", y, 20, beta=0.1, group=10)))


def write_split(tmp_path, clients, name="split.json"):
    path = tmp_path / name
    if name.endswith(".npz"):
        np.savez(path, *[np.asarray(c) for c in clients])
    elif name.endswith(".npy"):
        np.save(path, np.asarray(clients))
    else:
        path.write_text(json.dumps({str(k): c for k, c in enumerate(clients)}))
    return str(path)


@pytest.mark.parametrize("name", ["split.json", "split.npz"])
def test_from_file_reproduces_the_split_exactly(tmp_path, name):
    y = labels(50)
    clients = [[3, 1, 4], [15, 9, 2, 6], [5, 35]]
    parts = split("from_file", y, 3, path=write_split(tmp_path, clients, name))
    assert [p.tolist() for p in parts] == [sorted(c) for c in clients]


def test_from_file_reads_equal_clients_from_a_2d_npy(tmp_path):
    clients = [[3, 1], [15, 9], [5, 35]]
    parts = split("from_file", labels(50), 3, path=write_split(tmp_path, clients, "split.npy"))
    assert [p.tolist() for p in parts] == [sorted(c) for c in clients]


def test_a_pickled_npy_partition_is_refused_without_running_it(tmp_path):
    """An object array is a pickle: loading it could run code (here, write a file), so it is not loaded."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    arr = np.empty(2, dtype=object)
    arr[:] = [Payload(), np.array([1])]
    path = tmp_path / "evil.npy"
    np.save(path, arr, allow_pickle=True)
    with pytest.raises(PartitionError, match=r"holds Python objects .* numpy.savez\('evil.npz', \*clients\)"):
        split("from_file", labels(50), 2, path=str(path))
    assert not marker.exists()


@pytest.mark.parametrize("clients,message", [
    ([[1, 2], [3]], "has 2 clients; set data.num_clients=2"),
    ([[1, 2], [3], [50]], "index 50, outside the 50 training samples"),
    ([[1, 2], [2], [4]], "sample 2 is given twice"),
    ([[1, 1], [2], [4]], "sample 1 is given twice"),
])
def test_from_file_is_validated(tmp_path, clients, message):
    with pytest.raises(PartitionError, match=message):
        split("from_file", labels(50), 3, path=write_split(tmp_path, clients))


def write_bad(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, np.ndarray):
        np.save(path, content)
    elif content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize("name,content,message", [
    ("zero-d.npy", np.array(5), "holds a single value, not one index array per client"),
    ("garbage.npy", b"\x93NUMPY\x01\x00" + b"\xff" * 40, "is not a readable NumPy file"),
    ("text.npy", b"[[1, 2], [3]]\n", "is not a NumPy .npy or .npz file"),
    ("garbage.npz", b"PK\x03\x04" + b"\xff" * 40, "is not a readable NumPy file"),
    ("binary.json", b"\xff\xfe\x00garbage", "is not valid JSON"),
    ("ragged.json", b'{"0": [[1, 2], [3]], "1": [4], "2": [5]}', "client 0 is not a list of integer indices"),
    ("empty.json", b"[]", "lists no clients"),
    ("empty.npy", np.zeros((0, 3), dtype=np.int64), "lists no clients"),
    ("folder.json", None, "is a folder, not a file"),
])
def test_from_file_names_the_file_and_the_problem(tmp_path, name, content, message):
    path = write_bad(tmp_path, name, content)
    with pytest.raises(PartitionError) as e:
        split("from_file", labels(50), 3, path=path)
    assert message in str(e.value) and path in str(e.value) and "num_clients=0" not in str(e.value)


def test_from_file_without_a_path_says_to_set_it():
    p = PARTITIONS.get("from_file")
    for call in (lambda: p.fingerprint(p.Options()), lambda: split("from_file", labels(50), 3)):
        with pytest.raises(PartitionError, match="data.partition.path is not set"):
            call()


def test_from_file_refuses_samples_the_server_holds(tmp_path):
    y = labels(50)
    pool = np.setdiff1d(np.arange(50), [7, 8])          # samples 7 and 8 held out for the server
    p = PARTITIONS.get("from_file")
    opts = p.Options(path=write_split(tmp_path, [[1, 2], [7], [9]]))
    with pytest.raises(PartitionError, match="sample 7 .* is held by the server"):
        p.split(y[pool], 3, np.random.default_rng(0), opts, None, indices=pool)
    parts = p.split(y[pool], 3, np.random.default_rng(0), p.Options(path=write_split(tmp_path, [[1, 2], [9], [10]])),
                    None, indices=pool)
    assert [pool[q].tolist() for q in parts] == [[1, 2], [9], [10]]


def test_a_changed_split_file_is_prepared_anew(tmp_path):
    from mpifed.settings import config
    from mpifed.preparation.build import ensure_prepared
    path = write_split(tmp_path, [list(range(0, 40)), list(range(40, 80))])
    sets = ["data.dataset.name=synthetic", "data.dataset.train_samples=100", "data.num_clients=2",
            "data.partition.name=from_file", f"data.partition.path={path}", f"data.prepared_root={tmp_path / 'p'}"]
    first = ensure_prepared(config.load([], sets)[0], log=lambda s: None)
    assert first.client_sizes.tolist() == [40, 40]
    write_split(tmp_path, [list(range(0, 10)), list(range(10, 100))])
    second = ensure_prepared(config.load([], sets)[0], log=lambda s: None)
    assert second.root != first.root and second.client_sizes.tolist() == [10, 90]


def test_class_counts_counted_in_groups_of_clients_are_each_clients_counts():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 7, 1000)
    parts = [rng.choice(1000, rng.integers(0, 30), replace=False) for _ in range(200)] + [np.array([], dtype=np.int64)]
    each = np.stack([np.bincount(labels[p], minlength=7) for p in parts])
    assert np.array_equal(split_summary(parts, labels, 7, group=17), each)
    assert split_summary([], labels, 7).shape == (0, 7)
