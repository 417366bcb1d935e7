"""Plugins (mpifed.settings.plugins): a method, model, data set or partition from a file or module outside mpifed,
loaded once, hashed, checked against its registry's interface, named in configs relative to the file
that names them, and part of a run's identity through the config's ``code`` section.

Each test unloads what it loaded, so the registries of this process stay mpifed's own."""
import hashlib
import sys
import textwrap

import pytest

from conftest import plugin_method
from mpifed.settings import config, plugins
from mpifed.registry import ALGORITHMS, MODELS

def method(name="plug_penalty"):
    return plugin_method(name)


pytestmark = pytest.mark.usefixtures("unload_plugins")


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_a_file_plugin_registers_its_entries_under_the_hash_of_its_source(tmp_path):
    f = write(tmp_path / "mine.py", method())
    p = plugins.load(str(f))
    assert p.kind == "file" and p.origin == str(f) and p.provides == [("algorithm", "plug_penalty")]
    assert p.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()     # what sha256sum prints
    assert ALGORITHMS.get("plug_penalty").__doc__ == "FedAvg with a logit penalty."
    assert plugins.provider("algorithm", "plug_penalty") is p and plugins.provider("algorithm", "fedavg") is None
    assert plugins.load(str(f)) is p                                    # the same source: loaded once


def test_an_edited_file_replaces_its_earlier_version(tmp_path):
    f = write(tmp_path / "mine.py", method())
    old = plugins.load(str(f))
    f.write_text(method("plug_renamed"))
    new = plugins.load(str(f))
    assert new.sha256 != old.sha256 and "plug_penalty" not in ALGORITHMS and "plug_renamed" in ALGORITHMS
    assert old.module not in sys.modules


@pytest.mark.parametrize("source,message", [
    ("import no_such_module_here\n", r"failed to import: ModuleNotFoundError: No module named 'no_such_module_here' "
                                     r"\(.*broken\.py, line 1\)"),
    ("x = 1\ny = undefined_name\n",
     r"failed to import: NameError: name 'undefined_name' is not defined \(.*, line 2\)"),
    ("def f(:\n", r"failed to import: SyntaxError: .*\(.*broken\.py, line 1\)"),
    ("x = 1\n", r"registers nothing: a plugin defines a method, model, data set, partition, client selection or "
                r"aggregation and registers it"),
    (plugin_method("fedavg"), r"algorithm 'fedavg' is registered twice: by mpifed\.algorithms\.fedavg\.FedAvg"),
    (plugin_method("plug_bad").replace("def loss(self, ctx, batch, out)", "def loss(self, batch, out)"),
     r"PenaltyClient\.loss\(self, batch, out\) cannot be called as the round calls it: loss\(self, ctx, batch, out\)"),
    ("from mpifed.registry import ALGORITHMS\n@ALGORITHMS.register('plug_thing')\nclass Thing:\n    pass\n",
     r"algorithm 'plug_thing' \(Thing\) has no Options dataclass"),
    ("from mpifed.options import NoOptions\nfrom mpifed.registry import ALGORITHMS\n"
     "@ALGORITHMS.register('plug_thing')\nclass Thing:\n    Options = NoOptions\n",
     r"'plug_thing' \(Thing\): is not a subclass of mpifed\.algorithms\.base\.Algorithm"),
    ("from mpifed.options import NoOptions\nfrom mpifed.registry import MODELS\n"
     "@MODELS.register('plug_net')\nclass Net:\n    Options = "
     "NoOptions\n", r"model 'plug_net' \(Net\) has no build\(\)"),
])
def test_a_broken_plugin_is_one_message_and_leaves_nothing_registered(tmp_path, source, message):
    f = write(tmp_path / "broken.py", source)
    before = {r.kind: r.names() for r in (ALGORITHMS, MODELS)}
    with pytest.raises(plugins.PluginError, match=message) as e:
        plugins.load(str(f))
    assert str(f) in str(e.value)
    assert {r.kind: r.names() for r in (ALGORITHMS, MODELS)} == before
    assert not [m for m in sys.modules if m.startswith("mpifed_plugin_broken")]
    f.write_text(method("plug_fixed"))                                  # fixed, it loads
    assert plugins.load(str(f)).provides == [("algorithm", "plug_fixed")]


def test_a_missing_file_or_module_is_named(tmp_path):
    with pytest.raises(plugins.PluginError, match=r"nothere\.py does not exist"):
        plugins.load(str(tmp_path / "nothere.py"))
    with pytest.raises(plugins.PluginError, match=r"plugin module nolab\.methods cannot be found: no module named "
                                                  r"'nolab'"):
        plugins.load("nolab.methods")


def test_a_module_plugin_is_its_whole_package_with_its_helpers(tmp_path, monkeypatch):
    write(tmp_path / "mylab" / "__init__.py", "")
    write(tmp_path / "mylab" / "helpers.py", "PENALTY = 0.5\n")
    write(tmp_path / "mylab" / "methods.py", method().replace("0.05", "__import__('mylab.helpers').helpers.PENALTY"))
    monkeypatch.syspath_prepend(str(tmp_path))
    p = plugins.load("mylab.methods")
    assert p.kind == "module" and p.files == ("mylab/__init__.py", "mylab/helpers.py", "mylab/methods.py")
    sha = p.sha256
    plugins.unload(p)
    (tmp_path / "mylab" / "helpers.py").write_text("PENALTY = 0.25\n")   # a helper changed: the plugin's code changed
    assert plugins.load("mylab.methods").sha256 != sha


def test_configs_name_plugins_relative_to_themselves_and_their_bases_add_up(tmp_path):
    write(tmp_path / "code" / "a.py", method("plug_a"))
    write(tmp_path / "code" / "b.py", method("plug_b"))
    write(tmp_path / "conf" / "base.yaml", "plugins: [../code/a.py]\n")
    top = write(tmp_path / "conf" / "sub" / "top.yaml", "base: ../base.yaml\nplugins: ../../code/b.py\n"
                                                         "algorithm: {name: plug_b, penalty: 0.2}\n")
    cfg, d = config.load([str(top)])
    assert d["plugins"] == [str(tmp_path / "code" / "a.py"), str(tmp_path / "code" / "b.py")]
    assert cfg.algorithm.options.penalty == 0.2
    assert d["code"] == {"algorithm": plugins.provider("algorithm", "plug_b").sha256, "model": None, "dataset": None,
                         "partition": None, "selection": None, "aggregation": None}
    assert config.load([])[1]["code"] == {"algorithm": None, "model": None, "dataset": None, "partition": None,
                                          "selection": None, "aggregation": None}


def test_code_is_recorded_not_set(tmp_path):
    with pytest.raises(config.ConfigError, match="'code' is recorded by mpifed"):
        config.load([], ["code.algorithm=abc"])
    bad = write(tmp_path / "c.yaml", "code: {algorithm: abc}\n")
    with pytest.raises(config.ConfigError, match=f"{bad}: 'code' is recorded by mpifed"):
        config.load([str(bad)])
    with pytest.raises(config.ConfigError, match=r"plugins must be a list of Python files or modules"):
        config.load([str(write(tmp_path / "d.yaml", "plugins: {a: 1}\n"))])


def test_a_changed_plugin_is_a_changed_setting(tmp_path):
    f = write(tmp_path / "mine.py", method())
    _, first = config.load([], ["algorithm.name=plug_penalty"], plugins=[str(f)])
    f.write_text(method() + "\n# a change\n")
    _, second = config.load([], ["algorithm.name=plug_penalty"], plugins=[str(f)])
    assert config.diff_keys(config.result_fingerprint(first), config.result_fingerprint(second)) == ["code.algorithm"]


SCHEDULED = """
from mpifed.algorithms.base import Algorithm
from mpifed.registry import ALGORITHMS


@ALGORITHMS.register("NAME")
class Ramped(Algorithm):
    \"\"\"A weight that ramps up over train.rounds: the rounds change its numbers.\"\"\"
    depends_on = DEPENDS
"""


def test_a_methods_declared_dependencies_enter_the_runs_identity(tmp_path):
    f = write(tmp_path / "ramped.py", SCHEDULED.replace("NAME", "ramped").replace("DEPENDS", '("train.rounds",)'))
    _, four = config.load([], ["algorithm.name=ramped", "train.rounds=4"], plugins=[str(f)])
    _, six = config.load([], ["algorithm.name=ramped", "train.rounds=6"], plugins=[str(f)])
    assert config.checkpoint_changes(config.math_fingerprint(four), six)[0] == ["train.rounds"]   # a resume refuses
    _, fedavg = config.load([], ["train.rounds=4"])
    assert config.checkpoint_changes(config.math_fingerprint(fedavg), {**fedavg, "train": {**fedavg["train"],
                                                                                          "rounds": 6}})[0] == []


def test_a_declared_dependency_must_be_a_config_key(tmp_path):
    f = write(tmp_path / "typo.py", SCHEDULED.replace("NAME", "typo").replace("DEPENDS", '("train.round",)'))
    with pytest.raises(config.ConfigError, match="'typo' declares that its numbers depend on 'train.round', which is "
                                                 "not a config key"):
        config.load([], ["algorithm.name=typo"], plugins=[str(f)])
    bad = write(tmp_path / "bad.py", SCHEDULED.replace("NAME", "bad_depends").replace("DEPENDS", '"train.rounds"'))
    with pytest.raises(plugins.PluginError, match="depends_on is 'train.rounds'; it names the settings"):
        plugins.load(str(bad))


def test_a_checkpoint_from_before_runs_recorded_their_code_resumes_with_the_code_loaded_now(tmp_path):
    f = write(tmp_path / "mine.py", method())
    _, d = config.load([], ["algorithm.name=plug_penalty"], plugins=[str(f)])
    stored = config.math_fingerprint(d)
    del stored["code"]
    assert config.checkpoint_changes(stored, d) == ([], ["code"])


def test_a_runs_copy_of_its_plugin_is_used_when_the_file_is_gone_and_checked_first(tmp_path):
    f = write(tmp_path / "code" / "mine.py", method())
    run = tmp_path / "run"
    run.mkdir()
    p = plugins.load(str(f))
    records = plugins.keep_copies(run, [("algorithm", "plug_penalty")])
    assert [(r["used"], r["copy"]) for r in records if r["sha256"] == p.sha256] == [
        (True, f"plugins/mine-{p.sha256[:12]}")]
    mine = [r for r in records if r["sha256"] == p.sha256]
    plugins.unload(p)
    f.unlink()
    with pytest.raises(plugins.UntrustedCode, match=r"the run was made with code from outside mpifed, which mpifed "
                                                    r"runs only when you say so: plugin .*mine\.py \(SHA-256 .*; its "
                                                    r"copy: .*plugins/mine-.*/mine\.py\. Nothing of it was loaded"):
        plugins.restore(mine, run, "the run", changed="refuse")
    assert "plug_penalty" not in ALGORITHMS
    restored = plugins.restore(mine, run, "the run", changed="refuse", trust=True)   # the file is gone: the copy
    assert [r.sha256 for r in restored] == [p.sha256] and "plug_penalty" in ALGORITHMS and restored[0].from_run
    plugins.unload(restored[0])
    copy = run / mine[0]["copy"] / "mine.py"
    copy.write_text(method() + "# edited in the run's folder\n")
    with pytest.raises(plugins.PluginError, match=r"the run's copy of plugin .*mine\.py in .* was altered"):
        plugins.restore(mine, run, "the run", changed="refuse", trust=True)
    copy.unlink()
    with pytest.raises(plugins.PluginError, match=r"the run's copy of plugin .*mine\.py is missing"):
        plugins.restore(mine, run, "the run", changed="refuse", trust=True)
    assert "plug_penalty" not in ALGORITHMS


def test_a_restored_run_refuses_another_plugin_under_its_names(tmp_path):
    f = write(tmp_path / "a" / "mine.py", method())
    run = tmp_path / "run"
    run.mkdir()
    p = plugins.load(str(f))
    mine = [r for r in plugins.keep_copies(run, [("algorithm", "plug_penalty")]) if r["sha256"] == p.sha256]
    plugins.unload(p)
    plugins.load(str(write(tmp_path / "b" / "other.py", method() + "# another file, the same name\n")))
    for trust in (False, True):
        with pytest.raises(plugins.PluginError, match=r"was made with plugin .*a/mine\.py .* but this process has "
                                                      r"plugin .*b/other\.py"):
            plugins.restore(mine, run, "the run", changed="refuse", trust=trust)


def recorded_run(tmp_path, source=None):
    """A run folder (``tmp_path/run``) whose provenance records the plugin file ``source`` (default
    :func:`method`), copied as a run keeps it; the plugin is unloaded again. Returns (records, run)."""
    f = write(tmp_path / "code" / "mine.py", source or method())
    run = tmp_path / "run"
    run.mkdir()
    p = plugins.load(str(f))
    records = [r for r in plugins.keep_copies(run, [("algorithm", "plug_penalty")]) if r["sha256"] == p.sha256]
    plugins.unload(p)
    return records, run


MARKER = "import pathlib\npathlib.Path(__file__).with_name('ran').write_text('ran')\n"


def test_code_loaded_already_by_its_hash_is_taken_without_trust(tmp_path):
    records, run = recorded_run(tmp_path)
    given = plugins.load(str(tmp_path / "code" / "mine.py"))   # --plugin, a plugins: entry or an entry point
    assert plugins.restore(records, run, "the run", changed="refuse") == [given]
    assert not given.from_run


def test_a_recorded_origin_anywhere_runs_nothing_without_trust(tmp_path):
    evil = write(tmp_path / "elsewhere" / "evil.py", MARKER + method("plug_evil"))
    records, run = recorded_run(tmp_path)
    crafted = [{**records[0], "origin": str(evil), "sha256": hashlib.sha256(evil.read_bytes()).hexdigest(),
                "files": ["evil.py"], "provides": ["algorithm plug_evil"], "copy": None}]
    for changed in ("refuse", "copy"):
        with pytest.raises(plugins.UntrustedCode, match=rf"plugin {evil} \(SHA-256 .*, for algorithm plug_evil\); "
                                                        r"the run keeps no copy of it\. Nothing of it was loaded"):
            plugins.restore(crafted, run, "the run", changed=changed)
    assert not (evil.parent / "ran").exists() and "plug_evil" not in ALGORITHMS


@pytest.mark.parametrize("copy", ["../elsewhere", "/ABS", "plugins/../../elsewhere", "plugins/x/y", "plugins",
                                  "plugins/.", "link", "file-link"])
def test_a_recorded_copy_outside_the_runs_plugins_folder_or_through_a_link_is_refused_in_every_case(tmp_path, copy):
    records, run = recorded_run(tmp_path)
    evil = write(tmp_path / "elsewhere" / "mine.py", MARKER + method())
    crafted = {**records[0], "sha256": hashlib.sha256(evil.read_bytes()).hexdigest(), "copy": copy}
    if copy == "/ABS":
        crafted["copy"] = str(evil.parent)
    elif copy == "link":   # the run's own folder name, made a link to code elsewhere
        own = run / records[0]["copy"]
        for f in own.iterdir():
            f.unlink()
        own.rmdir()
        own.symlink_to(evil.parent)
        crafted["copy"] = records[0]["copy"]
    elif copy == "file-link":
        own = run / records[0]["copy"] / "mine.py"
        own.unlink()
        own.symlink_to(evil)
        crafted["copy"] = records[0]["copy"]
    (tmp_path / "code" / "mine.py").unlink()   # the origin gone: only the copy could be loaded
    for trust in (False, True):
        with pytest.raises(plugins.PluginError, match=r"the run: its provenance\.json records a plugin whose copy is "
                                                      r".*; mpifed refuses that record in every case"):
            plugins.restore([crafted], run, "the run", changed="copy", trust=trust)
    assert not (evil.parent / "ran").exists() and "plug_penalty" not in ALGORITHMS


@pytest.mark.parametrize("field,value,said", [
    ("kind", "script", "of an unknown kind"), ("sha256", "0" * 12, "without a SHA-256"),
    ("module", "os; import x", "whose module is not a module name"),
    ("files", ["../../evil.py"], "with files that are not its own source files"),
    ("files", ["sub/mine.py"], "with files that are not its own source files"),
    ("provides", "algorithm x", "whose entries are not"),
])
def test_a_malformed_plugin_record_is_refused_before_anything_is_read(tmp_path, field, value, said):
    records, run = recorded_run(tmp_path)
    with pytest.raises(plugins.PluginError, match=f"records a plugin {said}"):
        plugins.restore([{**records[0], field: value}], run, "the run", changed="copy", trust=True)


def test_a_runs_stored_config_is_read_without_its_plugins_code(tmp_path):
    f = write(tmp_path / "mine.py", method())
    _, d = config.load([], ["algorithm.name=plug_penalty", "algorithm.penalty=0.25"], plugins=[str(f)])
    loaded = config.result_fingerprint(config.recorded(d).to_dict())
    assert loaded == config.result_fingerprint(d)
    plugins.unload(plugins.provider("algorithm", "plug_penalty"))
    cfg = config.recorded(d)    # the plugin is not loaded: its entry by name, its options as recorded
    assert cfg.algorithm.name == "plug_penalty" and cfg.algorithm.options == {"penalty": 0.25}
    assert config.result_fingerprint(cfg.to_dict()) == loaded
    with pytest.raises(config.ConfigError, match="unknown algorithm 'plug_penalty'"):
        config.recorded({**d, "code": {**d["code"], "algorithm": None}})   # mpifed's own: checked as ever


def test_a_resume_command_gives_the_code_again_as_the_run_was_given_it(tmp_path):
    from mpifed.entry.main import code_words
    f = write(tmp_path / "mine.py", method())
    cfg, _ = config.load([], ["algorithm.name=plug_penalty"], plugins=[str(f)])
    assert code_words(cfg) == ("--plugin", str(f))
    assert code_words(config.load([], [])[0]) == ()     # mpifed's own method: nothing to give
    plugins.provider("algorithm", "plug_penalty").from_run = True
    assert code_words(cfg) == ("--trust-run-code",)


def test_a_hook_that_still_takes_rnd_is_refused_when_loaded(tmp_path):
    old = write(tmp_path / "old.py", method("plug_old").replace(
        "class PenaltyClient(Client):\n", "class PenaltyClient(Client):\n    def round_start(self, rnd, down):\n"
                                          "        pass\n\n"))
    with pytest.raises(plugins.PluginError, match=r"PenaltyClient\.round_start takes rnd, the round counted from 0; "
                                                  r"the round now calls round_start\(server_round, down\) with "
                                                  r"server_round, counted from 1"):
        plugins.load(str(old))
    assert "plug_old" not in ALGORITHMS


def package_form(tmp_path, source, monkeypatch, init=""):
    """The package ``mylab`` (``mylab/methods.py`` holding ``source``, ``mylab/__init__.py`` holding
    ``init``) on the path, as ``pip install`` of a file's code as a package would place it."""
    write(tmp_path / "pkg" / "mylab" / "__init__.py", init)
    write(tmp_path / "pkg" / "mylab" / "methods.py", source)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    return tmp_path / "pkg" / "mylab"


def test_a_file_and_the_package_that_holds_it_are_one_code_with_one_hash(tmp_path, monkeypatch):
    f = write(tmp_path / "mine.py", method())
    package_form(tmp_path, method(), monkeypatch)
    as_file = plugins.load(str(f))
    assert as_file.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    assert plugins.load("mylab.methods") is as_file                    # not registered twice
    plugins.unload(as_file)
    as_package = plugins.load("mylab.methods")
    assert as_package.sha256 == as_file.sha256 and plugins.load(str(f)) is as_package
    (tmp_path / "pkg" / "mylab" / "__init__.py").write_text('"""Now it says something."""\n')
    plugins.unload(as_package)
    assert plugins.load("mylab.methods").sha256 != as_file.sha256      # a non-blank file is code


def test_the_content_hash_ignores_names_and_blank_files_but_not_content():
    one = {"a.py": b"x = 1\n"}
    assert plugins.content_sha(one) == hashlib.sha256(b"x = 1\n").hexdigest()
    assert plugins.content_sha({"p/__init__.py": b"", "p/b.py": b"x = 1\n", "p/c.py": b"\n  \n"}) == \
        plugins.content_sha(one)
    two = {"a.py": b"x = 1\n", "b.py": b"y = 2\n"}
    assert plugins.content_sha(two) == plugins.content_sha({"q/z.py": b"y = 2\n", "q/y.py": b"x = 1\n"})
    assert plugins.content_sha(two) not in (plugins.content_sha(one), plugins.content_sha({"a.py": b"y = 2\n"}))


def archived_package_run(tmp_path, monkeypatch):
    """A run folder made by an older mpifed with the package form of :func:`method` (its helper a
    second file): provenance and config record the package hashed by its paths. Returns (records,
    run, the config dict, the old hash)."""
    source = method().replace("0.05", "__import__('mylab.helpers').helpers.PENALTY")
    folder = package_form(tmp_path, source, monkeypatch)
    write(folder / "helpers.py", "PENALTY = 0.05\n")
    p = plugins.load("mylab.methods")
    run = tmp_path / "run"
    run.mkdir()
    records = [r for r in plugins.keep_copies(run, [("algorithm", "plug_penalty")]) if r["sha256"] == p.sha256]
    old = plugins.legacy_shas("module", p.sources).pop()
    assert old != p.sha256
    _, d = config.load([], ["algorithm.name=plug_penalty"], plugins=["mylab.methods"])
    plugins.unload(p)
    plugins._aliases.pop(old)            # a fresh process: nothing known of the old hash yet
    records = [{**r, "sha256": old} for r in records]
    return records, run, {**d, "code": {**d["code"], "algorithm": old}}, old


def test_a_run_recorded_with_a_packages_older_hash_resumes_and_matches_the_same_code(tmp_path, monkeypatch):
    records, run, stored, old = archived_package_run(tmp_path, monkeypatch)
    given = plugins.load("mylab.methods")
    assert old in given.aliases and plugins.canonical(old) == given.sha256
    assert plugins.restore(records, run, "the run", changed="refuse") == [given]     # no trust needed: the same code
    _, now = config.load([], ["algorithm.name=plug_penalty"], plugins=["mylab.methods"])
    assert config.checkpoint_changes(config.math_fingerprint(stored), now) == ([], [])
    assert config.result_fingerprint(config.recorded(stored).to_dict()) == config.result_fingerprint(now)


def test_an_older_hash_is_learned_from_the_runs_copy_without_running_it(tmp_path, monkeypatch):
    records, run, stored, old = archived_package_run(tmp_path, monkeypatch)
    assert plugins.canonical(old) == old
    plugins.learn_aliases(records, run)
    assert plugins.canonical(old) == plugins.content_sha(
        {f: (run / records[0]["copy"] / f).read_bytes() for f in records[0]["files"]})
    assert "plug_penalty" not in ALGORITHMS and "mylab.methods" not in sys.modules
    restored = plugins.restore(records, run, "the run", changed="copy", trust=True)   # the old hash checks the copy
    assert [p.sha256 for p in restored] == [plugins.canonical(old)] and "plug_penalty" in ALGORITHMS


def test_other_code_from_an_installed_package_under_a_runs_names_says_how_to_leave_it_out(tmp_path, monkeypatch):
    records, run = recorded_run(tmp_path)
    write(tmp_path / "pkg" / "otherlab" / "__init__.py", method() + "# another version\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    installed = plugins.load("otherlab")
    installed.kind = "entry point"                       # as load_installed finds an installed package
    with pytest.raises(plugins.PluginError, match=r"the code differs\. Set MPIFED_DISABLE_PLUGIN_AUTOLOAD=1 so that "
                                                  r"the installed package is not loaded"):
        plugins.restore(records, run, "the run", changed="copy", trust=True)
