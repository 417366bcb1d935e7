import copy
import subprocess
import sys

import pytest
import yaml

from mpifed.settings import config
from mpifed.settings.config import ConfigError


def test_defaults_are_the_quick_start():
    cfg, d = config.load()
    assert cfg.data.dataset.name == "digits" and cfg.algorithm.name == "fedavg"
    assert cfg.data.num_clients == 10 and cfg.data.partition.name == "dirichlet"
    assert d["data"]["partition"] == {"name": "dirichlet", "beta": 0.5, "min_size": 10, "balance": True,
                                      "max_tries": 10000}


def test_yaml_then_overrides(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("train:\n  rounds: 7\n  lr: 1e-3\ndata:\n  partition: {name: shards, shards_per_client: 3}\n")
    cfg, _ = config.load([str(f)], ["train.rounds=9", "data.partition.shards_per_client=4"])
    assert cfg.train.rounds == 9
    assert cfg.train.lr == pytest.approx(1e-3)  # PyYAML reads 1e-3 as a string; it is accepted as a number
    assert cfg.data.partition.name == "shards" and cfg.data.partition.options.shards_per_client == 4


def test_unknown_key_suggests_the_nearest(tmp_path):
    with pytest.raises(ConfigError) as e:
        config.load(overrides=["train.lokal_epochs=3"])
    assert "train.lokal_epochs" in str(e.value) and "did you mean 'train.local_epochs'" in str(e.value)


def test_unknown_algorithm_lists_known_ones():
    with pytest.raises(ConfigError) as e:
        config.load(overrides=["algorithm.name=fedavgg"])
    msg = str(e.value)
    assert "algorithm.name" in msg and "Did you mean 'fedavg'" in msg and "fedavg" in msg


@pytest.mark.parametrize("given, meant", [("FedNTD", "fedntd"), ("FedGKD+", "fedgkd_plus"),
                                         ("FedGKD-VOTE", "fedgkd_vote"), ("MOON", "moon")])
def test_a_method_written_as_the_papers_write_it_gets_its_name_suggested(given, meant):
    with pytest.raises(ConfigError) as e:
        config.load(overrides=[f"algorithm.name={given}"])
    assert f"Did you mean '{meant}'" in str(e.value)


def test_skipping_the_test_set_needs_a_validation_set_and_no_test_accuracy_target():
    with pytest.raises(ConfigError) as e:
        config.load(overrides=["run.eval_test=false", "run.rounds_to=[0.5]"])
    msg = str(e.value)
    assert "run.eval_test: false evaluates only the validation set, and data.val_size is 0" in msg
    assert "run.rounds_to: the rounds to a test accuracy need the test set, and run.eval_test is false" in msg
    cfg, d = config.load(overrides=["run.eval_test=false", "data.val_size=100"])
    assert not cfg.run.eval_test and config.result_fingerprint(d) == config.result_fingerprint(config.load(
        overrides=["data.val_size=100"])[1])                   # not part of what a run's numbers depend on


def test_wrong_type_and_range_name_the_key():
    with pytest.raises(ConfigError) as e:
        config.load(overrides=["train.rounds=many", "train.participation=1.5", "run.seed=-1"])
    msg = str(e.value)
    assert "train.rounds: expected an integer, got 'many'" in msg
    assert "train.participation: 1.5 is out of range; it must be > 0 and <= 1" in msg
    assert "run.seed: -1 is out of range" in msg


@pytest.mark.parametrize("key", ["train.participation", "train.lr", "comm.timeout_s", "algorithm.mu"])
@pytest.mark.parametrize("value", ["nan", ".inf", "-inf"])
def test_non_finite_numbers_are_rejected(key, value):
    overrides = ["algorithm.name=fedcsd"] if key.startswith("algorithm.") else []
    with pytest.raises(ConfigError, match=f"{key}: expected a finite number"):
        config.load(overrides=overrides + [f"{key}={value}"])


def test_options_of_another_choice_are_rejected():
    with pytest.raises(ConfigError) as e:
        config.load(overrides=["data.partition.name=iid", "data.partition.beta=0.1"])
    assert "data.partition.beta: unknown key" in str(e.value)


def test_a_bad_key_in_a_file_names_the_file_and_line_where_it_is_set(tmp_path):
    (tmp_path / "base.yaml").write_text("train:\n  rounds: 3\n  lrr: 0.1\n")
    (tmp_path / "x.yaml").write_text("base: base.yaml\ndata:\n  num_clients: 5\ntrain:\n  batch_sise: 8\n"
                                     "  local_epochs: 0\n")
    with pytest.raises(ConfigError) as e:
        config.load([str(tmp_path / "x.yaml")], ["train.momentm=0.5"])
    text = str(e.value)
    assert f"train.lrr ({tmp_path / 'base.yaml'}, line 3): unknown key; did you mean 'train.lr'?" in text
    assert f"train.batch_sise ({tmp_path / 'x.yaml'}, line 5): unknown key" in text
    assert f"train.local_epochs ({tmp_path / 'x.yaml'}, line 6): 0 is out of range" in text
    assert "train.momentm: unknown key" in text                       # the command line's: the key is enough
    with pytest.raises(ConfigError) as e:                             # the command line's value replaces the file's
        config.load([str(tmp_path / "x.yaml")], ["train.batch_sise=4", "train.lrr=1"])
    assert "train.batch_sise: unknown key" in str(e.value) and "x.yaml, line 5" not in str(e.value)


def test_switching_a_choice_drops_the_old_options(tmp_path):
    f = tmp_path / "base.yaml"
    f.write_text("data:\n  partition: {name: dirichlet, beta: 0.1}\n")
    cfg, _ = config.load([str(f)], ["data.partition=iid"])
    assert cfg.data.partition.name == "iid"


def test_base_inheritance(tmp_path):
    (tmp_path / "a.yaml").write_text("train: {rounds: 3, lr: 0.5}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\ntrain: {rounds: 4}\n")
    cfg, _ = config.load([str(tmp_path / "b.yaml")])
    assert (cfg.train.rounds, cfg.train.lr) == (4, 0.5)


def test_malformed_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [rounds: 3\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load([str(bad)])
    with pytest.raises(ConfigError, match="does not exist"):
        config.load([str(tmp_path / "nope.yaml")])
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        config.load([str(top)])


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="key.path=value"):
        config.load(overrides=["train.rounds"])


def test_participation_that_samples_nobody():
    with pytest.raises(ConfigError, match="samples no client"):
        config.load(overrides=["train.participation=0.01"])


def test_algorithm_needing_server_data_says_how():
    with pytest.raises(ConfigError, match="data.server_holdout_per_class"):
        config.load(overrides=["algorithm.name=fedcad"])


def test_any_chosen_entry_checks_the_rest_of_the_config(tmp_path):
    """A model, data set or partition may define check_config(cfg), like an algorithm."""
    (tmp_path / "picky_model.py").write_text(
        "from mpifed.models.cnn import DigitsCNN\n"
        "from mpifed.registry import MODELS\n\n\n"
        "@MODELS.register('picky_cnn')\n"
        "class Picky(DigitsCNN):\n"
        "    @staticmethod\n"
        "    def check_config(cfg):\n"
        "        return [] if cfg.train.batch_size <= 8 else ['train.batch_size: picky_cnn takes at most 8']\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import picky_model; from mpifed import config\n"
            "config.load(overrides=['model.name=picky_cnn', 'train.batch_size=8'])\n"
            "try:\n    config.load(overrides=['model.name=picky_cnn'])\n"
            "except config.ConfigError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert "train.batch_size: picky_cnn takes at most 8" in out


def test_math_fingerprint_ignores_bookkeeping():
    _, a = config.load()
    _, b = config.load(overrides=["train.rounds=99", "run.eval_every=5", "run.checkpoint_every=3"])
    _, c = config.load(overrides=["train.lr=0.3"])
    assert config.diff_keys(config.math_fingerprint(a), config.math_fingerprint(b)) == []
    assert config.diff_keys(config.math_fingerprint(a), config.math_fingerprint(c)) == ["train.lr"]


def test_checkpoint_predating_a_setting_resumes_at_its_default():
    _, d = config.load(overrides=["algorithm.name=fedntd", "algorithm.tau=3"])
    stored = config.math_fingerprint(d)
    del stored["data"]["max_length"], stored["algorithm"]["beta"]
    assert config.checkpoint_changes(stored, d) == ([], ["algorithm.beta", "data.max_length"])
    _, longer = config.load(overrides=["algorithm.name=fedntd", "algorithm.tau=3", "data.max_length=64"])
    assert config.checkpoint_changes(stored, longer) == (["data.max_length"], ["algorithm.beta", "data.max_length"])
    _, other = config.load(overrides=["algorithm.name=fedntd", "algorithm.tau=1"])
    assert config.checkpoint_changes(stored, other)[0] == ["algorithm.tau"]


def test_checkpoint_predating_a_key_compares_it_with_the_runs_saved_config():
    """resources.threads became part of the math after runs were made with threads 0 (then the
    default): their config.yaml says 0, their checkpoint's math fingerprint nothing."""
    _, d = config.load(overrides=["resources.threads=0"])
    stored = config.math_fingerprint(d)
    del stored["resources"]["threads"]
    assert config.checkpoint_changes(stored, d, saved=d) == ([], ["resources.threads"])
    assert config.checkpoint_changes(stored, d)[0] == ["resources.threads"]          # without it: the default, 1
    _, two = config.load(overrides=["resources.threads=2"])
    assert config.checkpoint_changes(stored, two, saved=d)[0] == ["resources.threads"]


def test_eval_last_is_part_of_a_results_identity_and_older_runs_compare_equal_at_the_defaults(tmp_path):
    from mpifed.tables.table_file import stored_identity
    _, d = config.load()
    _, last = config.load(overrides=["run.eval_last=5"])
    assert config.diff_keys(config.result_fingerprint(d), config.result_fingerprint(last)) == ["run.eval_last"]
    assert config.math_fingerprint(d) == config.math_fingerprint(last)   # a resume may change it
    older = copy.deepcopy(d)   # a run directory written before run.eval_last and data.val_size existed
    del older["run"]["eval_last"], older["data"]["val_size"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(older))
    assert stored_identity(tmp_path) == config.result_fingerprint(d)
    assert config.checkpoint_changes(config.math_fingerprint(older), d) == ([], ["data.val_size"])
    _, val = config.load(overrides=["data.val_size=100"])
    assert config.checkpoint_changes(config.math_fingerprint(older), val)[0] == ["data.val_size"]


def test_checkpoint_with_a_setting_this_version_lacks_is_a_difference():
    _, d = config.load()
    stored = config.math_fingerprint(d)
    stored["train"]["retired_knob"] = 1
    assert config.checkpoint_changes(stored, d) == (["train.retired_knob"], [])


def test_per_algorithm_values_count_as_written_in_their_file(tmp_path):
    (tmp_path / "setting.yaml").write_text("per_algorithm:\n  moon: {algorithm: {mu: 5.0}}\n  fedprox: {algorithm: "
                                           "{mu: 0.1}}\n")
    (tmp_path / "moon.yaml").write_text("algorithm: {name: moon, tau: 0.5}\n")
    (tmp_path / "moon-mu1.yaml").write_text("base: moon.yaml\nalgorithm: {mu: 1.0}\n")
    setting, moon, sweep = (str(tmp_path / f) for f in ("setting.yaml", "moon.yaml", "moon-mu1.yaml"))
    assert config.load([setting, moon])[0].algorithm.options.mu == 5.0          # the setting's value for this method
    assert config.load([setting, sweep])[0].algorithm.options.mu == 1.0         # a later file wins
    assert config.load([sweep, setting])[0].algorithm.options.mu == 5.0         # ... and so does a later setting
    assert config.load([setting, sweep], ["algorithm.mu=2"])[0].algorithm.options.mu == 2.0
    assert config.load([setting], ["algorithm.name=moon"])[0].algorithm.options.mu == 5.0


def test_reference_lists_every_section():
    ref = config.reference()
    for key in ("run.seed", "data.partition", "train.lr_decay", "algorithm", "comm.timeout_s"):
        assert f"`{key}`" in ref


def test_choice_name_applies_before_its_options_within_overrides():
    cfg, _ = config.load(overrides=["data.dataset.train_samples=50", "data.dataset.name=synthetic"])
    assert cfg.data.dataset.name == "synthetic" and cfg.data.dataset.options.train_samples == 50
    cfg, _ = config.load(overrides=["data.partition.k=3", "data.partition=label_k"])
    assert cfg.data.partition.options.k == 3


def test_on_and_off_that_yaml_reads_as_booleans_are_the_words(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("resources: {mps: off, cuda_graphs: on}\n")
    cfg, d = config.load([str(f)], [])
    assert (cfg.resources.mps, cfg.resources.cuda_graphs) == ("off", "on") and d["resources"]["mps"] == "off"
    cfg, _ = config.load([], ["resources.mps=on", "resources.cuda_graphs=off", "resources.precision=bf16"])
    assert (cfg.resources.mps, cfg.resources.cuda_graphs, cfg.resources.precision) == ("on", "off", "bf16")
    with pytest.raises(ConfigError, match="resources.mps: 'sometimes' is not allowed"):
        config.load([], ["resources.mps=sometimes"])
    with pytest.raises(ConfigError, match="resources.precision: True is not allowed"):
        config.load([], ["resources.precision=on"])


def test_a_config_file_is_read_afresh_each_time(tmp_path):
    """config files are parsed once per text: a changed file is read again, and changing what
    read_yaml returned changes nothing for the next reader."""
    f = tmp_path / "c.yaml"
    f.write_text("train: {rounds: 3}\n")
    assert config.load([str(f)])[0].train.rounds == 3
    config.read_yaml(f)["train"]["rounds"] = 9
    assert config.read_yaml(f)["train"]["rounds"] == 3
    f.write_text("train: {rounds: 4}\n")
    assert config.load([str(f)])[0].train.rounds == 4


def test_mpifed_config_names_the_objects_of_the_modules_that_do_each_job():
    """``mpifed.config`` names the config's interface; each name is the object of the module that does its job."""
    from mpifed import config as public
    from mpifed.local.train_config import TrainConfig
    from mpifed.settings import fingerprint, schema, validate
    assert public.TrainConfig is TrainConfig and public.Config is schema.Config
    assert public.build is validate.build and public.math_fingerprint is fingerprint.math_fingerprint
    assert all(hasattr(public, name) for name in config.__all__)
    assert schema.Config.__dataclass_fields__["train"].default_factory is TrainConfig
