"""Images in a file (ImageRows) and the prepare step that reads them a block at a time."""
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import REPO, env
from mpifed.data.image_rows import ImageRows
from mpifed.data.shards import read_client
from mpifed.data.sets import basic
from mpifed.registry import DATASETS
from mpifed.data import prepared
from mpifed.preparation import build
from mpifed.settings import config


def images(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 2, 3, 3), dtype=np.uint8)


def test_image_rows_read_back_what_was_appended_in_any_order():
    x = images(100)
    rows = ImageRows((2, 3, 3))
    rows.append(x[:37])
    rows.append(x[37:])
    assert rows.shape == (100, 2, 3, 3) and rows.ndim == 4 and rows.dtype == np.uint8 and len(rows) == 100
    order = np.random.default_rng(1).permutation(100)
    assert np.array_equal(rows[order], x[order]) and np.array_equal(rows[10:20], x[10:20])
    assert np.array_equal(rows[::-7], x[::-7]) and np.array_equal(rows[[-1, 0, 5, 5]], x[[-1, 0, 5, 5]])
    assert np.array_equal(rows[x[:, 0, 0, 0] > 128], x[x[:, 0, 0, 0] > 128]) and np.array_equal(np.asarray(rows), x)


def test_a_selection_of_image_rows_reads_nothing_until_its_rows_are_read(monkeypatch):
    x = images(50)
    rows = ImageRows((2, 3, 3))
    rows.append(x)
    monkeypatch.setattr("mpifed.data.image_rows.READ_ROWS", 3)         # scattered reads in parts of 3 rows
    pick = np.random.default_rng(2).permutation(50)[:20]
    view = rows.select(pick).select(slice(2, 17))
    assert len(view) == 15 and np.array_equal(view[:], x[pick][2:17])
    assert np.array_equal(view[[4, 0]], x[pick][2:17][[4, 0]])
    with pytest.raises(ValueError, match="not to a selection"):
        view.append(x[:1])
    with pytest.raises(ValueError, match="images must be uint8 n x"):
        rows.append(x[:, :1])
    with pytest.raises(IndexError):
        view[[15]]


def cfg_for(tmp_path, *extra):
    cfg, _ = config.load(overrides=["data.dataset.name=synthetic", "data.dataset.train_samples=900",
                                    "data.dataset.test_samples=50", "data.num_clients=30", "data.partition=dirichlet",
                                    "data.partition.beta=0.3", "data.partition.min_size=5", "data.val_size=60",
                                    "data.server_holdout_per_class=2", f"data.prepared_root={tmp_path}", *extra])
    return cfg


def test_images_in_a_file_prepare_the_folder_that_images_in_memory_do(tmp_path, monkeypatch):
    """Synthetic images above basic.STREAM_BYTES are drawn into a file: the same images, and the same
    prepared folder (every client's rows, the validation and server sets, the manifest)."""
    monkeypatch.setattr(prepared, "CLIENTS_PER_BLOCK", 8)
    in_memory = build.prepare(cfg_for(tmp_path / "memory"), log=lambda s: None)
    monkeypatch.setattr(basic, "STREAM_BYTES", 0)
    raw = DATASETS.get("synthetic").load(cfg_for(tmp_path).data.dataset.options)
    assert isinstance(raw.train_x, ImageRows)
    in_file = build.prepare(cfg_for(tmp_path / "file"), log=lambda s: None)
    manifest = [json.loads((m.root / "manifest.json").read_text()) for m in (in_memory, in_file)]
    assert manifest[0] == manifest[1] and len(manifest[0]["clients"]["blocks"]) == 4
    for cid in range(30):
        a, b = (read_client(m.client_block(cid), cid) for m in (in_memory, in_file))
        assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    for name in ("val.h5", "server.h5", "test.h5"):
        assert (in_memory.root / name).read_bytes() == (in_file.root / name).read_bytes()


PEAK = """
import sys
from mpifed.data.sets import basic
from mpifed.data import prepared
from mpifed.preparation import build
from mpifed.settings import config
n, in_file, root = int(sys.argv[1]), sys.argv[2] == "file", sys.argv[3]
basic.STREAM_BYTES = 0 if in_file else 2**62
basic.CHUNK_VALUES = 2**20                  # bounds that do not grow with the population
prepared.CLIENTS_PER_BLOCK = 512
cfg, _ = config.load(overrides=["data.dataset.name=synthetic", f"data.dataset.train_samples={n}",
                                "data.dataset.test_samples=100", "data.dataset.channels=3", "data.dataset.size=32",
                                f"data.num_clients={n // 5}", "data.partition=iid", f"data.prepared_root={root}"])
build.prepare(cfg, log=lambda s: None)
# VmHWM, this process's own peak: ru_maxrss would keep the peak of the process it was forked from
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) // 1024)
"""


@pytest.mark.e2e
def test_preparing_images_in_a_file_holds_a_block_not_the_population(tmp_path):
    """Four times the clients (15,000 more images of 3 KB: 46 MB) add almost nothing to the peak
    memory of preparing images in a file; in memory, they add the images."""
    def peak(n, where):
        p = subprocess.run([sys.executable, "-c", PEAK, str(n), where, str(tmp_path / f"{where}-{n}")], cwd=REPO,
                           env=env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        return int(p.stdout.split()[-1])
    with ThreadPoolExecutor(3) as pool:
        small, large, held = pool.map(lambda a: peak(*a), [(5000, "file"), (20000, "file"), (20000, "memory")])
    grown = 15000 * 3 * 32 * 32 / 2**20
    assert large - small < grown / 4, (small, large, grown)
    assert held - large > grown * 3 / 4, (large, held, grown)    # the measure sees images held in memory
