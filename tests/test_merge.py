"""mpifed merge (mpifed.tables.merge): several machines' runs in one results tree; the same run with
other numbers from one machine refused, from another machine kept beside it and named by the summary."""
import json
import shutil

import pytest

from test_report import hand_written_table
from mpifed.entry.merge import main as merge_main
from mpifed.entry.table import main as table_main
from mpifed.tables.merge import LISTED, OTHER, MergeError, merge


def recorded_on(run, cpu_id, host):
    (run / "provenance.json").write_text(json.dumps({"segments": [{"torch": "2.5", "ranks": [
        {"rank": 0, "host": host, "cpu": "CPU", "cpu_id": cpu_id, "blas": "mkl"}]}]}))


def changed_numbers(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[-1]["test_acc"] += 0.02
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def machines(tmp_path):
    """The runs of a hand-written table made on machine A (``tmp_path/runs``), and a copy of them
    from machine B where one run's numbers differ (``tmp_path/b``); returns (table, a, b, that run's name)."""
    table = hand_written_table(tmp_path)
    a = tmp_path / "runs"
    for run in (a / "t-t").iterdir():
        recorded_on(run, "family 25 model 1", "a1")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    one = sorted((b / "t-t").iterdir())[0]
    changed_numbers(one)
    return table, a, b, one.name


def test_runs_of_two_machines_merge_and_the_summary_names_those_made_on_both(tmp_path, capsys):
    table, a, b, differing = machines(tmp_path)
    for run in (b / "t-t").iterdir():
        recorded_on(run, "family 6 model 85", "b7")
    into = tmp_path / "results"
    assert merge_main([str(a), str(b), "--into", str(into)]) == 0
    said = capsys.readouterr().out
    assert "6 runs copied, 5 already there with the same numbers, 1 kept from another machine" in said, said
    kept = list((into / OTHER).glob(f"b7-*/t-t/{differing}"))
    assert len(kept) == 1 and (kept[0] / "provenance.json").is_file() and not (kept[0] / "model.pt").exists()
    assert json.loads((into / LISTED).read_text())[0]["run"] == str(kept[0].relative_to(into))
    assert (into / "t-t" / differing / "provenance.json").is_file()
    assert table_main([str(table), "--runs-root", str(into), "--summary"]) == 0
    summary = capsys.readouterr().out
    assert "1 of these runs were also made on another machine, with other numbers" in summary, summary
    assert f"{differing} (2.00 points, on b7;" in summary
    assert merge(list((a, b)), into).same == 11                               # again: nothing new
    from mpifed.entry.report import main as report_main
    assert report_main([str(into), "--out", str(tmp_path / "r")]) == 0         # a folder report keeps them apart
    import csv
    rows = {(r["setting"], r["method"]): r["n"] for r in csv.DictReader((tmp_path / "r" / "table.csv").open())
            if r["column"] == "final test_acc"}
    assert rows[("t-t", "s-a")] == "3" and any(s.startswith("t-t (on b7-") and n == "1" for (s, _), n in rows.items())


def test_the_same_run_with_other_numbers_from_one_machine_is_refused_and_nothing_is_merged(tmp_path, capsys):
    _, a, b, differing = machines(tmp_path)
    into = tmp_path / "results"
    assert merge_main([str(a), str(b), "--into", str(into)]) == 2
    err = capsys.readouterr().err
    assert f"{differing}" in err and "recorded on one machine" in err and "Nothing was merged" in err
    assert not into.exists()
    with pytest.raises(MergeError, match="no such folder"):
        merge([tmp_path / "nowhere"], into)
