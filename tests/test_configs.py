"""Every config under configs/ validates; tables expand; a paper config runs on synthetic data of its shape."""
import json
import subprocess
import sys

import pytest

from conftest import REPO, env, run_debug, write_tiny_table
from mpifed.settings import config
from mpifed.entry.table import main as table_main
from mpifed.tables.table_file import load_table, validate

CONFIGS = sorted(p for p in (REPO / "configs").rglob("*.yaml")
                 if not p.name.endswith(".table.yaml") and p.parent.name != "methods")
TABLES = sorted((REPO / "configs").rglob("*.table.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(REPO / "configs")) for p in CONFIGS])
def test_config_validates(path):
    config.load([str(path)])


@pytest.mark.parametrize("path", TABLES, ids=[str(p.relative_to(REPO / "configs")) for p in TABLES])
def test_table_expands_and_every_run_validates(path):
    table = load_table(path)
    validate(table, [])
    assert len(table.runs) == len({r.name for r in table.runs}) > 0


def test_every_setting_and_method_file_is_used_by_a_table():
    used = {c.resolve() for t in TABLES for r in load_table(t).runs for c in r.configs}
    papers = [p for p in (REPO / "configs" / "papers").rglob("*.yaml")
              if not p.name.endswith(".table.yaml") and p.name != "base.yaml"]
    unused = [str(p.relative_to(REPO)) for p in papers if p.resolve() not in used and not any(
        f"base: {p.name}" in q.read_text() for q in p.parent.glob("*.yaml"))]
    assert not unused, f"not in any table: {unused}"


def test_fedntd_cifar10_setting_resolves_to_the_paper_values():
    cfg, _ = config.load([str(REPO / "configs/papers/fedntd/cifar10-shard2.yaml"),
                          str(REPO / "configs/papers/fedntd/methods/fedntd.yaml")])
    assert (cfg.data.num_clients, cfg.train.participation, cfg.train.local_epochs,
            cfg.train.batch_size) == (100, 0.1, 5, 50)
    assert (cfg.train.lr, cfg.train.lr_decay, cfg.data.augment.cutout) == (0.01, 0.99, 16)
    assert cfg.data.partition.options.shards_per_client == 2 and cfg.algorithm.name == "fedntd"
    cfg, _ = config.load([str(REPO / "configs/papers/fedgkd/tiny_imagenet-alpha0.1.yaml"),
                          str(REPO / "configs/papers/fedgkd/methods/fedgkd.yaml")])
    assert cfg.algorithm.options.gamma == 0.1 and cfg.model.name == "resnet50" and cfg.train.rounds == 30


def paper(*files):
    return config.load([str(REPO / "configs" / "papers" / f) for f in files])[0]


@pytest.mark.parametrize("setting,mu", [("cifar10-alpha0.5.yaml", 0.01), ("cifar100-alpha0.5.yaml", 0.001),
                                        ("tiny_imagenet-alpha1.yaml", 0.001)])
def test_fedgkd_fedprox_mu_follows_the_data_set(setting, mu):
    """FedGKD Sec. 5.1: FedProx mu = 0.01 on CIFAR-10, 0.001 on CIFAR-100 and Tiny-ImageNet; the method
    file comes last on the command line, the setting's per_algorithm values still apply."""
    assert paper(f"fedgkd/{setting}", "fedgkd/methods/fedprox.yaml").algorithm.options.mu == mu


def test_per_data_set_values_of_the_other_baselines():
    tiny = ("fedgkd/tiny_imagenet-alpha0.1.yaml",)
    assert paper(*tiny, "fedgkd/methods/moon.yaml").algorithm.options.mu == 1.0
    assert paper(*tiny, "fedgkd/methods/moon.yaml").model.options.norm == "batch"
    assert paper(*tiny, "fedgkd/methods/fedgkd_plus.yaml").algorithm.options.gamma == 0.1
    assert paper(*tiny, "fedgkd/methods/fedgkd.yaml").model.options.norm == "group"
    assert paper("fedgkd/cifar100-alpha1.yaml", "fedgkd/methods/moon.yaml").algorithm.options.mu == 5.0
    office = paper("fedcsd/office_caltech.yaml", "fedcsd/methods/fedcsd.yaml").algorithm.options
    assert (office.mu, office.tau) == (0.5, 4.0)
    label_skew = paper("fedcsd/cifar100-beta0.5.yaml", "fedcsd/methods/fedcsd.yaml")
    assert (label_skew.algorithm.options.mu, label_skew.algorithm.options.tau,
            label_skew.data.augment.rotation) == (0.001, 10.0, 15)
    assert paper("fedgkd/cifar10-alpha1.yaml", "fedgkd/methods/fedavg.yaml").train.client_weights == "uniform"
    # a value given on the command line still wins over the setting's
    cfg, _ = config.load([str(REPO / "configs/papers/fedgkd/cifar100-alpha1.yaml"),
                          str(REPO / "configs/papers/fedgkd/methods/fedprox.yaml")], ["algorithm.mu=0.5"])
    assert cfg.algorithm.options.mu == 0.5


@pytest.mark.e2e
def test_paper_config_smoke_run_on_synthetic_data_of_its_shape(tmp_path):
    """FedGKD Table 3's CIFAR-10 setting (ResNet-8 GN, 20 clients, C = 0.2) on random 3x32x32 data."""
    args = ["--config", str(REPO / "configs/papers/fedgkd/cifar10-alpha0.5.yaml"),
            "--config", str(REPO / "configs/papers/fedgkd/methods/fedgkd_vote.yaml"),
            "--set", "data.dataset.name=synthetic", "data.dataset.channels=3", "data.dataset.size=32",
            "data.dataset.train_samples=700", "data.dataset.test_samples=100", "data.server_holdout_per_class=4",
            "data.partition.min_fraction=0.1", "train.rounds=2", "train.local_epochs=1", "resources.threads=1",
            f"run.root={tmp_path}", "run.name=smoke", f"data.prepared_root={tmp_path / 'data'}"]
    run_debug(args)
    rows = [json.loads(line) for line in (tmp_path / "smoke" / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients"] for r in rows] == [4, 4] and rows[1]["teacher_models"] == 1


@pytest.mark.e2e
def test_table_cli_writes_runs_and_summarises(tmp_path):
    table = write_tiny_table(tmp_path / "t", tmp_path / "data")
    runs_file = tmp_path / "runs.txt"
    root = ["--runs-root", str(tmp_path / "runs")]
    assert table_main([str(table), *root, "--write-runs", str(runs_file)]) == 0
    lines = runs_file.read_text().splitlines()
    assert len(lines) == 4 and all("--resume" in line and "run.name=s-" in line for line in lines)
    # one method's two seeds: as much as the summary's "(n=2)" needs, half the table's runs
    p = subprocess.run([sys.executable, "-m", "mpifed.table", str(table), *root, "--run", "0", "--methods", "a"],
                       cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "| a | " in p.stdout and "(n=2)" in p.stdout
