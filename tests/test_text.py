"""Text as a modality: loaders of the real file formats, tokenized shards, the distilbert model."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import REPO, env, run_debug, tiny
from textdata import text_run, write_fortunes
from mpifed.settings import config
from mpifed.data.fingerprint import first_change
from mpifed.preparation.build import prepare
from mpifed.preparation.spec import raw_data_missing
from mpifed.data.raw import DataMissing
from mpifed.data.shards import read_client, read_shard
from mpifed.data.tokenize import TokenizerMissing
from mpifed.registry import DATASETS, MODELS

pytest.importorskip("transformers")


def load(name, **options):
    entry = DATASETS.get(name)
    return entry.load(entry.Options(**options))


# ----------------------------------------------------------------------------- loaders
def test_ag_news_csv(tmp_path):
    (tmp_path / "train.csv").write_text(
        '"3","Wall St. Bears Claw Back","Reuters - Short-sellers, Wall Street\'s dwindling band"\n'
        '"1","Talks, ""again""","Envoys meet"\n"2","Win","Team wins, again"\n"4","Chips","New CPU"\n' * 5)
    (tmp_path / "test.csv").write_text('"4","Space","A probe"\n"2","Cup","Final"\n')
    raw = load("ag_news", root=str(tmp_path))
    assert raw.num_classes == 4 and len(raw.train_texts) == 20 and raw.test_y.tolist() == [3, 1]
    assert raw.train_texts[0] == "Wall St. Bears Claw Back Reuters - Short-sellers, Wall Street's dwindling band"
    assert raw.train_texts[1] == 'Talks, "again" Envoys meet' and raw.train_y[:4].tolist() == [2, 0, 1, 3]
    half = load("ag_news", root=str(tmp_path), train_fraction=0.5)
    assert np.bincount(half.train_y).tolist() == [2, 2, 2, 2] or np.bincount(half.train_y).tolist() == [3, 3, 3, 3]
    assert load("ag_news", root=str(tmp_path), train_fraction=0.5).train_texts == half.train_texts   # seeded
    (tmp_path / "test.csv").write_text('"5","Bad","label"\n')
    with pytest.raises(ValueError, match="test.csv:1: expected 'class index"):
        load("ag_news", root=str(tmp_path))
    with pytest.raises(DataMissing, match="train.csv, test.csv not found"):
        load("ag_news", root=str(tmp_path / "none"))


TREES = ["(3 (2 It) (4 (4 (2 's) (4 good)) (2 (2 -LRB-) (2 (2 really) (2 "
         "-RRB-)))))", "(0 (0 Awful) (2 .))", "(4 (4 Great))"]


def test_sst5_ptb_jsonl_and_tsv_give_the_same_sentences(tmp_path):
    ptb, jl, tsv, bare = (tmp_path / d for d in ("ptb", "jsonl", "tsv", "bare"))
    for d in (ptb, jl, tsv, bare):
        d.mkdir()
    sentences = ["It 's good ( really )", "Awful .", "Great"]
    labels = [3, 0, 4]
    for split in ("train", "test"):
        (ptb / f"{split}.txt").write_text("\n".join(TREES) + "\n")
        (jl / f"{split}.jsonl").write_text("".join(json.dumps({"text": s, "label": y, "label_text": "x"}) + "\n"
                                                   for s, y in zip(sentences, labels)))
        rows = "".join(f"{s}\t{y}\n" for s, y in zip(sentences, labels))
        (tsv / f"{split}.tsv").write_text("sentence\tlabel\n" + rows)
        (bare / f"{split}.tsv").write_text("".join(f"{y}\t{s}\n" for s, y in zip(sentences, labels)))
    (ptb / "dev.txt").write_text("(1 (1 unused))\n")
    for folder in (ptb, jl, tsv, bare):
        raw = load("sst5", root=str(folder))
        assert raw.train_texts == sentences and raw.train_y.tolist() == labels and raw.num_classes == 5, folder
    assert "(ptb)" in load("sst5", root=str(ptb)).__dict__["source"]
    (ptb / "test.txt").write_text("(3 (2 It) (4 good)\n")
    with pytest.raises(ValueError, match="test.txt:1: not a labelled PTB tree"):
        load("sst5", root=str(ptb))
    with pytest.raises(DataMissing, match="train.jsonl"):
        load("sst5", root=str(ptb), format="jsonl")


def test_fortunes_files(tmp_path):
    root = write_fortunes(tmp_path, per_class=10)
    raw = load("fortunes", root=str(root), categories=["computers", "politics", "science"], test_fraction=0.2)
    assert raw.num_classes == 3 and len(raw.train_texts) == 24 and np.bincount(raw.test_y).tolist() == [2, 2, 2]
    assert all("\n" not in t and "%" not in t and "  " not in t for t in raw.train_texts + raw.test_texts)
    assert "The program is bug and code and unix -- fortune 0.1" in raw.train_texts + raw.test_texts
    with pytest.raises(DataMissing, match="apt-get install fortunes"):
        load("fortunes", root=str(root), categories=["computers", "sports"])


# ----------------------------------------------------------------------------- tokenized shards
def test_tokenized_shards_hold_the_tokenizers_ids(tmp_path):
    from transformers import DistilBertTokenizer
    args = text_run(tmp_path)[1:]
    cfg, _ = config.load(overrides=args)
    m = prepare(cfg, log=lambda s: None)
    assert m.modality == "text" and m.input_shape == (16,) and m.vocab_size == 60 and m.mean == []
    raw = DATASETS.get("fortunes").load(cfg.data.dataset.options)
    hf = DistilBertTokenizer.from_pretrained(tmp_path / "vocab")   # Hugging Face's own reading of vocab.txt

    def reference(texts):
        enc = hf(texts, padding="max_length", truncation=True, max_length=16)
        return np.array(enc["input_ids"]), np.array(enc["attention_mask"])

    test = read_shard(m.test_path, verify=True)
    ids, mask = reference(raw.test_texts)
    assert test.inputs["input_ids"].dtype == np.uint16 and test.inputs["attention_mask"].dtype == np.uint8
    assert np.array_equal(test.inputs["input_ids"], ids) and np.array_equal(test.inputs["attention_mask"], mask)
    assert np.array_equal(test.labels, raw.test_y)
    shards = [read_client(m.client_block(k), k) for k in range(m.num_clients)] + [read_shard(m.server_path)]
    got = sorted(map(tuple, np.concatenate([s.inputs["input_ids"] for s in shards]).tolist()))
    assert got == sorted(map(tuple, reference(raw.train_texts)[0].tolist()))


def test_text_manifest_fingerprints_the_raw_files(tmp_path):
    cfg, _ = config.load(overrides=text_run(tmp_path)[1:])
    m = prepare(cfg, log=lambda s: None)
    assert sorted(Path(e["path"]).name for e in m.raw_inputs["files"]) == ["computers", "politics", "science"]
    assert first_change(m.raw_inputs) is None
    with open(tmp_path / "fortunes" / "politics", "a") as f:
        f.write("An added fortune.\n%\n")
    assert "politics" in first_change(m.raw_inputs)


@pytest.mark.parametrize("name, present", [("ag_news", ["train.csv", "test.csv"]),
                                           ("sst5", ["train.jsonl", "test.jsonl"]),
                                           ("fortunes", ["computers", "men-women", "politics", "science"])])
def test_text_data_sets_say_when_their_files_are_missing(tmp_path, name, present):
    entry = DATASETS.get(name)
    options = entry.Options(root=str(tmp_path))
    for f in present[:-1]:
        (tmp_path / f).write_text("")
    assert entry.raw_missing(options) == tmp_path
    (tmp_path / present[-1]).write_text("")
    assert entry.raw_missing(options) is None


def test_missing_tokenizer_says_how_to_get_one(tmp_path):
    args = text_run(tmp_path)[1:] + [f"data.tokenizer={tmp_path / 'nowhere'}"]
    cfg, _ = config.load(overrides=args)
    with pytest.raises(TokenizerMissing, match="does not exist.*save_pretrained"):
        prepare(cfg, log=lambda s: None)
    assert raw_data_missing(cfg) == tmp_path / "nowhere"  # table --list names the tokenizer folder, not a traceback


def test_table_list_names_a_missing_tokenizer_as_such(tmp_path, capsys):
    from mpifed.entry.table import main as table_main
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"data": {
        "dataset": {"name": "fortunes", "root": str(write_fortunes(tmp_path / "fortunes")),
                    "categories": ["computers", "politics", "science"]},
        "tokenizer": str(tmp_path / "nowhere")}, "model": {"name": "distilbert", "vocab_size": 64}}))
    (tmp_path / "a.yaml").write_text("algorithm: fedavg\n")
    (tmp_path / "t.table.yaml").write_text("title: T\nmetric: {kind: final}\nsettings: [s.yaml]\nmethods: "
                                           "[a.yaml]\nseeds: [0]\n")
    assert table_main([str(tmp_path / "t.table.yaml"), "--runs-root", str(tmp_path / "runs"), "--list"]) == 0
    assert "no tokenizer" in capsys.readouterr().out
    listed = [str(tmp_path / "t.table.yaml"), "--runs-root", str(tmp_path / "runs"), "--list", "--commands"]
    assert table_main(listed) == 0
    out = capsys.readouterr().out
    assert f"[tokenizer missing: expects {tmp_path / 'nowhere'}]" in out and "raw data" not in out
    assert f"save the tokenizer there (docs/text.md), or point data.tokenizer at one: {tmp_path / 'nowhere'}" in out


def test_config_rejects_a_model_of_the_other_modality_and_text_without_tokenizer(tmp_path):
    with pytest.raises(config.ConfigError, match="takes images but data set 'fortunes' holds text"):
        config.load(overrides=["data.dataset.name=fortunes", "data.tokenizer=x"])
    with pytest.raises(config.ConfigError, match="data.tokenizer: data set 'sst5' is text"):
        config.load(overrides=["data.dataset.name=sst5", "model.name=distilbert"])
    with pytest.raises(config.ConfigError, match="takes text but data set 'digits' holds images"):
        config.load(overrides=["model.name=distilbert"])


# ----------------------------------------------------------------------------- the model
def tiny_options(**kw):
    return MODELS.get("distilbert").Options(vocab_size=40, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                           max_position_embeddings=16, **kw)


def test_distilbert_base_has_the_published_size():
    torch.manual_seed(0)
    net = MODELS.get("distilbert").build(MODELS.get("distilbert").Options(), (128,), 4)
    body = sum(p.numel() for p in net.distilbert.parameters())
    assert body == 66_362_880   # DistilBERT-base (uncased): the "66M" of Sanh et al.
    total = sum(p.numel() for p in net.parameters())
    assert total == body + (768 * 768 + 768) + (768 * 4 + 4)
    assert not list(net.buffers())


def test_distilbert_contract_matches_hugging_face_and_loads_local_weights(tmp_path):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    torch.manual_seed(0)
    hf = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=40, dim=32, n_layers=2, n_heads=2,
                                                              hidden_dim=64,
                                                              max_position_embeddings=16, num_labels=3)).eval()
    hf.save_pretrained(tmp_path / "ckpt")
    x = {"input_ids": torch.randint(0, 40, (5, 12)), "attention_mask": torch.ones(5, 12, dtype=torch.long)}
    x["attention_mask"][:, 9:] = 0
    net = MODELS.get("distilbert").build(tiny_options(pretrained=str(tmp_path / "ckpt")), (12,), 3).eval()
    with torch.no_grad():
        z = net.features(x)
        assert z.shape == (5, 32) and net.feature_dim == 32 and (z >= 0).all()
        assert torch.allclose(net.head(z), hf(**x).logits, atol=1e-6)
    with pytest.raises(FileNotFoundError, match="holds no config.json.*save_pretrained"):
        MODELS.get("distilbert").build(tiny_options(pretrained=str(tmp_path)), (12,), 3)
    with pytest.raises(ValueError, match="exceeds the model's 16 positions"):
        MODELS.get("distilbert").build(tiny_options(), (32,), 3)


def test_text_run_learns_nothing_special_and_vocab_must_fit(tmp_path):
    run_debug(text_run(tmp_path, "train.rounds=2"))
    rows = [json.loads(line) for line in (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(0 <= r["test_acc"] <= 1 for r in rows)
    p = run_debug(text_run(tmp_path, "model.vocab_size=20", name="small"), check=False)
    assert p.returncode != 0 and "set model.vocab_size to at least 60" in p.stdout + p.stderr


def test_image_runs_never_import_transformers_or_tokenizers(tmp_path):
    code = ("import sys; from mpifed.entry.main import main; "
            f"assert main({tiny(tmp_path, 'train.rounds=1')!r}) == 0; "
            "loaded = [m for m in ('transformers', 'tokenizers') if m in sys.modules]; "
            "assert not loaded, loaded")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_vocab_tool_writes_a_vocabulary_that_prepare_uses(tmp_path):
    from mpifed.entry.vocab import main as vocab_main
    args = text_run(tmp_path)
    assert vocab_main(["--set", *args[1:], "--out", str(tmp_path / "trained"), "--size", "80"]) == 0
    tokens = (tmp_path / "trained" / "vocab.txt").read_text().split()
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(tokens) <= 80
    cfg, _ = config.load(overrides=args[1:] + [f"data.tokenizer={tmp_path / 'trained'}"])
    m = prepare(cfg, log=lambda s: None)
    assert m.vocab_size == len(tokens)
