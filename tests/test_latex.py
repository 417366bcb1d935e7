"""A summary as LaTeX (mpifed.tables.latex): a float that compiles as it is (pdflatex, where
installed: Debian's texlive-latex-base, texlive-latex-recommended and texlive-science), names
escaped, and in bold the best with every method whose paired 95% interval against it contains 0."""
import shutil
import subprocess

import pytest

from mpifed.run import results
from mpifed.tables.latex import PREAMBLE, bold, escape, latex_table
from mpifed.tables.pivot import PivotError, pivot
from mpifed.tables.summary import Summary

CELLS = {("cifar_10 & α=0.1", "fedavg", "final test_acc"): [71.2, 71.5, 70.9],
         ("cifar_10 & α=0.1", "fed_ntd", "final test_acc"): [72.0, 71.4, 72.3],
         ("cifar_10 & α=0.1", "mine#1", "final test_acc"): [60.0, 61.0],
         ("s2", "fedavg", "final test_acc"): [-1.5, 2.0, 3.0],
         ("s2", "fed_ntd", "final test_acc"): [],
         ("s2", "mine#1", "final test_acc"): [100.25, 99.0, 98.0]}


def summary():
    cells = {k: results.Stat(v) for k, v in CELLS.items()}
    by_seed = {(st, m): dict(enumerate(v)) for (st, m, _), v in CELLS.items()}
    return Summary("My table_1 {x}", results.Metric(), ["cifar_10 & α=0.1", "s2"], ["fedavg", "fed_ntd", "mine#1"],
                   ["final test_acc"], cells, [], 0, True, by_seed=by_seed, declared_seeds=3)


def test_names_are_escaped_for_pdflatex():
    assert escape("fedprox_mu=0.01 & 5% #1 {x} ~^\\") == \
        "fedprox\\_mu=0.01 \\& 5\\% \\#1 \\{x\\} \\textasciitilde{}\\^{}\\textbackslash{}"
    assert escape("α Δ Α é 日") == "$\\alpha$ $\\Delta$ A e ?"


def test_the_best_and_those_the_seeds_cannot_tell_from_it_are_bold():
    assert bold({"a": {0: 71.2, 1: 71.5, 2: 70.9}, "b": {0: 72.0, 1: 71.4, 2: 72.3}, "c": {0: 60.0, 1: 61.0}},
                lower=False) == {"a", "b"}                          # a - b: [-1.9, +0.5] holds 0; c is behind
    assert bold({"a": {0: 1.0, 1: 1.1}, "b": {0: 2.0, 1: 2.2}}, lower=True) == {"a"}
    tex = latex_table(summary())
    assert "fedavg & \\bfseries 71.20 \\pm 0.30 & 1.17 \\pm 2.36 \\\\" in tex
    assert "mine\\#1 & 60.50 \\pm 0.71{\\,(n=2)} & \\bfseries 99.08 \\pm 1.13 \\\\" in tex
    plain = latex_table(summary(), caption="Accuracy (%) of α", label="tab:acc", numbers="plain")
    assert "\\caption{Accuracy (\\%) of $\\alpha$}" in plain and "\\label{tab:acc}" in plain
    assert "fed\\_ntd & \\textbf{71.90 $\\pm$ 0.46} & -- \\\\" in plain and "\\begin{tabular}{lcc}" in plain


@pytest.mark.parametrize("numbers", ["siunitx", "plain"])
def test_the_table_compiles_with_pdflatex(tmp_path, numbers):
    if shutil.which("pdflatex") is None or shutil.which("kpsewhich") is None or not subprocess.run(
            ["kpsewhich", "siunitx.sty"], capture_output=True, text=True).stdout.strip():
        pytest.skip("pdflatex with siunitx and booktabs is not installed (Debian: texlive-latex-base, "
                    "texlive-latex-recommended, texlive-science)")
    doc = tmp_path / "t.tex"
    doc.write_text("\\documentclass{article}\n" + PREAMBLE + "\\begin{document}\n"
                   + latex_table(summary(), numbers=numbers) + "\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (tmp_path / "t.pdf").stat().st_size > 1000


def sweep_summary():
    points = {"lr=0.01+beta=0.1": [50.0, 52.0], "lr=0.01+beta=0.5": [60.0, 61.0], "lr=0.1+beta=0.1": [55.0, 56.5],
              "lr=0.1+beta=0.5": [70.0, 72.0]}
    cells = {("s", p, "final test_acc"): results.Stat(v) for p, v in points.items()}
    return Summary("Sweep", results.Metric(), ["s"], list(points), ["final test_acc"], cells, [], 0, True,
                   by_seed={("s", p): dict(enumerate(v)) for p, v in points.items()}, declared_seeds=2)


def test_a_sweep_of_two_keys_pivots_one_down_and_one_across():
    found = pivot(sweep_summary())
    assert (found.down, found.across, found.rows, found.columns) == ("lr", "beta", ["0.01", "0.1"], ["0.1", "0.5"])
    md = found.markdown().splitlines()
    assert md[2] == "| lr | beta=0.1 | beta=0.5 |" and md[4] == "| 0.01 | 51.00 ± 1.41 (n=2) | 60.50 ± 0.71 (n=2) |"
    turned = pivot(sweep_summary(), "beta", "lr")
    assert turned.rows == ["0.1", "0.5"] and turned.columns == ["0.01", "0.1"]
    tex = found.latex()
    assert "0.1 & 55.75 \\pm 1.06 & \\bfseries 71.00 \\pm 1.41 \\\\" in tex and tex.count("\\bfseries") == 1
    with pytest.raises(PivotError, match="--pivot lrx: not a key of this sweep; its keys are lr, beta"):
        pivot(sweep_summary(), "lrx")
    with pytest.raises(PivotError, match="needs a sweep of two keys or more"):
        pivot(summary())


def test_the_pivot_compiles_with_pdflatex(tmp_path):
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed")
    doc = tmp_path / "p.tex"
    doc.write_text("\\documentclass{article}\n" + PREAMBLE + "\\begin{document}\n" + pivot(sweep_summary()).latex()
                   + "\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]


def test_a_sweeps_summary_pivots_on_the_command_line_and_writes_its_latex(tmp_path, capsys):
    from test_sweep import _config
    from test_tables import fake_run
    from mpifed.entry.table import main as table_main
    from mpifed.tables.sweep import load_sweep
    from mpifed.tables.table_file import resolve
    words = ["train.lr=0.01,0.1", "data.partition.beta=0.1,0.5"]
    base = _config(tmp_path)
    t = load_sweep([base], words, [], [0, 1], str(tmp_path / "runs"))
    resolve(t, [])
    for r in t.runs:
        fake_run(r.path, r.resolved, [0.3, 0.5 + 0.1 * (r.method == "lr=0.1+beta=0.5") + 0.01 * r.seed])
    tex = tmp_path / "pivot.tex"
    argv = ["--config", base, "--sweep", *words, "--seeds", "0", "1", "--runs-root", str(tmp_path / "runs"),
            "--summary"]
    assert table_main([*argv, "--pivot", "beta,lr", "--latex", str(tex)]) == 0
    out = capsys.readouterr().out
    assert "| beta | lr=0.01 | lr=0.1 |" in out and "| 0.5 | 50.50 ± 0.71 (n=2) | 60.50 ± 0.71 (n=2) |" in out, out
    assert f"wrote {tex}" in out and "\\bfseries 60.50 \\pm 0.71" in tex.read_text()
    assert table_main([*argv, "--pivot", "nope"]) == 2
    assert "--pivot nope: not a key of this sweep; its keys are lr, beta" in capsys.readouterr().err
