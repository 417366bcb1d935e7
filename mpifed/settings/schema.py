"""The config's schema: its sections as dataclasses, with each key's type, default, range and help.

A configuration is a tree of dataclasses (a dataclass may define ``check() -> list[str]`` for rules
between its own keys). Some sections are *choices*: a ``name`` picks an entry of a registry (an
algorithm, a partition, a data set, a model) and the remaining keys are that entry's own options,
an ``Options`` dataclass (made with :mod:`mpifed.plugin.options`). :class:`Config` is the whole
tree: a new section is a dataclass (in the module of what it configures) and one field here.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from mpifed.local.train_config import TrainConfig
from mpifed.plugin.options import NoOptions, opt
from mpifed.plugin.registry import (AGGREGATIONS, ALGORITHMS, DATASETS, MODELS, PARTITIONS, SELECTORS,
                                    SERVER_OPTIMIZERS, Registry)
from mpifed.settings.system import SystemConfig


@dataclass
class Choice:
    """A registry entry picked by name, with that entry's validated options."""

    name: str
    options: Any = field(default_factory=NoOptions)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **to_dict(self.options)}


def section(cls: type, help: str) -> Any:
    """A nested config section (a dataclass), built when the config is."""
    return field(default_factory=cls, metadata={"help": help, "math": True})


def choice(registry: Callable[[], dict[str, type]], default: str, help: str,
           math: bool = True, **default_options: Any) -> Any:
    """A config field holding a :class:`Choice` from ``registry()`` (name -> Options)."""
    meta = {"help": help, "registry": registry, "math": math}

    def make() -> Choice:
        return Choice(default, registry()[default](**default_options))

    return field(default_factory=make, metadata=meta)


def _options_of(registry: Registry) -> Callable[[], dict[str, type]]:
    def options() -> dict[str, type]:
        return {name: entry.Options for name, entry in registry.items().items()}
    return options


_algorithms = _options_of(ALGORITHMS)
_partitions = _options_of(PARTITIONS)
_datasets = _options_of(DATASETS)
_models = _options_of(MODELS)
_server_optimizers = _options_of(SERVER_OPTIMIZERS)
_selectors = _options_of(SELECTORS)
_aggregations = _options_of(AGGREGATIONS)


@dataclass
class RunConfig:
    name: str | None = opt(None, "run directory name under run.root; default: <config stem>-<date>-<time> (-2, -3, ... "
                                 "when taken)", math=False)
    root: str = opt("runs", "folder that holds the run directories", math=False)
    label: str | None = opt(None, "the run's name in figures and reports of folders of runs (the same label on "
                                  "every seed of a method; default: the run's name without its seed)", math=False)
    seed: int = opt(0, "seed of model initialisation, client sampling and local training", min=0, max=2**63 - 1)
    eval_every: int = opt(1, "evaluate the global model on the test set (and the validation set, data.val_size) every "
                             "this many rounds (and after the last)", min=1, math=False)
    eval_last: int = opt(0, "also evaluate every one of the last N rounds (a mean over the last evaluations at little "
                            "cost); does not change training", min=0, math=False)
    eval_test: bool = opt(True, "evaluate the test set at each evaluation; false: the validation set only "
                                "(data.val_size), as a table's search runs do, which choose on validation and report "
                                "nothing", math=False)
    checkpoint_every: int = opt(10, "write a checkpoint every this many rounds (0: only when "
                                    "stopped and at the end)", min=0, math=False)
    keep_checkpoints: int = opt(2, "how many checkpoints to keep", min=1, math=False)
    save_model: bool = opt(True, "write the final global model to model.pt", math=False)
    tensorboard: bool = opt(False, "also write TensorBoard event files (runs/<name>/tensorboard/) from the metrics "
                                   "rows; needs pip install 'mpifed[tensorboard]'", math=False)
    mlflow: bool = opt(False, "also track the run in MLflow: the resolved config as parameters, each round's metrics, "
                              "the summary as an artifact (mpifed report --mlflow adds the figures); needs pip install "
                              "'mpifed[mlflow]'", math=False)
    mlflow_uri: str | None = opt(None, "MLflow tracking URI (http://server:5000, sqlite:///mlflow.db, file:/path); "
                                       "null: $MLFLOW_TRACKING_URI where set, else a file store in <run.root>/mlruns, "
                                       "beside the run directories", math=False)
    mlflow_experiment: str | None = opt(None, "MLflow experiment name; null: run.group", math=False)
    wandb: bool = opt(False, "also track the run in Weights & Biases: the resolved config, each round's metrics, the "
                             "summary; W&B's own settings apply (WANDB_MODE=offline writes the run to disk for a later "
                             "wandb sync); needs pip install 'mpifed[wandb]'", math=False)
    wandb_project: str = opt("mpifed", "W&B project", math=False)
    wandb_entity: str | None = opt(None, "W&B entity (team or user); null: W&B's default for the login", math=False)
    group: str | None = opt(None, "what the run belongs to, for the trackers (MLflow's experiment, W&B's group): a "
                                  "table's runs get <folder>-<table> (its search runs <folder>-<table>-tuning), a "
                                  "sweep's its folder; null: the config file's name without .yaml", math=False)
    rounds_to: list[float] = opt([], "targets (fractions of test accuracy, e.g. [0.65, 0.9]) whose T(target), the "
                                     "first evaluated round that reaches it, summary.json records under "
                                     "rounds_to", math=False)

    def check(self) -> list[str]:
        return [f"rounds_to: {t!r} is not a fraction in (0, 1]; write 65% "
                "as 0.65" for t in self.rounds_to if not 0 < t <= 1]


@dataclass
class ResourcesConfig:
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "workers' device: cuda:(local worker index % GPUs on the "
                                                         "node) when GPUs are visible (auto), or forced", math=False)
    server_device: Literal["cpu", "cuda"] = opt("cpu", "the server's device (cuda means the node's first "
                                                       "visible GPU)", math=False)
    threads: int = opt(1, "torch threads per rank, the same in every mode (debug, any rank count). On the CPU the "
                          "count changes a run's numbers (how sums are split), so it is part of a run's identity; 0: "
                          "the node's cores divided by its ranks (then the numbers depend on the machine and the rank "
                          "count)", min=0)
    cache_mb: int = opt(2048, "per-worker memory budget for decoded client data (least recently "
                              "used evicted)", min=1, math=False)
    deterministic: bool = opt(False, "bit-reproducible GPU runs: deterministic torch algorithms (slower); CPU runs are "
                                     "always reproducible", math=False)
    client_state_mb: int = opt(1024, "per-worker memory for per-client state (MOON's previous models, SCAFFOLD's "
                                     "controls); what does not fit is kept on disk in the run "
                                     "directory", min=0, math=False)
    mps: Literal["auto", "on", "off"] = opt("auto", "CUDA MPS control daemon for the job, started and stopped by the "
                                                    "launcher (mpifed launch, launch/local.sh) and "
                                                    "slurm/gpu-node.sbatch: auto (when two or more ranks share a GPU "
                                                    "and nvidia-cuda-mps-control exists), on (whenever ranks use a "
                                                    "GPU), off; a daemon already running is used", math=False)
    cuda_graphs: Literal["auto", "on", "off"] = opt("off", "capture each GPU worker's full-batch local step as a CUDA "
                                                           "graph and replay it: auto (on GPU workers, eager on the "
                                                           "CPU), on (a CPU worker is an error), off; a method that "
                                                           "cannot be captured says so and runs eagerly", math=False)
    precision: Literal["fp32", "tf32", "bf16"] = opt("fp32", "local training arithmetic: fp32 (PyTorch's defaults), "
                                                             "tf32 (CUDA matmuls in TF32 too), bf16 (forward and loss "
                                                             "under bfloat16 autocast; weights, gradients, optimiser "
                                                             "and evaluation stay float32); like the device, not part "
                                                             "of a run's identity", math=False)


@dataclass
class CommConfig:
    timeout_s: float = opt(3600.0, "a rank that does not reach a round's synchronisation point within this many "
                                   "seconds ends the job", exclusive_min=True, min=0, math=False)
    poll_ms: float = opt(20.0, "longest sleep between checks while a rank waits for the others (waiting ranks sleep, "
                               "yielding the CPU; each sleep is at most 0.5% "
                               "of the time waited so far)", exclusive_min=True, min=0, math=False)


@dataclass
class AugmentConfig:
    crop_padding: int | None = opt(None, "random crop with this zero padding (null: the data set's default, 0: "
                                         "off)", min=0)
    flip: bool | None = opt(None, "random horizontal flip (null: the data set's default)")
    rotation: float = opt(0.0, "random rotation by up to this many degrees either way (0: off; FedCSD's CIFAR-100 "
                               "code: 15)", min=0, max=180)
    cutout: int = opt(0, "Cutout square side in pixels (0: off; FedNTD uses 16)", min=0)


@dataclass
class DataConfig:
    dataset: Choice = choice(_datasets, "digits", "data set (digits, mnist, fashion_mnist, synthetic, cifar10, ...)")
    num_clients: int = opt(10, "number of clients K the training data is split into", min=1)
    partition: Choice = choice(_partitions, "dirichlet", "how training samples are split over clients", beta=0.5)
    partition_seed: int | None = opt(None, "seed of the partition and the server hold-out (null: run.seed)", min=0)
    train_subset: int = opt(0, "use only the first N training samples (0: all)", min=0)
    test_subset: int = opt(0, "use only the first N test samples (0: all); for quick runs only: summary.json and the "
                              "log say so", min=0)
    val_size: int = opt(0, "hold out N training samples as a validation set (stratified by class, seeded like the "
                           "partition; before train_subset, the server hold-out and the partition), given to no client "
                           "and to no method, and evaluated with the test set as val_acc/val_loss (0: none)", min=0)
    server_holdout_per_class: int = opt(0, "training samples per class held out for the server (FedCAD's auxiliary "
                                           "set, FedGKD-VOTE's validation set) and given to no client", min=0)
    client_holdout: float = opt(0.0, "client-level evaluation: hold out this fraction of each client's samples (at "
                                     "least one; the same ones in every run), train on the rest, and evaluate the "
                                     "global model on each client's held-out part at every evaluation (client_acc: "
                                     "mean, std, median, min, worst10 in metrics.jsonl; each client's in "
                                     "client_acc.jsonl); 0: off", min=0, max=0.9)
    prepared_root: str = opt("data/prepared", "where prepared shards are written (one folder per data/partition "
                                              "setting)", math=False)
    prepared_dir: str | None = opt(None, "use exactly this prepared folder instead of one under "
                                         "prepared_root", math=False)
    augment: AugmentConfig = section(AugmentConfig, "training-time augmentation (never applied in evaluation)")
    tokenizer: str | None = opt(None, "text data sets: local folder with the tokenizer's tokenizer.json or vocab.txt "
                                      "(e.g. DistilBERT's); nothing is downloaded")
    max_length: int = opt(128, "text data sets: token ids per text, padded or truncated to this length ([CLS] and "
                               "[SEP] included)", min=2)


@dataclass
class CodeConfig:
    algorithm: str | None = opt(None, "SHA-256 of the plugin that defines the chosen algorithm (null: mpifed's own); "
                                      "recorded by mpifed from the code it loads, never set by hand")
    model: str | None = opt(None, "SHA-256 of the plugin that defines the chosen model (null: mpifed's own)")
    dataset: str | None = opt(None, "SHA-256 of the plugin that defines the chosen data set (null: mpifed's own)")
    partition: str | None = opt(None, "SHA-256 of the plugin that defines the chosen partition (null: mpifed's own)")
    selection: str | None = opt(None, "SHA-256 of the plugin that defines the chosen client selection (null: "
                                      "mpifed's own)")
    aggregation: str | None = opt(None, "SHA-256 of the plugin that defines the chosen aggregation (null: mpifed's "
                                        "own)")


@dataclass
class Config:
    plugins: list[str] = opt([], "Python files (a path relative to the config file that names it) or modules to load "
                                 "first: methods, models, data sets or partitions of your own (docs/tutorial.md); the "
                                 "files of every config add up", math=False)
    run: RunConfig = section(RunConfig, "run directory, seed, evaluation and checkpoint frequency")
    data: DataConfig = section(DataConfig, "data set, clients and partition")
    model: Choice = choice(_models, "digits_cnn", "network (digits_cnn, fedavg_cnn, resnet8, ...)")
    train: TrainConfig = section(TrainConfig, "rounds and local optimisation")
    algorithm: Choice = choice(_algorithms, "fedavg", "federated algorithm (fedavg, fedntd, fedgkd, ...)")
    server_optimizer: Choice = choice(_server_optimizers, "sgd", "the server's step from the global model to the "
                                      "round's aggregate (sgd, sgdm, adagrad, adam, yogi; sgd at lr 1: the aggregate)")
    aggregation: Choice = choice(_aggregations, "sync", "synchronous rounds (sync), or an asynchronous server on the "
                                 "virtual clock: fedbuff or fedasync (docs/federations.md)")
    selection: Choice = choice(_selectors, "uniform", "which available clients a round samples (uniform, weighted, "
                                                      "oort; docs/federations.md)")
    system: SystemConfig = section(SystemConfig, "the simulated federation: virtual clock, devices, availability, "
                                                 "deadlines, local work (off by default; docs/federations.md)")
    resources: ResourcesConfig = section(ResourcesConfig, "devices, threads, memory")
    comm: CommConfig = section(CommConfig, "collective timeouts and idle waiting")
    code: CodeConfig = section(CodeConfig, "the code of the chosen entries that come from plugins, by hash (recorded "
                                           "by mpifed): a changed plugin is a changed setting")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


def to_dict(obj: Any) -> Any:
    """Plain dict/list/scalar form of a config tree (Choices flattened to name + options)."""
    if isinstance(obj, Choice):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    return obj


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    # cached: resolving the string annotations is most of the time of loading a config (a table
    # loads hundreds); callers only read the dict
    return typing.get_type_hints(cls)


def key_type(path: tuple[str, ...], data: Any = None) -> Any:
    """The type the config key at ``path`` holds (:class:`Choice` for a choice section), or None where the
    schema has no such key. A key inside a choice (its ``name`` or an option) is found when ``data`` (a
    plain config dict) chooses a known entry."""
    cls: Any = Config
    node: Any = data
    for i, key in enumerate(path):
        if not dataclasses.is_dataclass(cls):
            return None
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if key not in fields:
            return None
        f = fields[key]
        node = node.get(key) if isinstance(node, dict) else None
        if "registry" not in f.metadata:
            cls = type_hints(cls)[key]
            continue
        if i == len(path) - 1:
            return Choice
        name = node.get("name") if isinstance(node, dict) else node
        cls = f.metadata["registry"]().get(name) if name is not None else None
        if cls is None:
            return None
        if path[i + 1] == "name":
            return str if i + 1 == len(path) - 1 else None
    return cls


def is_choice_path(path: tuple[str, ...]) -> bool:
    """Whether the config key at ``path`` is a choice section (``algorithm``, ``data.partition``)."""
    return key_type(path) is Choice
