"""Tokenizing texts once, when the data is prepared, with a tokenizer from a local folder.

The folder holds a Hugging Face ``tokenizer.json`` (used as it is) or a WordPiece
``vocab.txt`` (BERT's pipeline: lower-cased unless ``tokenizer_config.json`` says
``do_lower_case: false``, [CLS] text [SEP]). Nothing is fetched from a model hub. Every
text becomes ``max_length`` token ids (truncated, or padded with [PAD]) and an attention
mask; the ids are stored as uint16 when the vocabulary fits, else int32.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mpifed.data.raw import RawData, RawText
from mpifed.files.packaged import find_folder

HOW_TO_GET = (
    "mpifed never downloads a tokenizer. On a machine with internet, save one into that folder, e.g. "
    "`python -c \"from transformers import AutoTokenizer; "
    "AutoTokenizer.from_pretrained('distilbert-base-uncased').save_pretrained('PATH')\"` "
    "(or `hf download distilbert/distilbert-base-uncased --local-dir PATH`), copy the folder here and set "
    "data.tokenizer to it; for a vocabulary trained on the data set itself see `python -m mpifed.data.vocab`")


class TokenizerMissing(FileNotFoundError):
    """The configured tokenizer folder or its files are missing."""


def tokenizer_file(folder: str | Path) -> Path:
    """The folder's ``tokenizer.json``, else its ``vocab.txt`` (a ``configs/...`` folder absent here
    is the one shipped with mpifed)."""
    folder = find_folder(folder)
    for name in ("tokenizer.json", "vocab.txt"):
        if (folder / name).is_file():
            return folder / name
    what = "does not exist" if not folder.is_dir() else "holds neither tokenizer.json nor vocab.txt"
    raise TokenizerMissing(f"data.tokenizer: the folder {folder} {what}. " + HOW_TO_GET.replace("PATH", str(folder)))


def fingerprint(folder: str | Path) -> str:
    """SHA-256 of the tokenizer file the folder provides (and its tokenizer_config.json)."""
    path = tokenizer_file(folder)
    h = hashlib.sha256(path.read_bytes())
    config = path.parent / "tokenizer_config.json"
    if path.name == "vocab.txt" and config.is_file():
        h.update(config.read_bytes())
    return h.hexdigest()[:16]


def load_tokenizer(folder: str | Path, max_length: int) -> Any:
    """A ``tokenizers.Tokenizer`` that truncates and pads every text to ``max_length`` ids."""
    path = tokenizer_file(folder)
    try:
        import tokenizers
        from tokenizers.implementations import BertWordPieceTokenizer
    except ImportError:
        raise ImportError("text data sets need the tokenizers package: pip install 'mpifed[nlp]'") from None
    if path.name == "tokenizer.json":
        tok = tokenizers.Tokenizer.from_file(str(path))
    else:
        config = path.parent / "tokenizer_config.json"
        lower = json.loads(config.read_text()).get("do_lower_case", True) if config.is_file() else True
        tok = BertWordPieceTokenizer(str(path), lowercase=lower)
    pad = tok.token_to_id("[PAD]")
    if pad is None:
        raise ValueError(f"the tokenizer in {path.parent} has no [PAD] token; mpifed expects a BERT-style vocabulary")
    tok.enable_truncation(max_length)
    tok.enable_padding(length=max_length, pad_id=pad, pad_token="[PAD]")
    return tok


def encode(texts: list[str], tok: Any) -> dict[str, np.ndarray]:
    """``input_ids`` (uint16 or int32) and ``attention_mask`` (uint8), one row per text."""
    encodings = tok.encode_batch(texts)
    dtype = np.uint16 if tok.get_vocab_size() <= 2**16 else np.int32
    length = tok.truncation["max_length"]
    ids = np.array([e.ids for e in encodings], dtype=dtype).reshape(len(texts), length)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.uint8).reshape(len(texts), length)
    return {"input_ids": ids, "attention_mask": mask}


def tokenize(raw: RawText, folder: str | Path, max_length: int,
             log: Callable[[str], None] = print) -> tuple[RawData, int]:
    """The texts as token-id arrays, and the tokenizer's vocabulary size."""
    tok = load_tokenizer(folder, max_length)
    log(f"[prepare] tokenizing {len(raw.train_texts) + len(raw.test_texts)} texts with {tokenizer_file(folder)} "
        f"(length {max_length}) ...")
    data = RawData(encode(raw.train_texts, tok), raw.train_y, encode(raw.test_texts, tok), raw.test_y,
                   raw.num_classes, raw.source, files=raw.files)
    return data, tok.get_vocab_size()
