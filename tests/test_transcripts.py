"""The tutorial's transcripts (docs/tutorial.md) are what its commands print now: every console block's command
runs, in the page's order, in a folder holding the tutorial's files, with the page's edits between them (the
search's grid widened, the method's file changed), and its output is compared with the transcript by its shape:
numbers, hashes, process ids and host names left out, a line cut at ``...`` by its start, a ``...`` line standing
for any lines. The tutorial's table is small (24 short digits runs), so that its search, its runs, the summary,
the report and the evaluation of a trained model run here too.

``MPIFED_WRITE_TRANSCRIPTS=1 python -m pytest tests/test_transcripts.py`` writes what the commands print into the
tutorial instead (the test's folder shown as the tutorial's ``/tmp/tut``): a transcript whose lines still have the
shape of the output takes the new lines and keeps its cuts; one that does not is replaced by the whole output, to be
cut again by hand. The report's figure is copied to the page's image (docs/img/tutorial-curves.png)."""
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, env

TUTORIAL = REPO / "docs" / "tutorial.md"
FIGURE = REPO / "docs" / "img" / "tutorial-curves.png"
FILES = ["mytable/digits-lda.yaml", "mytable/fedavg.yaml", "mytable/fedntd.yaml", "mytable/fedgkd.yaml",
         "mytable/mine.yaml", "mytable/mine.table.yaml"]   # the tutorial's yaml blocks, in order
TABLE_RUN = "mpifed table mytable/mine.table.yaml --run 0 --parallel 2"
REFUSED_RESUME = "mpifed run --plugin my_method.py --resume runs/first-try --set train.rounds=6"
GRID, WIDER_GRID = "train.lr: [0.03, 0.1]", "train.lr: [0.03, 0.1, 0.3]"


def blocks(kind: str) -> list[str]:
    """The tutorial's fenced blocks of ``kind`` (python, yaml, console), in order."""
    return re.findall(rf"```{kind}\n(.*?)```", TUTORIAL.read_text(), flags=re.S)


def widen_the_grid(folder: Path) -> None:
    """Step 4's edit of the table file: one more learning rate in the search's grid."""
    table = folder / "mytable" / "mine.table.yaml"
    assert GRID in table.read_text(), f"the tutorial's table has no {GRID!r}: update GRID"
    table.write_text(table.read_text().replace(GRID, WIDER_GRID))


def change_the_method(folder: Path) -> None:
    """Step 8's edit of the method's file: a comment added."""
    with open(folder / "my_method.py", "a") as f:
        f.write("# a comment\n")


# what the tutorial does before a command's n-th run (0 the first)
BEFORE = {(TABLE_RUN, 1): widen_the_grid, (REFUSED_RESUME, 0): change_the_method}


def shape(line: str) -> str:
    """A line without what changes from run to run or machine to machine: hashes, signed numbers and the
    verdicts drawn from them, pids, host names, paths' roots."""
    line = re.sub(r"/\S*/(my_method\.py)", r"\1", line)                # an absolute path of the method's file
    line = re.sub(r"host \S+", "host H", line)
    line = re.sub(r"Machine: .*", "Machine: M", line)
    line = re.sub(r"[0-9a-f]{10,}", "#", line)
    # a verdict follows from the numbers (an interval that only just excludes 0 may not on another CPU)
    line = re.sub(r"\b(higher|lower|inconclusive|supported|the other way)\b", "VERDICT", line)
    return re.sub(r"[+-]?\d+(\.\d+)?", "#", line).rstrip()


def fits(want: str, got: str) -> bool:
    """Whether the printed line ``got`` has the shape of the transcript's line ``want`` (its start, where cut)."""
    if shape(want).endswith("..."):
        return shape(got).startswith(shape(want)[:-3].rstrip())
    return shape(got) == shape(want)


def pairs(expected: str, actual: str) -> list[tuple[str, str | None]] | None:
    """``expected``'s non-blank lines, each with the line of ``actual`` it stands for (None for a ``...`` line);
    None where ``actual``'s lines do not have their shapes in order (see the module)."""
    wants = [x for x in expected.splitlines() if x.strip()]
    got = [x for x in actual.splitlines() if x.strip()]

    @functools.cache
    def rest(w: int, g: int) -> tuple[tuple[str, str | None], ...] | None:
        """wants[w:] paired with got[g:], or None."""
        if w == len(wants):
            return () if g == len(got) else None
        if shape(wants[w]) == "...":                       # any lines, none too: the first choice that works
            tails = (rest(w + 1, h) for h in range(g, len(got) + 1))
            tail = next((x for x in tails if x is not None), None)
            return None if tail is None else ((wants[w], None),) + tail
        tail = rest(w + 1, g + 1) if g < len(got) and fits(wants[w], got[g]) else None
        return None if tail is None else ((wants[w], got[g]),) + tail
    paired = rest(0, 0)
    return None if paired is None else list(paired)


def matches(expected: str, actual: str) -> bool:
    """Whether ``actual``'s lines have the shape of ``expected``'s, in order (see the module)."""
    return pairs(expected, actual) is not None


def refreshed(expected: str, actual: str) -> str:
    """The transcript ``expected`` with ``actual``'s lines, its blank lines, ``...`` lines and cuts kept; ``actual``
    itself where its lines do not have ``expected``'s shape."""
    paired = pairs(expected, actual)
    if paired is None:
        return actual
    lines = iter(paired)
    out = []
    for line in expected.splitlines():
        if not line.strip():
            out.append(line)
            continue
        want, got = next(lines)
        stem = want.rstrip()[:-3].rstrip()
        if got is None:
            out.append(want)
        elif want.rstrip().endswith("...") and len(got) > len(stem) + 4:
            out.append(got[:len(stem)] + " ...")
        else:
            out.append(got)
    return "\n".join(out) + "\n"


def run_shown(command: str, folder: Path) -> str:
    """What ``command`` (an ``mpifed ...`` line of the tutorial) prints in ``folder``, the folder shown as
    ``/tmp/tut``."""
    done = subprocess.run([sys.executable, "-m", "mpifed", *command.split()[1:]], cwd=folder, env=env(),
                          capture_output=True, text=True, timeout=600)
    return (done.stdout + done.stderr).replace(str(folder), "/tmp/tut")


@pytest.mark.e2e
def test_the_tutorials_transcripts_are_what_its_commands_print(tmp_path):
    (tmp_path / "my_method.py").write_text(blocks("python")[0])
    yamls = blocks("yaml")
    assert len(yamls) == len(FILES), "the tutorial's yaml blocks changed: update FILES"
    for name, text in zip(FILES, yamls):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert f"`{WIDER_GRID}`" in TUTORIAL.read_text(), f"the tutorial no longer widens the grid to {WIDER_GRID}"
    shown = [block.partition("\n") for block in blocks("console")]
    commands = [command.removeprefix("$ ") for command, _, _ in shown]
    assert {key[0] for key in BEFORE} <= set(commands), "the tutorial no longer runs a command BEFORE names"
    writing = bool(os.environ.get("MPIFED_WRITE_TRANSCRIPTS"))
    printed = []
    for n, command in enumerate(commands):
        edit = BEFORE.get((command, commands[:n].count(command)))
        if edit:
            edit(tmp_path)
        printed.append(run_shown(command, tmp_path))
        output = shown[n][2]
        assert writing or matches(output, printed[-1]), \
            f"$ {command}\n--- the tutorial shows:\n{output}\n--- it prints:\n{printed[-1]}"
    if writing:
        new = iter(f"{command}\n{refreshed(output, out)}" for (command, _, output), out in zip(shown, printed))
        TUTORIAL.write_text(re.sub(r"```console\n(.*?)```", lambda _: f"```console\n{next(new)}```",
                                   TUTORIAL.read_text(), flags=re.S))
        shutil.copyfile(tmp_path / "report" / "digits-lda-curves.png", FIGURE)


def test_a_shape_leaves_out_what_changes_and_keeps_the_words():
    assert shape("[mpifed]   rank 0 (server and worker): host vm pid 579 device cpu threads 1") == \
        "[mpifed]   rank # (server and worker): host H pid # device cpu threads #"
    assert shape("| fedgkd | +4.83 [+0.12, +9.54], 3/3 seeds, p = 0.048: higher |") == \
        shape("| fedgkd | +4.71 [-0.02, +9.44], 3/3 seeds, p = 0.051: inconclusive |")
    assert matches("a 1\n...\nb 2 ...", "a 3\nx\ny\nb 4 and more")
    assert not matches("a 1\nb 2", "a 1\nc 2")
    assert not matches("a 1", "a 1\nb 2")                               # a line the transcript lacks
    assert matches("a\n...\nb 2\nc", "a\nb 1\nb 2\nc")                   # "b 1" has the shape of "b 2" too


def test_a_refreshed_transcript_takes_the_new_lines_and_keeps_its_cuts():
    shown = "a 1\n\n...\nb 2, a long line ...\n"
    assert refreshed(shown, "a 3\nx\ny\nb 4, a long line that goes on\n") == "a 3\n\n...\nb 4, a long line ...\n"
    assert refreshed(shown, "c 3\n") == "c 3\n"                        # another shape: the whole output
