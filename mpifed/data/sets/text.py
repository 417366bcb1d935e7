"""Text classification data sets from their distributed files: AG News (CSV), SST-5 (PTB trees,
JSONL or TSV) and Debian's fortune files. They return texts; the prepare step tokenizes them
(``data.tokenizer``, ``data.max_length``; see :mod:`mpifed.data.tokenize`)."""
from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from mpifed.data.raw import DataMissing, Dataset, RawText, stratified_split
from mpifed.plugin.options import opt
from mpifed.plugin.registry import DATASETS


def _labels(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _keep_fraction(texts: list[str], y: np.ndarray, fraction: float, seed: int) -> tuple[list[str], np.ndarray]:
    """A seeded, class-stratified ``fraction`` of the samples, in file order."""
    if fraction >= 1.0:
        return texts, y
    _, keep = stratified_split(y, fraction, seed)
    return [texts[i] for i in keep], y[keep]


# ------------------------------------------------------------------------------ AG News
def read_ag_news_csv(path: Path) -> tuple[list[str], np.ndarray]:
    """One AG News CSV (no header; class index 1-4, title, description): the texts
    ("title description") and labels 0-3."""
    texts, labels = [], []
    with open(path, newline="", encoding="utf-8") as f:
        for line, row in enumerate(csv.reader(f), 1):
            if len(row) != 3 or not row[0].strip().isdigit() or not 1 <= int(row[0]) <= 4:
                raise ValueError(f"{path}:{line}: expected 'class index (1-4)', 'title', 'description', got {row[:3]}")
            labels.append(int(row[0]) - 1)
            texts.append(f"{row[1].strip()} {row[2].strip()}".strip())
    return texts, _labels(labels)


@DATASETS.register("ag_news")
class AgNews(Dataset):
    """AG News (Zhang et al., 2015): 4 news topics (World, Sports, Business, Sci/Tech), 120,000
    training and 7,600 test texts, from the original ``train.csv`` and ``test.csv``. FedGKD
    (Table 2) trains on 60,000: ``train_fraction: 0.5``, a seeded half of every class."""

    @dataclass
    class Options:
        root: str = opt("data/raw/ag_news", "folder with train.csv and test.csv (the ag_news_csv archive)")
        train_fraction: float = opt(1.0, "keep this fraction of every class of the "
                                         "training texts (FedGKD: 0.5)", min=0, max=1, exclusive_min=True)
        fraction_seed: int = opt(0, "seed of the kept fraction", min=0)

    title = "AG News"
    modality = "text"
    class_names = ("World", "Sports", "Business", "Sci/Tech")
    needs = ("train.csv", "test.csv")
    how_to_get = ("Get the ag_news_csv archive (Zhang et al. 2015: train.csv, test.csv, classes.txt) and point "
                  "data.dataset.root at it")

    @classmethod
    def load(cls, options: "AgNews.Options") -> RawText:
        root = cls.root(options)
        train, ytr = read_ag_news_csv(root / "train.csv")
        test, yte = read_ag_news_csv(root / "test.csv")
        train, ytr = _keep_fraction(train, ytr, options.train_fraction, options.fraction_seed)
        return RawText(train, ytr, test, yte, 4, f"AG News CSV in {root}",
                       files=[root / "train.csv", root / "test.csv"])


# ------------------------------------------------------------------------------ SST-5
_LEAF = re.compile(r"\(\d+ ([^()\s]+)\)")
_PTB = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def parse_ptb_tree(line: str) -> tuple[str, int]:
    """A Stanford Sentiment Treebank tree, e.g. ``(3 (2 It) (4 (2 's) (4 good)))``: the
    sentence (its leaves joined by spaces) and the root's label 0-4."""
    line = line.strip()
    m = re.match(r"\((\d)\s", line)
    leaves = _LEAF.findall(line)
    if m is None or not leaves or line.count("(") != line.count(")"):
        raise ValueError(f"not a labelled PTB tree: {line[:80]!r}")
    return " ".join(_PTB.get(w, w) for w in leaves), int(m.group(1))


def read_ptb(path: Path) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                text, label = parse_ptb_tree(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: {exc}") from None
            texts.append(text)
            labels.append(label)
    return texts, labels


def read_jsonl(path: Path) -> tuple[list[str], list[int]]:
    """One JSON object per line with ``text`` (or ``sentence``) and an integer ``label``."""
    texts, labels = [], []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        text = row.get("text", row.get("sentence"))
        if not isinstance(text, str) or not isinstance(row.get("label"), int):
            raise ValueError(f"{path}:{n}: expected {{\"text\": ..., \"label\": 0-4}}, got keys {sorted(row)}")
        texts.append(text)
        labels.append(row["label"])
    return texts, labels


def read_tsv(path: Path) -> tuple[list[str], list[int]]:
    """Tab-separated label and sentence: with a header naming ``label`` and ``sentence``
    (or ``text``) columns, or two columns without one (the integer column is the label)."""
    rows = [r for r in csv.reader(path.open(newline="", encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE) if r]
    head = [c.strip().lower() for c in rows[0]] if rows else []
    if "label" in head and ("sentence" in head or "text" in head):
        li, ti = head.index("label"), head.index("sentence" if "sentence" in head else "text")
        rows = rows[1:]
    elif rows and all(len(r) == 2 for r in rows):
        li = 0 if all(r[0].strip().isdigit() for r in rows) else 1
        ti = 1 - li
    else:
        raise ValueError(f"{path}: expected a header with 'label' and 'sentence' columns, or two columns (label, "
                         "sentence)")
    try:
        return [r[ti] for r in rows], [int(r[li]) for r in rows]
    except (ValueError, IndexError) as exc:
        raise ValueError(f"{path}: a row has no integer label in column {li + 1} ({exc})") from None


_SST_READERS = {"ptb": (".txt", read_ptb), "jsonl": (".jsonl", read_jsonl), "tsv": (".tsv", read_tsv)}


@DATASETS.register("sst5")
class SST5(Dataset):
    """SST-5, the Stanford Sentiment Treebank's five-class sentence-level task (labels 0-4, very
    negative to very positive). Reads the PTB trees (``train.txt``, ``test.txt``: the root's label
    and the sentence), or one sentence per line as ``train.jsonl``/``test.jsonl`` or
    ``train.tsv``/``test.tsv``. The trees' roots give 8,544 training, 1,101 dev and 2,210 test
    sentences, the counts of FedGKD's Table 2 (its 8,544 are whole sentences, not the treebank's
    phrases); the common JSONL/TSV exports hold the same sentences. The dev split is not used."""

    modality = "text"
    class_names = ("very negative", "negative", "neutral", "positive", "very positive")

    @dataclass
    class Options:
        root: str = opt("data/raw/sst5", "folder with train/test as PTB trees (.txt), JSONL (.jsonl) or TSV (.tsv)")
        format: Literal["auto", "ptb", "jsonl", "tsv"] = opt("auto", "file format; auto: the first of .txt, .jsonl, "
                                                                     ".tsv present")

    @staticmethod
    def _formats(options: "SST5.Options") -> list[str]:
        return list(_SST_READERS) if options.format == "auto" else [options.format]

    @staticmethod
    def _format(options: "SST5.Options") -> str | None:
        """The first requested format whose train and test files are both in the folder."""
        root = Path(options.root)
        return next((f for f in SST5._formats(options)
                     if all((root / f"{s}{_SST_READERS[f][0]}").is_file() for s in ("train", "test"))), None)

    @staticmethod
    def raw_missing(options: "SST5.Options") -> Path | None:
        return None if SST5._format(options) is not None else Path(options.root)

    @staticmethod
    def load(options: "SST5.Options") -> RawText:
        root = Path(options.root)
        fmt = SST5._format(options)
        if fmt is None:
            names = " or ".join(f"train{_SST_READERS[f][0]} + test{_SST_READERS[f][0]}" for f in SST5._formats(options))
            raise DataMissing(f"SST-5: {names} not found in {root}. Get the treebank's trainDevTestTrees_PTB "
                              "(train.txt, dev.txt, test.txt) or an SST-5 JSONL/TSV export and point "
                              "data.dataset.root at it")
        suffix, reader = _SST_READERS[fmt]
        files = [root / f"train{suffix}", root / f"test{suffix}"]
        train, ytr = reader(files[0])
        test, yte = reader(files[1])
        bad = sorted({v for v in ytr + yte if not 0 <= v <= 4})
        if bad:
            raise ValueError(f"SST-5 in {root}: labels must be 0-4, found {bad[:5]}")
        return RawText(train, _labels(ytr), test, _labels(yte), 5, f"SST-5 ({fmt}) in {root}", files=files)


# ------------------------------------------------------------------------------ fortunes
def read_fortunes(path: Path) -> list[str]:
    """The texts of one fortune file (entries separated by lines holding only '%'), each
    with its lines joined and runs of white space collapsed."""
    text = path.read_text(encoding="utf-8", errors="replace")
    entries = re.split(r"^%\s*$", text, flags=re.MULTILINE)
    return [s for s in (" ".join(e.split()) for e in entries) if s]


@DATASETS.register("fortunes")
class Fortunes(Dataset):
    """Debian's ``fortunes`` package (``apt-get install fortunes``): short English texts filed by
    topic; each chosen category file is a class. The default four categories hold 2,961 texts
    (2,369 training, 592 test). A stratified ``test_fraction`` is held out with ``split_seed``. A small, real, offline
    topic-classification task for demonstrations, not a benchmark from a paper."""

    @dataclass
    class Options:
        root: str = opt("/usr/share/games/fortunes", "folder with the fortune files")
        categories: list[str] = opt(["computers", "men-women", "politics", "science"], "fortune files, one class each")
        test_fraction: float = opt(0.2, "fraction of each class held out as the "
                                        "test set", min=0, max=1, exclusive_min=True)
        split_seed: int = opt(0, "seed of the train/test split", min=0)

    title = "fortunes"
    modality = "text"
    how_to_get = ("Install Debian's fortune files (apt-get install fortunes) or point data.dataset.root at a folder "
                  "holding them")

    @classmethod
    def needed(cls, options: "Fortunes.Options") -> list[str]:
        return list(options.categories)

    @classmethod
    def load(cls, options: "Fortunes.Options") -> RawText:
        if len(options.categories) < 2:
            raise ValueError("data.dataset.categories: name at least two fortune files (classes)")
        root = cls.root(options)
        texts: list[str] = []
        labels: list[int] = []
        for c, name in enumerate(options.categories):
            entries = read_fortunes(root / name)
            texts += entries
            labels += [c] * len(entries)
        y = _labels(labels)
        tr, te = stratified_split(y, options.test_fraction, options.split_seed)
        return RawText([texts[i] for i in tr], y[tr], [texts[i] for i in te], y[te], len(options.categories),
                       f"fortunes {', '.join(options.categories)} in "
                       f"{root}", files=[root / c for c in options.categories])
