"""Sweeps from the command line (mpifed.tables.sweep) and the dry runs of main, launch and table."""
import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, env, run_debug, tiny
from mpifed.entry.table import main as table_main
from mpifed.settings.config import ConfigError
from mpifed.tables.sweep import load_sweep, parse, points, short_names, split_values
from mpifed.tables.table_file import resolve


def test_values_split_at_commas_outside_brackets_and_quotes():
    assert split_values("0.01,0.1") == ["0.01", "0.1"]
    assert split_values("[1, 2],[3]") == ["[1, 2]", "[3]"]
    assert split_values("{name: dirichlet, beta: 0.5},iid") == ["{name: dirichlet, beta: 0.5}", "iid"]
    assert split_values("'a,b',c") == ["'a,b'", "c"]


@pytest.mark.parametrize("words, message", [
    (["train.lr"], "expected KEY=V1,V2,..."),
    (["train.lr=0.1", "train.lr=0.2"], "--sweep train.lr is given twice"),
    (["train.lr=0.1,,0.2"], "an empty value"),
    (["train.lr=0.1,0.1"], "0.1 listed more than once"),
])
def test_malformed_sweeps_are_named(words, message):
    with pytest.raises(ConfigError, match=message):
        parse(words)


def test_points_are_the_product_labelled_by_the_shortest_distinct_key_ends():
    assert short_names(["train.lr", "algorithm.fedprox.mu", "algorithm.moon.mu", "algorithm.name"]) == {
        "train.lr": "lr", "algorithm.fedprox.mu": "fedprox.mu", "algorithm.moon.mu": "moon.mu",
        "algorithm.name": "algorithm.name"}
    found = points(parse(["train.lr=0.01,0.1", "data.partition.beta=0.1,0.5"]))
    assert found == [("lr=0.01+beta=0.1", ["train.lr=0.01", "data.partition.beta=0.1"]),
                     ("lr=0.01+beta=0.5", ["train.lr=0.01", "data.partition.beta=0.5"]),
                     ("lr=0.1+beta=0.1", ["train.lr=0.1", "data.partition.beta=0.1"]),
                     ("lr=0.1+beta=0.5", ["train.lr=0.1", "data.partition.beta=0.5"])]
    with pytest.raises(ConfigError, match="cannot be told apart in a run name"):
        points(parse(["data.dataset.root=a/b,a_b"]))


def _config(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({
        "data": {"dataset": {"name": "synthetic", "train_samples": 120, "test_samples": 40}, "num_clients": 2,
                 "partition": {"name": "dirichlet", "beta": 0.5, "min_size": 2},
                 "prepared_root": str(tmp_path / "data")},
        "model": "digits_cnn", "train": {"rounds": 2, "local_epochs": 1, "batch_size": 32, "eval_batch_size": 40},
        "resources": {"threads": 1, "device": "cpu"}, "run": {"checkpoint_every": 0, "save_model": False, "seed": 3}}))
    return str(tmp_path / "base.yaml")


def test_a_list_given_to_set_points_to_a_sweep():
    from mpifed.settings import config
    with pytest.raises(ConfigError, match=r"sweep them: python -m mpifed.table --config \.\.\. --sweep "
                                          r"train.lr=0.01,0.1 \(docs/results.md, Sweeps\)"):
        config.load([], ["train.lr=0.01, 0.1"])


def test_a_sweep_is_a_table_of_one_setting_with_a_row_per_point(tmp_path):
    base = _config(tmp_path)
    t = load_sweep([base], ["train.lr=0.01,0.1"], ["train.rounds=1"], None, str(tmp_path / "runs"))
    resolve(t, [])
    assert t.root == tmp_path / "runs" / "base-sweep-lr" and t.reference == "lr=0.01"
    assert [(r.method, r.seed, r.name) for r in t.runs] == [("lr=0.01", 3, "base-lr=0.01-s3"),
                                                           ("lr=0.1", 3, "base-lr=0.1-s3")]   # the config's seed
    assert [r.resolved["train"]["lr"] for r in t.runs] == [0.01, 0.1]
    assert {r.resolved["train"]["rounds"] for r in t.runs} == {1}                 # --set is part of the sweep
    args = t.runs[1].args([])
    assert "run.group=base-sweep-lr" in args and args[-3:] == ["train.rounds=1", "train.lr=0.1", "--resume"]
    with pytest.raises(ConfigError, match="run.seed: a sweep sets run.seed"):
        load_sweep([base], ["run.seed=1,2"], [], None)
    with pytest.raises(ConfigError, match="--seeds lists 1 more than once"):
        load_sweep([base], ["train.lr=0.01,0.1"], [], [1, 2, 1])


def test_the_command_line_tells_a_sweep_from_a_table(capsys):
    for argv, message in ((["--list"], "give a table file, or a sweep"),
                          (["t.table.yaml", "--sweep", "train.lr=1,2", "--list"], "give one or the other"),
                          (["--config", "x.yaml", "--list"], "go with --sweep"),
                          (["--sweep", "train.lr=1,2", "--list"], "--sweep needs the config it sweeps"),
                          (["t.table.yaml", "--summary", "--dry-run"], "--dry-run goes with --run or --tune")):
        with pytest.raises(SystemExit):
            table_main(argv)
        assert message in capsys.readouterr().err


def _sweep(tmp_path, *more):
    return ["--config", _config(tmp_path), "--sweep", "train.lr=0.01,0.2", "--seeds", "0", "1",
            "--runs-root", str(tmp_path / "runs"), *more]


def test_a_dry_run_of_a_sweep_prints_what_would_run_and_writes_nothing(tmp_path, capsys):
    assert table_main(_sweep(tmp_path, "--run", "3", "--parallel", "2", "--dry-run")) == 0
    out = capsys.readouterr().out
    assert "# dry run: nothing was written. Now 4 runs would run, with 3 ranks each, 2 at a time:" in out
    assert f"{tmp_path / 'runs' / 'base-sweep-lr' / 'base-lr=0.2-s1'}  (new): python -m mpifed.launch -n 3 " in out
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()


@pytest.mark.e2e
def test_a_sweep_runs_lists_and_summarises_like_a_table(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    assert table_main(_sweep(tmp_path, "--run", "0", "--parallel", "2")) == 0
    out = capsys.readouterr().out
    assert "| lr=0.01 |" in out and "| lr=0.2 |" in out                     # the summary after the runs
    assert table_main(_sweep(tmp_path, "--summary")) == 0
    summary = capsys.readouterr().out
    assert "Sweep of train.lr over" in summary and "Against lr=0.01" in summary, summary
    assert table_main(_sweep(tmp_path, "--list")) == 0
    grid = capsys.readouterr().out.splitlines()
    assert grid[1].split() == ["setting", "method", "s0", "s1"]
    cells = [line.split()[2:] for line in grid[2:4]]
    assert all(float(c) >= 0 for row in cells for c in row), grid        # each finished run's metric
    runs = tmp_path / "runs" / "base-sweep-lr"
    config = yaml.safe_load((runs / "base-lr=0.2-s1" / "config.yaml").read_text())
    assert (config["train"]["lr"], config["run"]["seed"], config["run"]["group"]) == (0.2, 1, "base-sweep-lr")
    assert table_main(_sweep(tmp_path, "--write-runs", str(tmp_path / "runs.txt"))) == 0
    assert "sbatch --array=0-3 slurm/array.sbatch" in capsys.readouterr().out
    assert len((tmp_path / "runs.txt").read_text().splitlines()) == 4


@pytest.mark.e2e
def test_main_dry_run_prints_the_config_the_directory_and_the_work_and_writes_nothing(tmp_path):
    out = run_debug([*tiny(tmp_path, "train.rounds=3"), "--dry-run"]).stdout
    assert yaml.safe_load(out.split("# dry run")[0])["train"]["rounds"] == 3
    assert f"# run directory: {tmp_path / 'runs' / 'run'} (new)" in out
    assert "(not prepared yet: the run prepares it first)" in out
    assert "# would run: fedavg on synthetic, 5 clients (100% of them each round), 3 rounds of 1 local epoch" in out
    assert not (tmp_path / "runs").exists() and not (tmp_path / "data").exists()
    run_debug(tiny(tmp_path, "train.rounds=1"))
    out = run_debug([*tiny(tmp_path, "train.rounds=3"), "--dry-run", "--resume"]).stdout
    assert "holds a finished run: --resume continues it from" in out and "(prepared)" in out
    assert "the run would refuse to start" in run_debug([*tiny(tmp_path), "--dry-run"]).stdout


@pytest.mark.mpi
def test_launch_dry_run_names_the_mpirun_command_and_the_ranks_print_once(tmp_path, has_mpirun):
    p = subprocess.run([sys.executable, "-m", "mpifed.launch", "-n", "3", *tiny(tmp_path), "--dry-run"], cwd=REPO,
                       env={**env(), "PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "[mpifed.launch] would run: " in p.stderr and " -n 3 " in p.stderr
    assert p.stdout.count("# dry run: nothing was written") == 1
    assert "3 ranks (1 server + 2 workers)" in p.stdout
    assert not (tmp_path / "runs").exists()


def test_write_runs_says_how_to_get_the_job_scripts_where_there_are_none(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)                           # a pip install's folder: no slurm/ here
    assert table_main(_sweep(tmp_path, "--write-runs", str(tmp_path / "runs.txt"))) == 0
    said = capsys.readouterr().out
    assert "  mpifed slurm        # writes the job scripts into ./slurm\n" \
           "  sbatch --array=0-3 slurm/array.sbatch" in said
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "array.sbatch").write_text("#!/bin/bash\n")
    assert table_main(_sweep(tmp_path, "--write-runs", str(tmp_path / "runs.txt"))) == 0
    assert "mpifed slurm" not in capsys.readouterr().out
