"""Tiny text data for the text tests: fortune files, a WordPiece vocabulary, run overrides."""
from __future__ import annotations

from pathlib import Path

WORDS = {
    "computers": ["computer", "program", "bug", "code", "unix", "byte", "disk", "memory"],
    "politics": ["vote", "senate", "law", "tax", "party", "election", "king", "power"],
    "science": ["atom", "physics", "theory", "energy", "star", "cell", "gene", "light"],
}
FILLER = ["the", "a", "is", "of", "and", "to", "in", "it"]


def write_fortunes(root: Path, per_class: int = 12) -> Path:
    """Three fortune files of ``per_class`` short texts each (words typical of the class)."""
    root.mkdir(parents=True, exist_ok=True)
    for c, (name, words) in enumerate(WORDS.items()):
        entries = []
        for i in range(per_class):
            w = [words[(i + j) % len(words)] for j in range(3 + i % 4)]
            entries.append(f"The {w[0]} is {' and '.join(w[1:])}\n\t-- fortune {c}.{i}")
        (root / name).write_text("\n%\n".join(entries) + "\n%\n")
        (root / f"{name}.dat").write_bytes(b"\x00\x01")   # the strfile index beside it is ignored
    return root


def write_vocab(folder: Path) -> Path:
    """A lower-case WordPiece vocabulary holding the words of :func:`write_fortunes`."""
    folder.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "-", ".", "fortune"] + FILLER
    tokens += sorted({w for ws in WORDS.values() for w in ws})
    tokens += [str(d) for d in range(10)] + ["##" + str(d) for d in range(10)]
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")
    return folder


def text_run(tmp: Path, *extra: str, name: str = "run") -> list[str]:
    """--set overrides for a 1-round run of a tiny DistilBERT-shaped model on tiny fortune files."""
    data = write_fortunes(tmp / "fortunes")
    vocab = write_vocab(tmp / "vocab")
    return ["--set", "data.dataset={name: fortunes, categories: [computers, politics, science], test_fraction: 0.25}",
            f"data.dataset.root={data}", f"data.tokenizer={vocab}", "data.max_length=16", "data.num_clients=4",
            "data.partition={name: dirichlet, beta: 0.5, min_size: 3}", "data.server_holdout_per_class=2",
            "model={name: distilbert, vocab_size: 64, dim: 32, n_layers: 2, n_heads: 2, hidden_dim: 64, "
            "max_position_embeddings: 16}",
            "train.rounds=1", "train.local_epochs=1", "train.batch_size=8", "train.optimizer=adam", "train.lr=0.001",
            "train.eval_batch_size=8", "resources.threads=1", "resources.device=cpu", f"run.root={tmp / 'runs'}",
            f"data.prepared_root={tmp / 'data'}", f"run.name={name}", *extra]
