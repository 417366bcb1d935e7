"""``python -m mpifed.data.vocab --config X [--set k=v ...] --out DIR [--size N]``: train a
lower-cased BERT WordPiece vocabulary on a text data set's training texts (never its test
texts) and write ``DIR/vocab.txt``, for runs without a pretrained tokenizer (the fortunes
demonstration). Point ``data.tokenizer`` at DIR."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mpifed.settings import config
from mpifed.data.raw import RawText
from mpifed.plugin.registry import DATASETS

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_vocab(texts: list[str], out: Path, size: int) -> Path:
    """Train a WordPiece vocabulary of at most ``size`` tokens on ``texts``; returns vocab.txt."""
    try:
        from tokenizers.implementations import BertWordPieceTokenizer
    except ImportError:
        raise ImportError("training a vocabulary needs the tokenizers package: pip install 'mpifed[nlp]'") from None
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(texts, vocab_size=size, min_frequency=2, special_tokens=SPECIAL, show_progress=False)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_model(str(out))
    return out / "vocab.txt"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpifed.data.vocab", description=__doc__)
    p.add_argument("--config", action="append", default=[], metavar="YAML")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", required=True, type=Path, help="folder to write vocab.txt into")
    p.add_argument("--size", type=int, default=4000, help="largest vocabulary (special tokens included)")
    args = p.parse_args(argv)
    try:
        cfg, _ = config.load(args.config, [o for group in args.set for o in group])
        raw = DATASETS.get(cfg.data.dataset.name).load(cfg.data.dataset.options)
        if not isinstance(raw, RawText):
            raise ValueError(f"data set {cfg.data.dataset.name!r} holds no texts")
        path = train_vocab(raw.train_texts, args.out, args.size)
    except Exception as exc:  # every error here is a user's: say it plainly
        print(f"[mpifed.data.vocab] {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({len(path.read_text().splitlines())} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
