import hashlib
import json

import numpy as np
import pytest

from mpifed.settings import config
from mpifed.data import prepared
from mpifed.preparation import build
from mpifed.data.prepared import Manifest, PreparedDataError, block_starts, verify_blocks, verify_files
from mpifed.preparation.build import ensure_prepared, prepare
from mpifed.preparation.spec import prepare_spec, prepared_dir
from mpifed.registry import DATASETS
from mpifed.data.shards import ShardError, read_client, read_rows, read_shard, write_block, write_shard


def cfg_for(tmp_path, *extra):
    cfg, _ = config.load(overrides=["data.dataset.name=synthetic", "data.dataset.train_samples=300",
                                    "data.dataset.test_samples=50", "data.num_clients=4", "data.partition.min_size=5",
                                    f"data.prepared_root={tmp_path}", *extra])
    return cfg


def test_round_trip_and_attributes(tmp_path):
    x = np.random.default_rng(0).integers(0, 255, (20, 3, 4, 4), dtype=np.uint8)
    y = np.arange(20, dtype=np.int64) % 3
    write_shard(tmp_path / "s.h5", x, y, {"client_id": 7, "class_counts": [7, 7, 6], "partition": {"name": "iid"}})
    s = read_shard(tmp_path / "s.h5")
    assert np.array_equal(s.images, x) and np.array_equal(s.labels, y) and s.labels.dtype == np.int64
    assert s.attrs["client_id"] == 7 and s.attrs["class_counts"] == [7, 7, 6]
    assert s.attrs["partition"] == {"name": "iid"}
    assert s.attrs["num_samples"] == 20
    xi, yi, g = read_rows(tmp_path / "s.h5", 5, 9)
    assert np.array_equal(xi["images"], x[5:9]) and np.array_equal(yi, y[5:9]) and g is None


def test_named_input_arrays_round_trip(tmp_path):
    ids = np.arange(40, dtype=np.uint16).reshape(10, 4)
    mask = (ids % 3 > 0).astype(np.uint8)
    y = np.arange(10, dtype=np.int64) % 2
    write_shard(tmp_path / "t.h5", {"input_ids": ids, "attention_mask": mask}, y, {"client_id": 1})
    s = read_shard(tmp_path / "t.h5")
    assert list(s.inputs) == ["input_ids", "attention_mask"] and s.inputs["input_ids"].dtype == np.uint16
    assert np.array_equal(s.inputs["attention_mask"], mask) and np.array_equal(s.labels, y)
    xi, yi, _ = read_rows(tmp_path / "t.h5", 2, 5)
    assert np.array_equal(xi["input_ids"], ids[2:5]) and np.array_equal(yi, y[2:5])
    with pytest.raises(ValueError, match="'labels'.*a name other than"):
        write_shard(tmp_path / "u.h5", {"labels": ids}, y, {})
    with pytest.raises(ValueError, match="'x'.*float64"):
        write_shard(tmp_path / "u.h5", {"x": ids.astype(float)}, y, {})


def test_corrupt_truncated_and_missing_shards_are_reported(tmp_path):
    x = np.random.default_rng(1).integers(0, 255, (50, 1, 8, 8), dtype=np.uint8)
    y = np.zeros(50, dtype=np.int64)
    path = tmp_path / "s.h5"
    write_shard(path, x, y, {"client_id": 0})
    raw = bytearray(path.read_bytes())
    idx = raw.find(x.tobytes()[:64])  # the image data inside the file
    assert idx > 0
    raw[idx + 10] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match="checksum"):
        read_shard(path)
    path.write_bytes(bytes(raw[: len(raw) // 2]))
    with pytest.raises(ShardError, match="corrupt or truncated"):
        read_shard(path)
    with pytest.raises(ShardError, match="missing.*mpifed.prepare"):
        read_shard(tmp_path / "nope.h5")


def test_prepare_writes_shards_and_manifest(tmp_path):
    cfg = cfg_for(tmp_path, "data.server_holdout_per_class=3")
    m = prepare(cfg, log=lambda s: None)
    assert m.num_clients == 4 and m.client_class_counts.shape == (4, 10)
    assert m.client_sizes.sum() + m.server_size == 300 and m.server_size == 30
    assert m.test_size == 50 and m.image_shape == (1, 8, 8)
    for k in range(4):
        s = read_client(m.client_block(k), k)
        assert s.attrs["client_id"] == k and s.attrs["dataset"] == "synthetic" and s.attrs["seed"] == 0
        assert np.bincount(s.labels, minlength=10).tolist() == m.client_class_counts[k].tolist()
    raw = json.loads((m.root / "manifest.json").read_text())
    assert raw["stats"]["clients"] == 4 and "label_skew_tv_mean" in raw["stats"]
    verify_files(m)


def test_without_a_validation_set_the_spec_and_folder_are_as_before(tmp_path):
    cfg = cfg_for(tmp_path)
    assert prepare_spec(cfg) == {
        "dataset": {"name": "synthetic", "train_samples": 300, "test_samples": 50, "num_classes": 10, "channels": 1,
                    "size": 8, "noise": 40.0, "data_seed": 0},
        "num_clients": 4,
        "partition": {"name": "dirichlet", "beta": 0.5, "min_size": 5, "balance": True, "max_tries": 10000},
        "seed": 0, "train_subset": 0, "test_subset": 0, "server_holdout_per_class": 0}
    assert prepared_dir(cfg).name == "synthetic-dirichlet-k4-2901ec34e6"
    m = prepare(cfg, log=lambda s: None)
    assert m.val_size == 0 and not m.val_path.exists()
    assert "val" not in json.loads((m.root / "manifest.json").read_text())


def test_validation_set_is_stratified_disjoint_and_deterministic(tmp_path):
    extra = ("data.val_size=40", "data.server_holdout_per_class=3", "data.train_subset=200")
    cfg = cfg_for(tmp_path / "a", *extra)
    m = prepare(cfg, log=lambda s: None)
    raw = DATASETS.get("synthetic").load(cfg.data.dataset.options)
    index = {x.tobytes(): i for i, x in enumerate(raw.train_x)}
    assert len(index) == 300
    val = read_shard(m.val_path, verify=True)
    held = sorted(index[x.tobytes()] for x in val.images)
    assert len(set(held)) == 40 and np.array_equal(raw.train_y[held], val.labels)
    counts = np.bincount(val.labels, minlength=10)
    share = 40 * np.bincount(raw.train_y, minlength=10) / 300
    assert counts.sum() == 40 and np.all(np.abs(counts - share) < 1)
    assert counts.tolist() == m.val_class_counts.tolist() == val.attrs["class_counts"]
    assert json.loads((m.root / "manifest.json").read_text())["val"] == {"num_samples": 40,
                                                                         "class_counts": counts.tolist()}
    # data.train_subset takes the first 200 of the samples left; the clients and the server share them out
    shards = [read_client(m.client_block(k), k) for k in range(m.num_clients)] + [read_shard(m.server_path)]
    used = sorted(index[x.tobytes()] for s in shards for x in s.images)
    assert used == [i for i in range(300) if i not in set(held)][:200]
    test = {x.tobytes() for x in read_shard(m.test_path).images}
    assert not test & {x.tobytes() for x in val.images}
    verify_files(m)
    again = prepare(cfg_for(tmp_path / "b", *extra), log=lambda s: None)
    assert again.val_path.read_bytes() == m.val_path.read_bytes()
    other = prepare(cfg_for(tmp_path / "c", *extra, "data.partition_seed=1"), log=lambda s: None)
    assert other.val_path.read_bytes() != m.val_path.read_bytes()


def tree_digest(root):
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + p.read_bytes())
    return h.hexdigest()


def test_same_config_prepared_twice_gives_identical_files(tmp_path):
    a = prepare(cfg_for(tmp_path / "a"), log=lambda s: None)
    b = prepare(cfg_for(tmp_path / "b"), log=lambda s: None)
    assert a.root.name == b.root.name
    assert tree_digest(a.root) == tree_digest(b.root)


def test_reuse_and_mismatch(tmp_path):
    cfg = cfg_for(tmp_path)
    m = ensure_prepared(cfg, log=lambda s: None)
    mtime = (m.root / "manifest.json").stat().st_mtime_ns
    assert ensure_prepared(cfg, log=lambda s: None).root == m.root
    assert (m.root / "manifest.json").stat().st_mtime_ns == mtime
    other = cfg_for(tmp_path, "data.partition.beta=0.1")
    assert prepared_dir(other) != m.root  # another setting gets its own folder
    pinned = cfg_for(tmp_path, "data.partition.beta=0.1", f"data.prepared_dir={m.root}")
    with pytest.raises(PreparedDataError, match=r"differing: partition.beta.*--force"):
        ensure_prepared(pinned, log=lambda s: None)


def test_a_missing_block_is_caught_before_training(tmp_path):
    m = prepare(cfg_for(tmp_path), log=lambda s: None)
    m.client_block(2).unlink()
    with pytest.raises(ShardError, match=r"1 block\(s\) .* missing, .*block_00000.h5 \(clients 0 to 3\).*--force"):
        verify_files(Manifest.load(m.root))


def few_per_block(monkeypatch, clients: int = 3) -> None:
    monkeypatch.setattr(prepared, "CLIENTS_PER_BLOCK", clients)


def test_clients_are_packed_many_to_a_file_and_read_one_by_one(tmp_path, monkeypatch):
    few_per_block(monkeypatch)
    m = prepare(cfg_for(tmp_path, "data.num_clients=8"), log=lambda s: None)
    assert m.blocks.tolist() == [0, 3, 6] and sorted(p.name for p in (m.root / "clients").iterdir()) == [
        "block_00000.h5", "block_00001.h5", "block_00002.h5", "index.h5"]
    assert [m.client_block(k).name for k in (0, 2, 3, 7)] == ["block_00000.h5", "block_00000.h5", "block_00001.h5",
                                                              "block_00002.h5"]
    assert list(m.block_clients(2)) == [6, 7]
    raw = DATASETS.get("synthetic").load(cfg_for(tmp_path).data.dataset.options)
    index = {x.tobytes(): i for i, x in enumerate(raw.train_x)}
    seen = []
    for k in range(8):
        s = read_client(m.client_block(k), k)
        assert len(s.labels) == m.client_sizes[k] and s.attrs["client_id"] == k
        assert np.bincount(s.labels, minlength=10).tolist() == m.client_class_counts[k].tolist()
        assert np.array_equal(raw.train_y[[index[x.tobytes()] for x in s.images]], s.labels)
        seen += [index[x.tobytes()] for x in s.images]
    assert sorted(seen) == list(range(300))
    with pytest.raises(ShardError, match="holds clients 3 to 5, not 6"):
        read_client(m.block_path(1), 6)
    for w in range(2):
        verify_blocks(m, w, 2)


def test_a_block_keeps_each_clients_checksum_and_refuses_offsets_that_do_not_cut_its_rows(tmp_path):
    x = np.random.default_rng(2).integers(0, 255, (9, 1, 4, 4), dtype=np.uint8)
    y = np.arange(9, dtype=np.int64) % 3
    write_block(tmp_path / "b.h5", {"images": x}, y, None, np.array([0, 4, 9]), 10, {"seed": 1})
    write_shard(tmp_path / "s.h5", x[4:], y[4:], {"seed": 1})
    got = read_client(tmp_path / "b.h5", 11)
    assert np.array_equal(got.images, x[4:])
    assert got.attrs["checksum"] == read_shard(tmp_path / "s.h5").attrs["checksum"]      # what its own shard holds
    assert got.attrs["seed"] == 1 and got.attrs["client_id"] == 11 and got.attrs["num_samples"] == 5
    for offsets in ([0, 4, 8], [1, 4, 9], [0, 4, 4, 9]):
        with pytest.raises(ValueError, match="offsets must rise from 0 to 9"):
            write_block(tmp_path / "c.h5", {"images": x}, y, None, np.array(offsets), 0, {})
    with pytest.raises(ValueError, match="'labels'.*a name other than"):
        write_block(tmp_path / "c.h5", {"labels": x}, y, None, np.array([0, 9]), 0, {})
    assert not (tmp_path / "c.h5").exists()


def test_a_block_closes_at_its_client_count_or_its_bytes(monkeypatch):
    few_per_block(monkeypatch, 4)
    monkeypatch.setattr(prepared, "BLOCK_BYTES", 1000)
    assert block_starts(np.array([1] * 10), 10) == [0, 4, 8]               # 4 clients a block
    assert block_starts(np.array([30, 30, 50, 200, 10]), 10) == [0, 2, 3, 4]   # 600 + 500 > 1000; 2,000 B alone
    assert block_starts(np.array([5]), 10) == [0]


def test_a_damaged_client_is_refused_when_read_and_its_neighbours_are_not(tmp_path, monkeypatch):
    import h5py
    few_per_block(monkeypatch)
    m = prepare(cfg_for(tmp_path, "data.num_clients=8"), log=lambda s: None)
    with h5py.File(m.client_block(4), "r+") as f:
        start = int(f["offsets"][1])                      # client 4 is the second of block 1
        f["images"][start] = 255 - f["images"][start]
    with pytest.raises(ShardError, match=r"client 4 in .*block_00001.h5 does not match its checksum.*--force"):
        read_client(m.client_block(4), 4)
    for k in (3, 5):
        read_client(m.client_block(k), k)
    verify_blocks(m, 0, 1)                                # the structure is intact: found when client 4 is read
    data = m.block_path(2).read_bytes()
    m.block_path(2).write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match=r"block .*block_00002.h5 is corrupt or truncated.*--force"):
        verify_blocks(m, 0, 1)


def test_a_block_that_holds_other_clients_than_the_index_is_caught_before_training(tmp_path, monkeypatch):
    import h5py
    few_per_block(monkeypatch)
    m = prepare(cfg_for(tmp_path, "data.num_clients=8"), log=lambda s: None)
    with h5py.File(m.root / "clients" / "index.h5", "r+") as f:
        sizes = f["num_samples"][...]
        f["num_samples"][3:5] = [sizes[3] + 1, sizes[4] - 1]
    with pytest.raises(ShardError, match=r"block_00001.h5 does not hold the clients 3 to 5 the manifest lists"):
        verify_blocks(Manifest.load(m.root), 1, 2)
    verify_blocks(Manifest.load(m.root), 0, 2)            # worker 0 checks blocks 0 and 2: intact


def test_preparing_holds_one_block_of_rows_at_a_time(tmp_path, monkeypatch):
    few_per_block(monkeypatch)
    written = []
    monkeypatch.setattr(build, "write_block", lambda path, inputs, labels, *rest: written.append(len(labels)))
    sizes = prepare(cfg_for(tmp_path, "data.num_clients=8"), log=lambda s: None).client_sizes
    assert written == [sizes[:3].sum(), sizes[3:6].sum(), sizes[6:].sum()]      # each block's rows, one by one


def write_format_1(m: Manifest, root) -> None:
    """The folder ``m`` as an earlier mpifed wrote it: one file per client, the clients listed in the manifest."""
    import shutil
    shutil.copytree(m.root, root, ignore=shutil.ignore_patterns("block_*", "index.h5"))
    manifest = json.loads((m.root / "manifest.json").read_text())
    for k in range(m.num_clients):
        s = read_client(m.client_block(k), k)
        attrs = {key: v for key, v in s.attrs.items() if key not in ("client_id", "num_samples", "checksum", "inputs")}
        write_shard(root / "clients" / f"client_{k:05d}.h5", s.inputs, s.labels,
                    {**attrs, "client_id": k, "class_counts": m.client_class_counts[k].tolist()}, s.groups)
    manifest.update(format=1, clients=[{"id": k, "num_samples": int(m.client_sizes[k]),
                                        "class_counts": m.client_class_counts[k].tolist()}
                                       for k in range(m.num_clients)])
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))


def test_a_folder_of_one_file_per_client_is_refused_by_a_run_and_packed_by_prepare(tmp_path, monkeypatch):
    few_per_block(monkeypatch)
    extra = ("data.num_clients=8", "data.server_holdout_per_class=2", "data.val_size=20")
    fresh = prepare(cfg_for(tmp_path / "a", *extra), log=lambda s: None)
    cfg = cfg_for(tmp_path / "b", *extra)
    write_format_1(fresh, prepared_dir(cfg))
    with pytest.raises(PreparedDataError, match=r"one file per client \(format 1.*python -m mpifed.prepare"):
        ensure_prepared(cfg, log=lambda s: None)
    said = []
    m = ensure_prepared(cfg, log=said.append, convert=True)
    assert "packing its 8 clients into blocks" in said[0] and "into 3 block(s)" in said[-1]
    assert m.root == prepared_dir(cfg) and tree_digest(m.root) == tree_digest(fresh.root)   # what prepare writes
    assert not (m.root / "clients" / "client_00000.h5").exists()


def test_incomplete_manifest_says_how_to_re_prepare(tmp_path):
    m = prepare(cfg_for(tmp_path), log=lambda s: None)
    raw = json.loads((m.root / "manifest.json").read_text())
    del raw["spec"]
    (m.root / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(PreparedDataError, match=r"incomplete or malformed.*'spec'.*--force"):
        Manifest.load(m.root)


def test_concurrent_preparation_of_the_same_folder(tmp_path):
    """Processes that prepare the same folder at once (a job array) all end up using one copy."""
    import subprocess
    import sys
    code = ("import sys; from mpifed import config; from mpifed.preparation.build import ensure_prepared; "
            "cfg, _ = config.load(overrides=sys.argv[1:]); print(ensure_prepared(cfg, log=lambda s: None).root)")
    sets = ["data.dataset.name=synthetic", "data.dataset.train_samples=3000", "data.num_clients=20",
            f"data.prepared_root={tmp_path}"]
    procs = [subprocess.Popen([sys.executable, "-c", code, *sets], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert len({o.strip() for o, _ in outs}) == 1
    assert [p.name for p in tmp_path.iterdir()] == [outs[0][0].strip().split("/")[-1]]   # no temporary folders left
