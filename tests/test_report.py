"""mpifed.entry.report on hand-written run directories: figures exist, the CSV holds the right numbers,
configurations are never mixed; prepare --plot; the message when matplotlib is missing."""
from __future__ import annotations

import csv
import statistics
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, env, tiny
from test_tables import fake_run, resolved_config, write_table

from mpifed.run import results
from mpifed.tables import figure_style, plots
from mpifed.settings.config import digest, result_fingerprint
from mpifed.registry import ALGORITHMS
from mpifed.tables.collection import display_name
from mpifed.entry.report import main as report_main

PNG = b"\x89PNG\r\n\x1a\n"
FINALS = {"a": [0.60, 0.64, 0.71], "b": [0.70, 0.75, 0.77]}


def hand_written_table(tmp_path):
    table = write_table(tmp_path / "t", tmp_path / "data", methods="[a.yaml, b.yaml]", seeds="[0, 1, 2]",
                        metric="{kind: final, rounds_to: [0.65]}")
    root = tmp_path / "runs" / "t-t"
    for method, finals in FINALS.items():
        for seed, last in enumerate(finals):
            accs = [0.3, 0.5, last]
            per_class = [[a - 0.1, a + 0.1] for a in accs]
            fake_run(root / f"s-{method}-s{seed}", resolved_config(table, seed, method=f"{method}.yaml"),
                     accs, per_class)
    return table


def test_report_of_a_table_writes_figures_and_correct_tables(tmp_path, capsys):
    table = hand_written_table(tmp_path)
    out = tmp_path / "report"
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(out)]) == 0
    for name in ("s-curves.png", "s-per-class.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
    rows = list(csv.DictReader((out / "table.csv").open()))
    got = {(r["method"], r["column"]): r for r in rows}
    for method, finals in FINALS.items():
        cell = got[(method, "final test_acc")]
        assert float(cell["mean"]) == pytest.approx(100 * statistics.fmean(finals), abs=1e-4)
        assert float(cell["std"]) == pytest.approx(100 * statistics.stdev(finals), abs=1e-4)
        assert cell["n"] == "3" and cell["unit"] == "%"
    assert got[("a", "T(65%)")]["n"] == "1" and got[("a", "T(65%)")]["missing"] == "2"
    assert float(got[("b", "T(65%)")]["mean"]) == 3 and got[("b", "T(65%)")]["std"] == "0"
    assert "| a | 65.00 ± 5.57 (n=3) | 3.0 (n=1; not reached in 2) |" in (out / "table.md").read_text()
    tex = (out / "table.tex").read_text()
    assert "\\begin{table}[t]" in tex and "\\begin{tabular}{lS[" in tex and "T(65\\%)" in tex
    assert "a & 65.00 \\pm 5.57 & 3.0{\\,(n=1)} \\\\" in tex                    # n only where seeds are missing
    assert "b & \\bfseries 74.00 \\pm 3.61 & 3.0 \\pm 0.0 \\\\" in tex             # ahead of a on every seed
    assert float(got[("b", "final test_acc")]["difference"]) == pytest.approx(9.0, abs=1e-4)
    assert got[("b", "final test_acc")]["vs"] == "a" and got[("b", "final test_acc")]["seeds_ahead"] == "3"
    assert got[("b", "final test_acc")]["verdict"] == "higher" and float(got[("b", "final test_acc")]["ci_low"]) > 0
    assert got[("a", "final test_acc")]["vs"] == "" and got[("b", "T(65%)")]["difference"] == ""


def test_the_report_of_a_table_says_what_its_summary_says_claims_and_holm_included(tmp_path, capsys):
    from mpifed.entry.table import main as table_main
    table = hand_written_table(tmp_path)
    table.write_text(table.read_text() + "claims: [b > a]\n")
    out = tmp_path / "report"
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(out)]) == 0
    capsys.readouterr()
    assert table_main([str(table), "--runs-root", str(tmp_path / "runs"), "--summary"]) == 0
    printed = capsys.readouterr().out
    md = (out / "table.md").read_text()
    assert "The table's declared claims" in md and "Holm's adjustment over all 1 of them" in md
    assert "| b > a | s |" in md and "| supported |" in md
    claims = md[md.index("The table's declared claims"):].split("\n\n")[1]
    assert claims in printed                                          # the same block --summary prints


def test_a_given_metric_replaces_the_tables_own(tmp_path, capsys):
    table = hand_written_table(tmp_path)
    out = tmp_path / "report"
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--metric", "best", "--out", str(out)]) == 0
    columns = {r["column"] for r in csv.DictReader((out / "table.csv").open())}
    assert "best test_acc" in columns and "T(65%)" not in columns


def test_report_of_folders_never_mixes_configurations(tmp_path, capsys):
    table = write_table(tmp_path / "t", tmp_path / "data")
    root = tmp_path / "runs" / "mine"
    fake_run(root / "x-s0", resolved_config(table, 0), [0.5, 0.6], [[0.5, 0.7], [0.6, 0.6]])
    fake_run(root / "x-s1", resolved_config(table, 1), [0.5, 0.8], [[0.5, 0.7], [0.8, 0.8]])
    fake_run(root / "x-s2", resolved_config(table, 2, "train.lr=0.5"), [0.1, 0.2], [[0.1, 0.1], [0.2, 0.2]])
    fake_run(root / "x-s3", resolved_config(table, 3), [0.1], state="stopped")
    out = tmp_path / "report"
    assert report_main([str(root), "--out", str(out), "--metric", "best", "--format", "svg"]) == 0
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert sorted((r["method"].split(" [")[0], r["n"], r["mean"]) for r in rows) == [("x", "1", "20"), ("x", "2", "70")]
    assert len({r["method"] for r in rows}) == 2                # two configurations, two labelled groups
    assert "x-s3: not finished (stopped)" in (out / "table.md").read_text()
    assert (out / "mine-curves.svg").read_text().lstrip().startswith("<?xml")
    assert (out / "mine-per-class.svg").stat().st_size > 1000


def test_a_folder_report_names_runs_by_their_label_and_keeps_search_runs_apart(tmp_path):
    table = write_table(tmp_path / "t", tmp_path / "data")
    root = tmp_path / "runs" / "mine"
    for seed in (0, 1):
        fake_run(root / f"x-s{seed}", resolved_config(table, seed, "run.label=FedAvg (tuned)"), [0.5, 0.6 + seed / 10])
        fake_run(root / "tuning" / f"x-lr0.1-s{seed}", resolved_config(table, seed, "train.lr=0.1"), [0.3, 0.4])
    out = tmp_path / "report"
    assert report_main([str(root), "--out", str(out)]) == 0
    rows = {(r["setting"], r["method"]): r["n"] for r in csv.DictReader((out / "table.csv").open())}
    assert rows == {("mine", "FedAvg (tuned)"): "2", ("mine (search runs)", "x-lr0.1"): "2"}, rows


def test_report_without_matplotlib_writes_the_tables_and_names_the_extra(tmp_path, monkeypatch, capsys):
    table = hand_written_table(tmp_path)
    monkeypatch.setattr(plots, "plt", None)
    out = tmp_path / "r"
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert "no figures: plots need matplotlib: pip install 'mpifed[plots]'" in capsys.readouterr().err
    assert sorted(f.name for f in out.iterdir()) == ["table.csv", "table.md", "table.tex"]
    from mpifed.entry.prepare import main as prepare_main
    assert prepare_main(tiny(tmp_path) + ["--plot"]) == 2
    assert "pip install 'mpifed[plots]'" in capsys.readouterr().err


def test_methods_show_as_papers_write_them():
    assert [display_name(m) for m in ("fedntd", "fedgkd_plus", "fedprox-mu0.01", "moon", "mine")] == \
        ["FedNTD", "FedGKD+", "FedProx-mu0.01", "MOON", "mine"]


def test_a_pdf_figure_embeds_its_fonts_as_truetype_not_type_3(tmp_path):
    pytest.importorskip("matplotlib")
    curve = plots.Curve("fedavg", np.arange(1, 4), np.array([0.1, 0.2, 0.3]), None)
    pdf = plots.curves(tmp_path / "c.pdf", "a title", "", [("test accuracy", [curve])]).read_bytes()
    assert b"/Subtype /Type3" not in pdf and b"/FontFile2" in pdf
    import matplotlib
    assert matplotlib.rcParams["pdf.fonttype"] == 3        # the user's own figures are left as they were


def test_a_method_keeps_its_look_in_every_figure():
    fixed = [ALGORITHMS.display_name(n) for n in ALGORITHMS.names()]
    one = figure_style.styles({m: m for m in ("FedNTD", "FedAvg", "FedAvg-tuned", "mine")}, fixed)
    two = figure_style.styles({"FedAvg": "FedAvg"}, fixed)
    assert one["FedAvg"] == two["FedAvg"] and len({s.colour for s in one.values()}) == 4
    for extra in range(25):                  # however many plugins registered: four methods, four colours
        padded = [*fixed, *(f"plugin{i}" for i in range(extra))]
        assert len({s.colour for s in figure_style.styles({m: m for m in one}, padded).values()}) == 4
    grey = figure_style.styles({m: m for m in one}, fixed, greyscale=True)
    assert {s.colour for s in grey.values()} <= set(figure_style.GREYS)
    assert len({(s.linestyle, s.marker) for s in grey.values()}) == 4        # apart without colour


def test_a_folder_with_more_settings_keeps_each_methods_colour():
    fixed = [ALGORITHMS.display_name(n) for n in ALGORITHMS.names()]
    algorithm = {"lda0.1-fedntd": "FedNTD", "lda0.5-fedntd": "FedNTD", "lda0.1-fedavg": "FedAvg"}
    alone = figure_style.method_keys({"lda0.1": ["lda0.1-fedntd", "lda0.1-fedavg"]}, algorithm)
    both = figure_style.method_keys({"lda0.1": ["lda0.1-fedntd", "lda0.1-fedavg"], "lda0.5": ["lda0.5-fedntd"]},
                                    algorithm)
    assert figure_style.styles(alone, fixed)["lda0.1-fedntd"] == figure_style.styles(both, fixed)["lda0.1-fedntd"]
    assert figure_style.styles(both, fixed)["lda0.5-fedntd"] == figure_style.styles(both, fixed)["lda0.1-fedntd"]


def test_a_figure_at_a_columns_width_keeps_every_text_at_7_pt_or_more(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    figs = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or save(fig, path))
    lines = [plots.Curve(f"method {k}", np.arange(1, 31), np.linspace(10, 60 + k, 30), np.full(30, 2.0))
             for k in range(6)]
    plots.curves(tmp_path / "c.png", "FedNTD Table 1: CIFAR-10, shards of 2 classes", "line: mean over 5 seeds",
                 [("test accuracy (%)", lines), ("test loss", lines)], plots.Layout(plots.SIZES["column"]))
    plots.heatmap(tmp_path / "h.png", "title", "sub", np.random.default_rng(0).uniform(0, 100, (6, 10)),
                  [f"method {k}" for k in range(6)], [str(c) for c in range(10)], "class", "method", "%",
                  fmt="{:.0f}", layout=plots.Layout(plots.SIZES["column"], title=False))
    for fig in figs:
        assert fig.get_size_inches()[0] == pytest.approx(3.35)
        sizes = [t.get_fontsize() for t in fig.findobj(lambda o: hasattr(o, "get_fontsize") and hasattr(o, "get_text"))
                 if t.get_text().strip()]
        assert sizes and min(sizes) >= 7, sorted(sizes)[:5]
    assert figs[0].get_size_inches()[1] > figs[0].get_size_inches()[0]        # narrow: the panels stacked
    assert not figs[1]._suptitle                                              # --no-title


def test_a_methods_colour_follows_its_algorithm_whatever_its_runs_are_called(tmp_path):
    from mpifed.tables.collection import Collection
    from mpifed.tables.figures import method_styles
    runs = {}
    for label, algorithm in (("FedNTD", "fedntd"), ("digits-lda0.1-fedntd", "fedntd"), ("mine", "fedavg"),
                             ("tuned", "fedavg")):
        (tmp_path / label).mkdir()
        (tmp_path / label / "config.yaml").write_text(f"algorithm: {{name: {algorithm}}}\n")
        runs[label] = [tmp_path / label]
    table = method_styles(Collection("t", results.Metric(), {("s", "FedNTD"): runs["FedNTD"]}))
    folder = method_styles(Collection("f", results.Metric(),
                                      {("d", "digits-lda0.1-fedntd"): runs["digits-lda0.1-fedntd"]}))
    assert folder["digits-lda0.1-fedntd"] == table["FedNTD"]
    two = method_styles(Collection("x", results.Metric(), {("s", m): runs[m] for m in ("mine", "tuned")}))
    assert len({s.colour for s in two.values()}) == 2                     # two labels of FedAvg: two colours


def test_the_figure_options_reach_the_figures_and_a_bad_width_is_one_message(tmp_path, monkeypatch, capsys):
    table = hand_written_table(tmp_path)
    drawn = {}
    monkeypatch.setattr(plots, "curves", lambda path, *a: drawn.setdefault("curves", a) and path)
    monkeypatch.setattr(plots, "heatmap", lambda path, *a, **k: drawn.setdefault("heatmap", k["layout"]) and path)
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "r"),
                        "--size", "column", "--title", "Figure 3", "--no-title"]) == 0
    title, _, _, layout, _ = drawn["curves"]
    assert title == "Figure 3" and layout == plots.Layout(3.35, title=False) == drawn["heatmap"]
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "r"),
                        "--width", "0.2"]) == 2
    assert "--width 0.2: give the figure's width in inches, from 1 to 20" in capsys.readouterr().err


def test_figures_carry_the_tables_title_the_overrides_percent_and_class_names(tmp_path, monkeypatch, capsys):
    table = write_table(tmp_path / "t", tmp_path / "data", methods="[fedavg.yaml, fedntd.yaml]", seeds="[0, 1]",
                        dataset="{name: fashion_mnist}")
    (table.parent / "fedavg.yaml").write_text("algorithm: fedavg\n")
    (table.parent / "fedntd.yaml").write_text("algorithm: fedntd\n")
    for method in ("fedavg", "fedntd"):
        for seed in (0, 1):
            d = resolved_config(table, seed, "train.rounds=3", method=f"{method}.yaml")
            fake_run(tmp_path / "runs" / "t-t" / f"s-{method}-s{seed}-{digest(result_fingerprint(d))}", d,
                     [0.5, 0.6, 0.7], [[0.7] * 10] * 3)
    drawn = {}
    monkeypatch.setattr(plots, "curves", lambda path, *a: drawn.setdefault("curves", a) and path)
    monkeypatch.setattr(plots, "heatmap", lambda path, *a, **k: drawn.setdefault("heatmap", a) and path)
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "r"),
                        "--set", "train.rounds=3"]) == 0
    title, subtitle, panels, layout, xlabel = drawn["curves"]
    assert layout == plots.Layout(plots.SIZES["page"], title=True) and xlabel == "round"
    assert title == "T (--set train.rounds=3): s"
    assert subtitle == "line: mean over 2 seeds; band: 95% t interval of the mean over seeds"
    (accuracy, lines), _ = panels
    assert accuracy == "test accuracy (%)" and [c.label for c in lines] == ["FedAvg", "FedNTD"]
    assert list(lines[0].mean) == pytest.approx([50, 60, 70]) and lines[0].colour != lines[1].colour
    rows, columns = drawn["heatmap"][3:5]
    assert rows == ["FedAvg", "FedNTD"] and columns[0] == "T-shirt/top"
    assert "| FedAvg | 70.00 ± 0.00 (n=2) |" in (tmp_path / "r" / "table.md").read_text()
    assert (tmp_path / "r" / "table.md").read_text().startswith("T (with --set train.rounds=3): ")   # as --summary


def test_figure_options_axes_band_looks_labels_order_and_a_csv_beside_each_figure(tmp_path, monkeypatch):
    import json
    from scipy import stats
    table = hand_written_table(tmp_path)
    for run in (tmp_path / "runs" / "t-t").iterdir():       # each round took 2 s: wall time is 2, 4, 6 s
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "time": {"round": 2.0}}) + "\n" for r in rows))
    drawn = {}
    monkeypatch.setattr(plots, "curves", lambda path, *a: drawn.setdefault("curves", a) and path)
    out = tmp_path / "r"
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(out), "--x", "wall_time",
                        "--y", "test_acc,train_loss", "--greyscale", "--legend", "outside", "--label", "b=B (ours)",
                        "--order", "b,a"]) == 0
    _, subtitle, panels, layout, xlabel = drawn["curves"]
    assert xlabel == "wall time (s)" and layout.legend == "outside" and "95% t interval" in subtitle
    (accuracy, lines), (loss, _) = panels
    assert (accuracy, loss) == ("test accuracy (%)", "train loss") and [c.label for c in lines] == ["B (ours)", "a"]
    assert list(lines[0].rounds) == [2.0, 4.0, 6.0]
    assert {c.colour for c in lines} <= set(figure_style.GREYS) and lines[0].linestyle != lines[1].linestyle
    finals = [100 * v for v in FINALS["b"]]
    half = stats.t.ppf(0.975, 2) * statistics.stdev(finals) / 3 ** 0.5
    assert lines[0].band[-1] == pytest.approx(half)
    rows = list(csv.DictReader((out / "s-curves.csv").open()))
    last = [r for r in rows if r["panel"] == "test accuracy (%)" and r["method"] == "B (ours)"][-1]
    assert float(last["wall time (s)"]) == 6 and float(last["mean"]) == pytest.approx(statistics.fmean(finals))
    assert float(last["high"]) - float(last["mean"]) == pytest.approx(half, rel=1e-5) and last["band"] == "t95"
    assert (out / "s-per-class.csv").read_text().splitlines()[0] == ",0,1"
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(out), "--x", "bytes"]) == 2
    from mpifed.tables.curves import FigureOptions
    sweep = FigureOptions(labels=("lr=0.1+beta=0.5=lr 0.1, β=0.5", "lr=0.1=plain"))
    assert sweep.label("lr=0.1+beta=0.5") == "lr 0.1, β=0.5" and sweep.label("lr=0.1") == "plain"
    assert sweep.label("lr=0.2") == "lr=0.2"


def test_a_clock_runs_curves_against_simulated_time_and_bytes_sent(tmp_path):
    """--x sim_time and --x bytes on the rows a system.clock=true run writes: each point at its round's
    sim_clock, and at the bytes_down and bytes_up sent so far; a run without the clock is one message."""
    pytest.importorskip("matplotlib")
    from conftest import run_debug
    run_debug(tiny(tmp_path, "system.clock=true", "system.bandwidth=100000", "train.rounds=3", name="clock-s0"))
    run = tmp_path / "runs" / "clock-s0"
    rows = results.read_rows(run)
    out = tmp_path / "report"
    assert report_main([str(run), "--out", str(out), "--x", "sim_time", "--band", "none"]) == 0
    assert (out / "runs-curves.png").read_bytes().startswith(PNG)
    drawn = [r for r in csv.DictReader((out / "runs-curves.csv").open()) if r["panel"] == "test accuracy (%)"]
    assert [float(r["simulated time (s)"]) for r in drawn] == pytest.approx([r["sim_clock"] for r in rows], rel=1e-5)
    assert float(drawn[-1]["mean"]) == pytest.approx(100 * rows[-1]["test_acc"], rel=1e-5)
    assert report_main([str(run), "--out", str(out), "--x", "bytes"]) == 0
    sent = np.cumsum([r["bytes_down"] + r["bytes_up"] for r in rows]) / 1e6
    drawn = [r for r in csv.DictReader((out / "runs-curves.csv").open()) if r["panel"] == "test loss"]
    assert [float(r["data sent (MB)"]) for r in drawn] == pytest.approx(list(sent), rel=1e-5) and sent[0] > 0
    plain = tmp_path / "runs" / "plain-s0"
    fake_run(plain, resolved_config(write_table(tmp_path / "t", tmp_path / "data"), 0), [0.5, 0.6])
    assert report_main([str(plain), "--out", str(out), "--x", "sim_time"]) == 2


def test_a_panel_of_differences_to_a_method_has_a_paired_band(tmp_path, monkeypatch):
    from scipy import stats
    table = hand_written_table(tmp_path)
    drawn = {}
    monkeypatch.setattr(plots, "curves", lambda path, *a: drawn.setdefault("curves", a) and path)
    assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "r"),
                        "--y", "test_acc", "--versus", "a"]) == 0
    _, _, panels, _, _ = drawn["curves"]
    (_, both), (ylabel, (b,)) = panels
    assert ylabel == "test accuracy − a (points)" and b.label == "b" and b.n == 3
    diffs = [100 * (y - x) for x, y in zip(FINALS["a"], FINALS["b"])]
    assert b.mean[-1] == pytest.approx(statistics.fmean(diffs))
    assert b.band[-1] == pytest.approx(stats.t.ppf(0.975, 2) * statistics.stdev(diffs) / 3 ** 0.5)
    assert b.band[-1] < both[1].band[-1]                                   # paired: narrower than b's own band


def test_prepare_plot_writes_the_partition_heatmap_beside_the_shards(tmp_path, capsys):
    from mpifed.entry.prepare import main as prepare_main
    assert prepare_main(tiny(tmp_path) + ["--plot"]) == 0
    written = list((tmp_path / "data").glob("*/partition.png"))
    assert len(written) == 1 and (written[0].parent / "manifest.json").exists()
    assert written[0].read_bytes().startswith(PNG)


def test_trainer_and_table_never_import_matplotlib():
    code = ("import sys, mpifed.entry.main, mpifed.round.server, mpifed.round.worker, mpifed.entry.table, "
            "mpifed.run.results, mpifed.entry.prepare; sys.exit('matplotlib' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env()).returncode == 0


def test_an_unwritable_out_is_one_message(tmp_path, capsys, read_only_view):
    table = hand_written_table(tmp_path)
    (tmp_path / "file").write_text("x")
    (tmp_path / "shut").mkdir()
    for out in (tmp_path / "file", "/proc/mpifed-report", lambda: read_only_view(tmp_path / "shut") / "report"):
        out = out() if callable(out) else out
        assert report_main([str(table), "--runs-root", str(tmp_path / "runs"), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"cannot write the report to --out {out}" in err and "a folder you can write to" in err, err
        assert (tmp_path / "file").read_text() == "x"


def test_a_metric_no_run_has_is_refused_with_the_allowed_ones(tmp_path, capsys):
    table = write_table(tmp_path / "t", tmp_path / "data")
    root = tmp_path / "runs" / "mine"
    fake_run(root / "x-s0", resolved_config(table, 0), [0.5, 0.6])
    for metric in ("bogus", "{kind: best, column: bogus}"):
        assert report_main([str(root), "--out", str(tmp_path / "r"), "--metric", metric]) == 2
        err = capsys.readouterr().err
        assert f"--metric {metric}: none of the runs has a value for it" in err
        assert "final, best, last_k" in err and "final_test_acc" in err and "train_loss" in err
    assert not (tmp_path / "r").exists()
    assert report_main([str(root), "--out", str(tmp_path / "r"), "--metric", "train_loss"]) == 0


def test_partition_plot_title_says_what_the_split_is_not_how_it_was_searched_for(tmp_path, monkeypatch, capsys):
    from mpifed.entry.prepare import main as prepare_main
    drawn = {}
    monkeypatch.setattr(plots, "heatmap", lambda path, *a, **k: drawn.setdefault("heatmap", a) and path)
    assert prepare_main(tiny(tmp_path) + ["--plot"]) == 0
    title, subtitle = drawn["heatmap"][:2]
    assert title == "synthetic: 5 clients, dirichlet partition (beta 0.5)"
    assert subtitle == "training samples per client and class (blank: none)"


def test_a_report_never_mixes_data_sets_or_pairs_runs_that_start_apart(tmp_path, capsys):
    """A folder holding digits and synthetic runs: two settings, a note, each its own figures and class
    names; a method whose runs start from another model is not paired with the reference."""
    table = write_table(tmp_path / "t", tmp_path / "data")
    mixed = tmp_path / "runs" / "mixed"
    for seed in (0, 1):
        fake_run(mixed / f"fedavg-s{seed}", resolved_config(table, seed), [0.5, 0.6 + 0.01 * seed], [[0.5, 0.7]] * 2)
        fake_run(mixed / f"other-s{seed}", resolved_config(table, seed, "data.dataset.name=digits"),
                 [0.8, 0.9 + 0.01 * seed], [[0.9] * 10] * 2)
        fake_run(mixed / f"wide-s{seed}", resolved_config(table, seed, "model.name=fedavg_cnn"),
                 [0.5, 0.7 + 0.02 * seed], [[0.5, 0.7]] * 2)
    out = tmp_path / "report"
    assert report_main([str(mixed), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    md = (out / "table.md").read_text()
    note = "The runs of mixed hold different data (dataset.name): they are reported as 2 settings"
    assert note in md and f"warning: {note}" in err
    settings = {r["setting"] for r in csv.DictReader((out / "table.csv").open())}
    assert settings == {"mixed (dataset.name=synthetic)", "mixed (dataset.name=digits)"}
    assert (out / "mixed_dataset.name_digits-per-class.png").is_file()
    assert "| wide | not paired: its runs start from fedavg_cnn, FedAvg's from digits_cnn: the seeds do not share" in md
