"""prepare --download: archives served from a loopback HTTP server, checked, put in place atomically."""
import functools
import hashlib
import io
import pickle
import tarfile
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from mpifed.data import download
from mpifed.data.download import DownloadError, RemoteFile, Source, fetch
from mpifed.data.sets.idx import write_idx
from mpifed.entry.prepare import main as prepare_main
from mpifed.registry import DATASETS


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """Serves ``tmp_path/served`` at the returned base URL."""
    served = tmp_path / "served"
    served.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(served)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def md5(path):
    return "md5:" + hashlib.md5(path.read_bytes()).hexdigest()


def publish(monkeypatch, name, files, present):
    """Make the served files the 'published' ones of data set ``name`` (their checksums)."""
    monkeypatch.setitem(download.SOURCES, name, Source(
        tuple(RemoteFile(f"https://example.invalid/{f.name}", md5(f),
                         unpack=f.name.endswith((".tar.gz", ".zip"))) for f in files),
        present))


def test_idx_files_are_fetched_checked_and_prepared(server, tmp_path, monkeypatch, capsys):
    served, url = server
    rng = np.random.default_rng(0)
    files = []
    for split, n in (("train", 40), ("t10k", 20)):
        write_idx(served / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 28, 28)))
        write_idx(served / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
        files += [served / f"{split}-images-idx3-ubyte.gz", served / f"{split}-labels-idx1-ubyte.gz"]
    publish(monkeypatch, "fashion_mnist", files, tuple(f.name.removesuffix(".gz") for f in files))
    monkeypatch.setenv(download.MIRROR_ENV, url)
    root = tmp_path / "raw" / "fashion"
    code = prepare_main(["--download", "--set", "data.dataset.name=fashion_mnist", f"data.dataset.root={root}",
                         "data.num_clients=2", "data.partition=iid", f"data.prepared_root={tmp_path / 'prepared'}"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert sorted(p.name for p in root.iterdir()) == sorted(f.name for f in files)
    assert "md5 verified" in out.out and "prepared data:" in out.out
    assert prepare_main(["--download", "--set", "data.dataset.name=fashion_mnist", f"data.dataset.root={root}",
                         "data.num_clients=2", "data.partition=iid",
                         f"data.prepared_root={tmp_path / 'prepared'}"]) == 0
    assert "already in" in capsys.readouterr().out


def cifar_tarball(path):
    rng = np.random.default_rng(1)
    with tarfile.open(path, "w:gz") as tar:
        for name, n in [(f"data_batch_{i}", 3) for i in range(1, 6)] + [("test_batch", 2)]:
            blob = pickle.dumps({b"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8), b"labels": [1] * n})
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))


def test_a_tarball_is_unpacked_where_the_loader_reads(server, tmp_path, monkeypatch):
    served, url = server
    cifar_tarball(served / "cifar-10-python.tar.gz")
    publish(monkeypatch, "cifar10", [served / "cifar-10-python.tar.gz"], ("cifar-10-batches-py",))
    root = tmp_path / "raw"
    assert fetch("cifar10", root, mirror=url, log=lambda s: None)
    assert [p.name for p in root.iterdir()] == ["cifar-10-batches-py"]
    cls = DATASETS.get("cifar10")
    assert cls.load(cls.Options(root=str(root))).train_x.shape == (15, 3, 32, 32)


def test_a_zip_with_one_top_folder_is_unwrapped_into_the_root(server, tmp_path, monkeypatch):
    served, url = server
    with zipfile.ZipFile(served / "tiny-imagenet-200.zip", "w") as z:
        z.writestr("tiny-imagenet-200/wnids.txt", "n01\n")
        z.writestr("tiny-imagenet-200/train/n01/images/a.JPEG", b"x")
        z.writestr("tiny-imagenet-200/val/val_annotations.txt", "")
    publish(monkeypatch, "tiny_imagenet", [served / "tiny-imagenet-200.zip"], ("wnids.txt", "train", "val"))
    root = tmp_path / "raw" / "tiny"
    fetch("tiny_imagenet", root, mirror=url, log=lambda s: None)
    assert sorted(p.name for p in root.iterdir()) == ["train", "val", "wnids.txt"]


def test_a_damaged_file_is_refused_and_nothing_is_left(server, tmp_path, monkeypatch):
    served, url = server
    cifar_tarball(served / "cifar-10-python.tar.gz")
    publish(monkeypatch, "cifar10", [served / "cifar-10-python.tar.gz"], ("cifar-10-batches-py",))
    data = (served / "cifar-10-python.tar.gz").read_bytes()
    (served / "cifar-10-python.tar.gz").write_bytes(data[:-10] + bytes(10))
    root = tmp_path / "raw"
    with pytest.raises(DownloadError, match="does not match the published"):
        fetch("cifar10", root, mirror=url, log=lambda s: None)
    assert list(root.iterdir()) == []


def test_data_sets_without_an_archive_point_at_the_manual_steps(tmp_path, capsys):
    assert prepare_main(["--download", "--set", "data.dataset.name=femnist", f"data.dataset.root={tmp_path}"]) == 2
    assert "docs/data-download.md" in capsys.readouterr().err
    with pytest.raises(DownloadError, match="could not fetch"):
        fetch("mnist", tmp_path / "m", mirror="http://127.0.0.1:9", log=lambda s: None)
    assert list((tmp_path / "m").iterdir()) == []
