"""The command-line tools: the `mpifed` dispatcher, --version and help text on every flag, shipped configs."""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

from mpifed import __version__
from mpifed.entry import commands, configs, jobscripts, launch, main, prepare, table
from mpifed.files import packaged
from mpifed.settings.config import ConfigError, load

TOOLS = {"main": main.main, "prepare": prepare.main, "table": table.main, "launch": launch.main,
         "commands": commands.main, "config": configs.main, "slurm": jobscripts.main}


class Parsed(Exception):
    """Raised instead of parsing, carrying the parser."""


def parser_of(tool, monkeypatch):
    def grab(self, *args, **kwargs):
        raise Parsed(self)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    with pytest.raises(Parsed) as got:
        tool({launch.main: ["-n", "2"], commands.main: ["--help"]}.get(tool, []))
    return got.value.args[0]


def actions(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from actions(sub)
        else:
            yield action


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_every_flag_has_help_and_every_tool_a_version(name, monkeypatch):
    parser = parser_of(TOOLS[name], monkeypatch)
    undocumented = [a.option_strings or a.dest for a in actions(parser) if not a.help]
    assert not undocumented, f"{name}: no help text for {undocumented}"
    assert any(isinstance(a, argparse._VersionAction) for a in parser._actions)


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_version_prints_the_package_version(name, capsys):
    with pytest.raises(SystemExit) as e:
        TOOLS[name](["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"mpifed {__version__}"


def test_mpifed_dispatches_to_each_command(monkeypatch):
    seen = []
    for name in commands.COMMANDS:
        monkeypatch.setattr(commands, "command_main", lambda n: (lambda argv: seen.append((n, argv)) or 0))
        assert commands.main([name, "--config", "x.yaml"]) == 0
    assert seen == [(n, ["--config", "x.yaml"]) for n in commands.COMMANDS]
    seen.clear()
    assert commands.main(["--config", "x.yaml"]) == 0
    assert seen == [("run", ["--config", "x.yaml"])]


def test_bare_mpifed_prints_its_help(capsys):
    assert commands.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mpifed") and "launch   run with N ranks" in out


def test_a_missing_command_module_is_said_plainly(monkeypatch, capsys):
    monkeypatch.setitem(commands.COMMANDS, "report", "mpifed.no_such_module")
    assert commands.main(["report", "runs"]) == 2
    assert "not available in this installation" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        commands.main(["frobnicate"])
    assert e.value.code == 2


def test_shipped_configs_are_found_from_any_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert packaged.find_config("configs/quickstart.yaml") == packaged.CONFIGS / "quickstart.yaml"
    assert packaged.find_config("papers/fedntd/base.yaml") == packaged.CONFIGS / "papers" / "fedntd" / "base.yaml"
    cfg, _ = load(["configs/papers/fedntd/cifar10-shard2.yaml"])
    assert cfg.data.dataset.name == "cifar10"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "quickstart.yaml").write_text("train: {rounds: 3}\n")
    assert load(["configs/quickstart.yaml"])[0].train.rounds == 3          # a local file wins
    with pytest.raises(ConfigError, match="mpifed config list"):
        load(["configs/nope.yaml"])
    assert configs.main(["copy", "mine"]) == 0
    assert (tmp_path / "mine" / "papers" / "fedntd" / "table1.table.yaml").is_file()
    assert configs.main(["copy", "mine"]) == 2 and "--force" in capsys.readouterr().err


def test_config_copy_onto_a_file_or_an_unwritable_place_is_one_message(tmp_path, capsys, read_only_view):
    (tmp_path / "file.yaml").write_text("x: 1\n")
    (tmp_path / "shut").mkdir()
    places = [(tmp_path / "file.yaml", "is a file, not a folder"), ("/proc/mpifed-configs", "cannot copy the configs"),
              (lambda: read_only_view(tmp_path / "shut") / "configs", "cannot copy the configs")]
    for dest, message in places:
        dest = dest() if callable(dest) else dest
        assert configs.main(["copy", str(dest)]) == 2
        err = capsys.readouterr().err
        assert message in err and str(dest) in err and "Traceback" not in err, err
        assert (tmp_path / "file.yaml").read_text() == "x: 1\n"


def test_python_m_mpifed_config_is_the_config_command():
    done = subprocess.run([sys.executable, "-m", "mpifed.config", "--help"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.returncode == 0 and "{list,copy}" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("command",
                         [["table", "configs/papers/fedntd/table1.table.yaml", "--list"], ["config", "list"]])
def test_a_listing_into_a_closed_pipe_ends_without_a_traceback(command, tmp_path):
    """`mpifed table X --list | head -1`: the reader leaves early; the command stops quietly."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "mpifed", *command], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[1], timeout=120)
    finally:
        os.close(write_end)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr



def test_mpifed_slurm_writes_the_shipped_scripts_and_keeps_yours(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert commands.main(["slurm"]) == 0
    assert sorted(f.name for f in (tmp_path / "slurm").iterdir()) == sorted(
        f.name for f in (REPO / "slurm").iterdir())
    assert (tmp_path / "slurm" / "common.sh").read_text() == (REPO / "slurm" / "common.sh").read_text()
    (tmp_path / "slurm" / "cpu.sbatch").write_text("mine")
    assert commands.main(["slurm"]) == 2 and "--force" in capsys.readouterr().err
    assert (tmp_path / "slurm" / "cpu.sbatch").read_text() == "mine"


def test_a_configs_tokenizer_folder_is_found_from_any_directory(tmp_path, monkeypatch):
    from mpifed.data.tokenize import tokenizer_file
    monkeypatch.chdir(tmp_path)
    found = tokenizer_file("configs/repro/fedgkd/fortunes-wordpiece")
    shipped = REPO / "configs/repro/fedgkd/fortunes-wordpiece/vocab.txt"
    assert found.name == "vocab.txt" and found.read_bytes() == shipped.read_bytes()
