"""The tutorial's transcripts (docs/tutorial.md) are what the commands print now: the commands that
train little (the first run, the table's --list, the resume and its refusal once the file changed)
run as the tutorial runs them, in a folder holding the tutorial's files, and their output is compared
with the transcript by its shape: numbers, hashes, process ids and host names left out, a line cut
at ``...`` by its start, a ``...`` line standing for any lines. The table's own runs (steps 4 to 7,
minutes of training) are not run here.

``MPIFED_WRITE_TRANSCRIPTS=1 python -m pytest tests/test_transcripts.py`` writes what the commands print
into the tutorial instead (the test's folder shown as the tutorial's ``/tmp/tut``)."""
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, env

TUTORIAL = REPO / "docs" / "tutorial.md"
FILES = ["mytable/digits-lda.yaml", "mytable/fedavg.yaml", "mytable/fedntd.yaml", "mytable/fedgkd.yaml",
         "mytable/mine.yaml", "mytable/mine.table.yaml"]   # the tutorial's yaml blocks, in order
TESTED = {"mpifed run --plugin my_method.py --set algorithm.name=logit_penalty train.rounds=3 run.name=first-try",
          "mpifed table mytable/mine.table.yaml --list",
          "mpifed run --plugin my_method.py --resume runs/first-try --set train.rounds=5",
          "mpifed run --plugin my_method.py --resume runs/first-try --set train.rounds=6"}


def blocks(kind):
    """The tutorial's fenced blocks of ``kind`` (python, yaml, console), in order."""
    return re.findall(rf"```{kind}\n(.*?)```", TUTORIAL.read_text(), flags=re.S)


def shape(line):
    """A line without what changes from run to run: hashes, numbers, pids, host names, paths' roots."""
    line = re.sub(r"/\S*/(my_method\.py)", r"\1", line)                # an absolute path of the method's file
    line = re.sub(r"host \S+", "host H", line)
    line = re.sub(r"Machine: .*", "Machine: M", line)
    line = re.sub(r"[0-9a-f]{10,}", "#", line)
    return re.sub(r"\d+(\.\d+)?", "#", line).rstrip()


def matches(expected, actual):
    """Whether ``actual``'s lines have the shape of ``expected``'s, in order (see the module)."""
    got = [shape(x) for x in actual.splitlines() if x.strip()]
    i = 0
    loose = False
    for want in (shape(x) for x in expected.splitlines() if x.strip()):
        if want == "...":
            loose = True
            continue
        cut = want.endswith("...")
        stem = want[:-3].rstrip() if cut else want
        while i < len(got) and not (got[i].startswith(stem) if cut else got[i] == stem):
            if not loose:
                return False
            i += 1
        if i == len(got):
            return False
        i, loose = i + 1, False
    return loose or i == len(got)


@pytest.mark.e2e
def test_the_tutorials_transcripts_are_what_its_commands_print(tmp_path):
    (tmp_path / "my_method.py").write_text(blocks("python")[0])
    yamls = blocks("yaml")
    assert len(yamls) == len(FILES), "the tutorial's yaml blocks changed: update FILES"
    for name, text in zip(FILES, yamls):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    shown = {}
    for block in blocks("console"):
        command, _, output = block.partition("\n")
        shown.setdefault(command.removeprefix("$ "), output)
    assert TESTED <= set(shown), f"the tutorial no longer shows {TESTED - set(shown)}"
    for command in [c for c in shown if c in TESTED]:
        if command.endswith("train.rounds=6"):   # the tutorial edits the file first
            (tmp_path / "my_method.py").write_text(blocks("python")[0] + "# a comment\n")
        words = command.split()[1:]
        done = subprocess.run([sys.executable, "-m", "mpifed", *words], cwd=tmp_path, env=env(), capture_output=True,
                              text=True, timeout=600)
        printed = (done.stdout + done.stderr).replace(str(tmp_path), "/tmp/tut")
        if os.environ.get("MPIFED_WRITE_TRANSCRIPTS"):
            text = TUTORIAL.read_text()
            TUTORIAL.write_text(text.replace(f"$ {command}\n{shown[command]}", f"$ {command}\n{printed}"))
            continue
        assert matches(shown[command], printed), f"$ {command}\n--- the tutorial shows:\n{shown[command]}\n--- it " \
                                                 f"prints:\n{printed}"


def test_a_shape_leaves_out_what_changes_and_keeps_the_words():
    assert shape("[mpifed]   rank 0 (server and worker): host vm pid 579 device cpu threads 1") == \
        "[mpifed]   rank # (server and worker): host H pid # device cpu threads #"
    assert matches("a 1\n...\nb 2 ...", "a 3\nx\ny\nb 4 and more")
    assert not matches("a 1\nb 2", "a 1\nc 2")
    assert not matches("a 1", "a 1\nb 2")                               # a line the transcript lacks
