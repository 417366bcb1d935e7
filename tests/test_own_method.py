"""A researcher's own method, first class: a method file outside the repository, named by a table file,
runs in a table with FedAvg under MPI and in the debug mode, is summarised, reported and evaluated,
resumes with its code given again or allowed from the run's copy (--trust-run-code), and refuses to
resume once its code changed; an installed package's entry
point is found without any flag; provenance counts untracked files inside the package."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, command, env, metrics, plugin_method

pytestmark = pytest.mark.e2e

SETTING = """data:
  dataset: {name: synthetic, train_samples: 300, test_samples: 120}
  num_clients: 5
  partition: {name: dirichlet, beta: 0.5, min_size: 5}
  prepared_root: data
train: {rounds: 2, local_epochs: 1, batch_size: 16, eval_batch_size: 50}
resources: {threads: 1, device: cpu}
"""


def mpifed(cwd, *args, check=True, extra_env=None):
    """``python -m <args>`` in ``cwd``: a command as a user types it, in its own process."""
    p = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env={**env(), **(extra_env or {})},
                       capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


@pytest.fixture(scope="module")
def own_table(tmp_path_factory, has_mpirun):
    """A table of one tiny setting x {fedavg, my penalty method} x seeds 0, 1, whose method file lies
    outside the repository, beside the table's folder; seed 0 run under MPI (3 ranks), seed 1 in the
    debug mode."""
    home = tmp_path_factory.mktemp("own")
    (home / "penalty.py").write_text(plugin_method("penalty"))
    t = home / "t"
    t.mkdir()
    (t / "s.yaml").write_text(SETTING)
    (t / "fedavg.yaml").write_text("algorithm: fedavg\n")
    (t / "mine.yaml").write_text("algorithm: {name: penalty, penalty: 0.05}\n")
    (t / "t.table.yaml").write_text("title: Mine against FedAvg\nplugins: [../penalty.py]\nmetric: final_test_acc\n"
                                    "settings: [s.yaml]\nmethods: [fedavg.yaml, mine.yaml]\nseeds: [0, 1]\n"
                                    "claims: [\"mine > fedavg\"]\n")
    listed = command(home, "mpifed.table", "t/t.table.yaml", "--list", "--commands").stdout
    assert listed.count(f"--plugin {home / 'penalty.py'}") == 4
    mpifed(home, "mpifed.table", "t/t.table.yaml", "--run", "3", "--seeds", "0")
    mpifed(home, "mpifed.table", "t/t.table.yaml", "--run", "0", "--seeds", "1")
    return home


def test_the_table_runs_summarises_and_reports_the_method(own_table):
    home = own_table
    listed = command(home, "mpifed.table", "t/t.table.yaml", "--list", "--commands").stdout
    assert listed.count("finished") == 4
    summary = command(home, "mpifed.table", "t/t.table.yaml", "--summary").stdout
    assert "| mine |" in summary and "Against fedavg" in summary and "mine > fedavg" in summary
    assert "left out" not in summary
    for inputs in (["t/t.table.yaml"], ["runs/t-t"]):   # the table (its plugin named), a folder (the runs' copies)
        out = home / f"report-{len(inputs[0])}"
        command(home, "mpifed.report", *inputs, "--out", str(out))
        assert "mine" in (out / "table.md").read_text()
    run = home / "runs" / "t-t" / "s-mine-s0"
    record = json.loads((run / "provenance.json").read_text())["segments"][0]["plugins"]
    sha = hashlib.sha256((home / "penalty.py").read_bytes()).hexdigest()
    assert [(p["kind"], p["origin"], p["sha256"], p["provides"], p["used"]) for p in record] == [
        ("file", str(home / "penalty.py"), sha, ["algorithm penalty"], True)]
    assert (run / record[0]["copy"] / "penalty.py").read_bytes() == (home / "penalty.py").read_bytes()
    archived = command(home, "mpifed.table", "t/t.table.yaml", "--archive", str(home / "archive")).stdout
    assert "archived 4 runs" in archived
    assert (home / "archive" / "t-t" / "s-mine-s0" / record[0]["copy"] / "penalty.py").is_file()


def test_an_archive_of_the_table_summarises_the_same(own_table):
    home = own_table
    command(home, "mpifed.table", "t/t.table.yaml", "--archive", str(home / "archived"))
    summary = command(home, "mpifed.table", "t/t.table.yaml", "--summary").stdout
    again = command(home, "mpifed.table", "t/t.table.yaml", "--runs-root", "archived", "--summary").stdout
    assert again.replace(str(home / "archived"), "runs") == summary.replace(str(home / "runs"), "runs")


def test_the_mpi_run_of_the_method_equals_its_debug_run(own_table):
    home = own_table
    command(home, "mpifed.main", "--plugin", "penalty.py", "--config", "t/s.yaml", "--config", "t/mine.yaml",
           "--set", "run.seed=0", "run.root=debug", "run.name=s0")
    assert metrics(home / "debug" / "s0") == metrics(home / "runs" / "t-t" / "s-mine-s0")


def test_evaluate_prints_each_runs_recorded_final_accuracy(own_table):
    runs = sorted((own_table / "runs" / "t-t").glob("s-*-s[0-9]"))
    refused = command(own_table, "mpifed", "evaluate", *map(str, runs), check=False)
    assert refused.returncode == 2 and refused.stdout.count("(the same)") == 2   # FedAvg's: mpifed's own code
    assert refused.stderr.count("the run was made with code from outside mpifed") == 2
    assert "add --trust-run-code, or give the same code yourself (--plugin FILE" in refused.stderr
    out = command(own_table, "mpifed", "evaluate", "--plugin", "penalty.py", *map(str, runs)).stdout
    for run in runs:
        recorded = json.loads((run / "summary.json").read_text())["final_test_acc"]
        assert (f"{run}: test accuracy {recorded:.4f}" in out
                and f"recorded final_test_acc {recorded:.4f} (the same)" in out)
    assert out.count("(the same)") == 4
    figures = json.loads(command(own_table, "mpifed.evaluate", str(runs[-1]), "--json", "--trust-run-code").stdout)
    assert figures["test_acc"] == figures["recorded_final_test_acc"] is not None


def test_a_run_of_the_method_resumes_with_its_code_allowed_and_refuses_once_its_code_changed(own_table):
    """Last of the tests on the table: it edits the method file (and puts it back)."""
    home = own_table
    run = home / "runs" / "t-t" / "s-mine-s1"
    p = command(home, "mpifed.main", "--resume", str(run), "--set", "train.rounds=3", check=False)
    assert p.returncode == 2 and len(metrics(run)) == 2 and "Traceback" not in p.stderr
    assert (f"the run was made with code from outside mpifed, which mpifed runs only when you say so: plugin "
            f"{home / 'penalty.py'}" in p.stderr and "--trust-run-code" in p.stderr)
    p = command(home, "mpifed.main", "--plugin", "penalty.py", "--resume", str(run), "--set", "train.rounds=3")
    assert len(metrics(run)) == 3 and "resuming" in p.stdout
    method = home / "penalty.py"
    original = method.read_bytes()
    old = hashlib.sha256(original).hexdigest()
    try:
        method.write_bytes(original + b"# tuned since\n")
        new = hashlib.sha256(method.read_bytes()).hexdigest()
        for allowed in (["--trust-run-code"], ["--plugin", "penalty.py"]):
            p = command(home, "mpifed.main", *allowed, "--resume", str(run), "--set", "train.rounds=4", check=False)
            assert p.returncode == 2 and len(metrics(run)) == 3
            assert (f"the code of plugin {method} changed since the run started (SHA-256 {old} then, {new} now)"
                    in p.stderr) and p.stderr.count("changed since the run started") == 1
        # the table: the changed method's runs are new runs, never mixed with the old ones
        listed = command(home, "mpifed.table", "t/t.table.yaml", "--list", "--commands").stdout.splitlines()
        assert [line.split()[0] for line in listed if "mine.yaml" in line] == ["new", "new"]
        summary = command(home, "mpifed.table", "t/t.table.yaml", "--summary").stdout
        assert f"s-mine-s0: made with code.algorithm='{old}' (here '{new}')" in summary
        # with the method file gone, the run resumes from its own copy, where allowed
        method.unlink()
        command(home, "mpifed.main", "--trust-run-code", "--resume", str(run), "--set", "train.rounds=4")
        assert len(metrics(run)) == 4
    finally:
        method.write_bytes(original)


def test_a_plugin_that_fails_to_import_is_one_message_under_mpi(has_mpirun, tmp_path):
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    p = subprocess.run([str(REPO / "launch" / "local.sh"), "3", "--plugin", str(tmp_path / "broken.py"),
                        "--set", f"run.root={tmp_path / 'runs'}"], cwd=tmp_path, env=env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2
    assert p.stderr.count(f"plugin {tmp_path / 'broken.py'} failed to import: ModuleNotFoundError") == 1
    assert "Traceback" not in p.stderr


PACKAGE = """[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "mpifed-penalty"
version = "1.0"

[project.entry-points."mpifed.plugins"]
penalty = "mpifed_penalty.methods"

[tool.setuptools]
packages = ["mpifed_penalty"]
"""


def test_an_installed_packages_entry_point_is_found_without_a_flag(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "mpifed_penalty").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PACKAGE)
    (pkg / "mpifed_penalty" / "__init__.py").write_text("")
    (pkg / "mpifed_penalty" / "methods.py").write_text(plugin_method("ep_penalty"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index",
                    "--target", str(site), str(pkg)], check=True, capture_output=True, timeout=300)
    with_site = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    args = ["mpifed.main", "--config", "s.yaml", "--set", "algorithm.name=ep_penalty", f"run.root={tmp_path / 'runs'}",
            "run.name=ep"]
    (tmp_path / "s.yaml").write_text(SETTING)
    mpifed(tmp_path, *args, extra_env=with_site)
    record = json.loads((tmp_path / "runs" / "ep" / "provenance.json").read_text())["segments"][0]["plugins"]
    assert [(p["kind"], p["package"], p["entry_point"], p["provides"]) for p in record] == [
        ("entry point", "mpifed-penalty 1.0", "penalty = mpifed_penalty.methods", ["algorithm ep_penalty"])]
    off = mpifed(tmp_path, *args[:-1], "run.name=off", check=False,
                 extra_env={**with_site, "MPIFED_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert off.returncode == 2 and "unknown algorithm 'ep_penalty'" in off.stderr
    # another version installed: the run refuses to continue with it
    with open(site / "mpifed_penalty" / "methods.py", "a") as f:
        f.write("# version 1.1\n")
    p = mpifed(tmp_path, "mpifed.main", "--resume", str(tmp_path / "runs" / "ep"), "--set", "train.rounds=3",
               check=False, extra_env=with_site)
    assert p.returncode == 2
    assert "the installed plugin penalty = mpifed_penalty.methods (mpifed-penalty 1.0)" in p.stderr
    assert "changed since the run started" in p.stderr


def test_provenance_counts_untracked_files_inside_the_package(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(REPO / "mpifed", repo / "mpifed", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / ".gitignore").write_text("__pycache__/\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(git + cmd, check=True, capture_output=True)
    ask = [sys.executable, "-c", "from mpifed.run.provenance import source_commit; print(source_commit()[1])"]
    clean = subprocess.run(ask, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True,
                           text=True, check=True).stdout.strip()
    (repo / "mpifed" / "algorithms" / "mine.py").write_text(plugin_method("mine"))
    (tmp_path / "outside.py").write_text("")          # untracked, but not inside the package (not even the repo)
    dirty = subprocess.run(ask, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert (clean, dirty) == ("False", "True")


def test_the_tutorials_files_run_as_the_page_shows_them(tmp_path):
    """docs/tutorial.md's method file, setting, methods and table, written out as the page shows them:
    the method trains, and the table lists its runs, each with the plugin."""
    import re
    page = (REPO / "docs" / "tutorial.md").read_text()
    (tmp_path / "my_method.py").write_text(re.search(r"```python\n(.*?)```", page, re.S).group(1))
    blocks = re.findall(r"```yaml\n(.*?)```", page, re.S)
    names = ["digits-lda.yaml", "fedavg.yaml", "fedntd.yaml", "fedgkd.yaml", "mine.yaml", "mine.table.yaml"]
    assert len(blocks) == len(names)
    (tmp_path / "mytable").mkdir()
    for name, block in zip(names, blocks):
        (tmp_path / "mytable" / name).write_text(block)
    command(tmp_path, "mpifed.main", "--plugin", "my_method.py", "--set", "algorithm.name=logit_penalty",
           "train.rounds=1", "run.name=first-try")
    listed = command(tmp_path, "mpifed.table", "mytable/mine.table.yaml", "--list", "--commands").stdout
    assert listed.count(f"--plugin {tmp_path / 'my_method.py'}") == 8
    assert "12 runs of 4 setting x method pairs wait for their search to finish" in listed


PARTITION = """from dataclasses import dataclass

import numpy as np

from mpifed.options import opt
from mpifed.registry import PARTITIONS


@PARTITIONS.register("strided")
class Strided:
    \"\"\"Client k holds every K-th training sample, from sample k + offset on.\"\"\"

    @dataclass
    class Options:
        offset: int = opt(0, "where client 0's stride starts", min=0)

    @staticmethod
    def split(labels, num_clients, rng, options, groups=None, indices=None):
        return [np.arange((k + options.offset) % num_clients, len(labels), num_clients) for k in range(num_clients)]
"""


def test_a_partition_of_your_own_prepares_under_the_hash_of_its_code(tmp_path):
    (tmp_path / "strided.py").write_text(PARTITION)
    (tmp_path / "s.yaml").write_text(SETTING.replace("partition: {name: dirichlet, beta: 0.5, min_size: 5}",
                                                     "partition: {name: strided, offset: 1}"))
    shown = command(tmp_path, "mpifed.prepare", "--plugin", "strided.py", "--config", "s.yaml", "--show").stdout
    first = next(line for line in shown.splitlines() if line.startswith("prepared data: "))
    first = first.removeprefix("prepared data: ")
    manifest = json.loads((tmp_path / first / "manifest.json").read_text())
    sha = hashlib.sha256((tmp_path / "strided.py").read_bytes()).hexdigest()
    assert manifest["spec"]["code"] == {"partition": sha} and manifest["spec"]["partition"]["name"] == "strided"
    command(tmp_path, "mpifed.main", "--plugin", "strided.py", "--config", "s.yaml", "--set", "train.rounds=1")
    with open(tmp_path / "strided.py", "a") as f:
        f.write("# changed\n")
    again = command(tmp_path, "mpifed.prepare", "--plugin", "strided.py", "--config", "s.yaml").stdout
    folder = next(line for line in again.splitlines() if line.startswith("prepared data: "))
    assert folder.removeprefix("prepared data: ") != first   # other code, another prepared folder
