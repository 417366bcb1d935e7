"""Each loader on small files written here in the data set's real on-disk format."""
import json
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from mpifed.settings import config
from mpifed.data.raw import DataMissing, Dataset
from mpifed.data.sets.idx import write_idx
from mpifed.registry import DATASETS
from mpifed.preparation.build import prepare

RNG = np.random.default_rng(0)


def load(name, **options):
    cls = DATASETS.get(name)
    return cls.load(cls.Options(**options))


def write_cifar_batch(path, n, label_key, classes):
    data = RNG.integers(0, 255, (n, 3072), dtype=np.uint8)
    labels = RNG.integers(0, classes, n).tolist()
    with open(path, "wb") as f:
        pickle.dump({b"data": data, label_key: labels, b"batch_label": b"x"}, f)
    return data, labels


def test_cifar10_pickle_batches(tmp_path):
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    batches = [write_cifar_batch(base / f"data_batch_{i}", 7, b"labels", 10) for i in range(1, 6)]
    write_cifar_batch(base / "test_batch", 5, b"labels", 10)
    raw = load("cifar10", root=str(tmp_path))
    assert raw.train_x.shape == (35, 3, 32, 32) and raw.test_x.shape == (5, 3, 32, 32) and raw.num_classes == 10
    first = batches[0][0][0]
    assert np.array_equal(raw.train_x[0, 0].ravel(), first[:1024])       # red plane first, as CIFAR stores it
    assert np.array_equal(raw.train_x[0, 2].ravel(), first[2048:])
    assert raw.train_y[:7].tolist() == batches[0][1]


def test_cifar100_fine_and_coarse(tmp_path):
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    for name, n in (("train", 9), ("test", 4)):
        data = RNG.integers(0, 255, (n, 3072), dtype=np.uint8)
        with open(base / name, "wb") as f:
            pickle.dump({b"data": data, b"fine_labels": list(range(n)),
                         b"coarse_labels": [i % 20 for i in range(n)]}, f)
    fine = load("cifar100", root=str(tmp_path))
    coarse = load("cifar100", root=str(tmp_path), labels="coarse")
    assert fine.num_classes == 100 and coarse.num_classes == 20 and fine.train_y.tolist() == list(range(9))


def test_cifar_missing_says_where(tmp_path):
    with pytest.raises(DataMissing, match="data.dataset.root"):
        load("cifar10", root=str(tmp_path))


@pytest.mark.parametrize("name", ["femnist", "cinic10", "tiny_imagenet", "office_caltech"])
def test_folder_data_sets_missing_say_where(tmp_path, name):
    (tmp_path / "train").mkdir()
    assert DATASETS.get(name).raw_missing(DATASETS.get(name).Options(root=str(tmp_path))) == tmp_path
    with pytest.raises(DataMissing, match="data.dataset.root"):
        load(name, root=str(tmp_path))


def test_every_data_set_is_a_dataset():
    assert [n for n in DATASETS.names() if not issubclass(DATASETS.get(n), Dataset)] == []


def test_a_data_set_names_the_files_it_needs(tmp_path):
    class Files(Dataset):
        title = "Files"
        needs = ("train/", "labels.txt")
        how_to_get = "Put them there."

    options = SimpleNamespace(root=str(tmp_path))
    assert Files.raw_missing(options) == tmp_path
    with pytest.raises(DataMissing, match=r"^Files: train/, labels.txt not found in .*\. Put them there\.$"):
        Files.root(options)
    (tmp_path / "train").mkdir()
    (tmp_path / "labels.txt").mkdir()           # a folder where a file is needed
    with pytest.raises(DataMissing, match="Files: labels.txt not found"):
        Files.root(options)
    (tmp_path / "labels.txt").rmdir()
    (tmp_path / "labels.txt").write_text("")
    assert Files.raw_missing(options) is None and Files.root(options) == tmp_path


def test_cinic_with_its_validation_split_needs_that_folder_too(tmp_path):
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
    assert DATASETS.get("cinic10").raw_missing(DATASETS.get("cinic10").Options(root=str(tmp_path))) is None
    with pytest.raises(DataMissing, match="CINIC-10: valid/ not found"):
        load("cinic10", root=str(tmp_path), include_valid=True)


def test_mnist_idx_files(tmp_path):
    for prefix, n in (("train", 12), ("t10k", 4)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", RNG.integers(0, 255, (n, 28, 28), dtype=np.uint8))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", np.arange(n, dtype=np.uint8) % 10)
    raw = load("fashion_mnist", root=str(tmp_path))
    assert raw.train_x.shape == (12, 1, 28, 28) and raw.test_y.tolist() == [0, 1, 2, 3]
    with pytest.raises(DataMissing, match="the folder does not exist.*download=true"):
        load("mnist", root=str(tmp_path / "nowhere"))
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataMissing, match=r"t10k-labels-idx1-ubyte\(\.gz\) is missing"):
        load("fashion_mnist", root=str(tmp_path))


def write_leaf(folder, users, per_user):
    folder.mkdir(parents=True)
    data = {"users": users, "num_samples": [per_user] * len(users), "user_data": {}}
    for i, u in enumerate(users):
        data["user_data"][u] = {"x": RNG.random((per_user, 784)).round(3).tolist(),
                                "y": [(i * 7 + j) % 62 for j in range(per_user)]}
    (folder / "all_data_0.json").write_text(json.dumps(data))


def test_femnist_leaf_json_and_natural_partition(tmp_path):
    root = tmp_path / "femnist"
    write_leaf(root / "train", [f"f{i:04d}_00" for i in range(6)], 5)
    write_leaf(root / "test", [f"f{i:04d}_00" for i in range(6)], 2)
    raw = load("femnist", root=str(root))
    assert raw.num_classes == 62 and raw.train_x.shape == (30, 1, 28, 28) and raw.train_x.dtype == np.uint8
    assert sorted(np.unique(raw.train_groups).tolist()) == list(range(6)) and raw.test_groups is None
    cfg, _ = config.load(overrides=["data.dataset.name=femnist", f"data.dataset.root={root}", "data.num_clients=3",
                                    "data.partition=natural", "model=femnist_cnn",
                                    f"data.prepared_root={tmp_path / 'p'}"])
    m = prepare(cfg, log=lambda s: None)
    assert m.client_sizes.tolist() == [10, 10, 10]      # two whole writers per client
    digits = load("femnist", root=str(root), digits_only=True)
    assert digits.num_classes == 10 and digits.train_y.max() < 10


def write_png(path, colour, size=32):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), colour).save(path)


def test_cinic10_folders(tmp_path):
    for split in ("train", "valid", "test"):
        for c, name in enumerate(("airplane", "cat")):
            for i in range(3):
                write_png(tmp_path / split / name / f"{split}_{i}.png", (c * 100, i * 50, 7))
    raw = load("cinic10", root=str(tmp_path))
    assert raw.train_x.shape == (6, 3, 32, 32) and raw.num_classes == 2
    assert raw.train_x[3, 0, 0, 0] == 100 and raw.train_y.tolist() == [0, 0, 0, 1, 1, 1]
    assert load("cinic10", root=str(tmp_path), include_valid=True).train_x.shape[0] == 12


def test_tiny_imagenet_layout(tmp_path):
    wnids = ["n01", "n02"]
    (tmp_path / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for w in wnids:
        for i in range(2):
            write_png(tmp_path / "train" / w / "images" / f"{w}_{i}.JPEG", (5, 5, 5), size=64)
    ann = []
    for i, w in enumerate(wnids * 2):
        write_png(tmp_path / "val" / "images" / f"val_{i}.JPEG", (9, 9, 9), size=64)
        ann.append(f"val_{i}.JPEG\t{w}\t0\t0\t10\t10")
    (tmp_path / "val" / "val_annotations.txt").write_text("\n".join(ann) + "\n")
    raw = load("tiny_imagenet", root=str(tmp_path))
    assert raw.train_x.shape == (4, 3, 64, 64) and raw.test_y.tolist() == [0, 1, 0, 1] and raw.num_classes == 2


def test_office_caltech_domains_and_domain_partition(tmp_path):
    for d in ("amazon", "caltech", "dslr", "webcam"):
        for c in ("back_pack", "bike"):
            for i in range(5):
                write_png(tmp_path / d / c / f"{i}.jpg", (i, 0, 0), size=40)
    raw = load("office_caltech", root=str(tmp_path), size=32)
    assert raw.train_x.shape[1:] == (3, 32, 32) and raw.group_names == ["amazon", "caltech", "dslr", "webcam"]
    assert np.bincount(raw.test_groups).tolist() == [2, 2, 2, 2]       # 20% of each class of each domain
    cfg, _ = config.load(overrides=["data.dataset.name=office_caltech", f"data.dataset.root={tmp_path}",
                                    "data.dataset.size=32",
                                    "data.num_clients=4", "data.partition=domain",
                                    f"data.prepared_root={tmp_path / 'p'}"])
    m = prepare(cfg, log=lambda s: None)
    assert m.client_sizes.tolist() == [8, 8, 8, 8] and m.group_names == raw.group_names
    assert m.test_group_counts.tolist() == [2, 2, 2, 2]
    cfg3, _ = config.load(overrides=[f"data.dataset.root={tmp_path}", "data.dataset.name=office_caltech",
                                     "data.dataset.size=32",
                                     "data.num_clients=3", "data.partition=domain",
                                     f"data.prepared_root={tmp_path / 'q'}"])
    with pytest.raises(Exception, match="num_clients=4"):
        prepare(cfg3, log=lambda s: None)


def test_office_caltech_fedbn_cut_trains_every_domain_on_the_same_number(tmp_path):
    sizes = {"amazon": 10, "caltech": 8, "dslr": 5, "webcam": 6}      # images per class
    for d, n in sizes.items():
        for c in ("back_pack", "bike"):
            for i in range(n):
                write_png(tmp_path / d / c / f"{i}.jpg", (i, 0, 0), size=40)
    full = load("office_caltech", root=str(tmp_path), size=32)
    assert np.bincount(full.train_groups).tolist() == [16, 12, 8, 10]   # 80% of each class
    cut = load("office_caltech", root=str(tmp_path), size=32, train_cut=0.5)
    assert np.bincount(cut.train_groups).tolist() == [4, 4, 4, 4]       # half the smallest (DSLR's 8)
    assert np.array_equal(cut.test_x, full.test_x)                       # the test splits are untouched
    again = load("office_caltech", root=str(tmp_path), size=32, train_cut=0.5)
    assert np.array_equal(again.train_x, cut.train_x)


def test_synthetic_images_drawn_in_chunks_are_the_images_of_one_draw(monkeypatch):
    from mpifed.data.sets import basic
    whole = load("synthetic", train_samples=500, test_samples=30)
    monkeypatch.setattr(basic, "CHUNK_VALUES", 7 * 64)          # 7 images of 8x8 a chunk
    chunked = load("synthetic", train_samples=500, test_samples=30)
    for name in ("train_x", "train_y", "test_x", "test_y"):
        assert np.array_equal(getattr(whole, name), getattr(chunked, name))


@pytest.mark.e2e
def test_a_cross_device_femnist_run_from_leaf_files_gives_every_writer_its_own_client(tmp_path):
    """configs/cross-device/femnist-natural.yaml on LEAF-format files of 8 writers: each client is one
    writer's samples, 4 of them train a round."""
    from conftest import REPO, run_debug
    root = tmp_path / "femnist"
    writers = [f"f{i:04d}_00" for i in range(8)]
    write_leaf(root / "train", writers, 6)
    write_leaf(root / "test", writers, 3)
    run_debug(["--config", str(REPO / "configs" / "cross-device" / "femnist-natural.yaml"), "--set",
               f"data.dataset.root={root}", "data.num_clients=8", "train.participation=0.5", "train.rounds=2",
               "run.eval_every=1", f"data.prepared_root={tmp_path / 'data'}", f"run.root={tmp_path / 'runs'}",
               "run.name=femnist", "resources.threads=1"])
    rounds = [json.loads(line) for line in (tmp_path / "runs" / "femnist" / "clients.jsonl").read_text().splitlines()]
    assert [len(r["clients"]) for r in rounds] == [4, 4]
    assert all(c["samples"] == 6 for r in rounds for c in r["clients"])
    metrics = [json.loads(line) for line in (tmp_path / "runs" / "femnist" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(0 <= m["test_acc"] <= 1 for m in metrics)
    (folder,) = (tmp_path / "data").iterdir()
    assert sorted(p.name for p in (folder / "clients").iterdir()) == ["block_00000.h5", "index.h5"]
