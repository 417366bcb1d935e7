"""DistilBERT (Sanh et al., 2019) for text classification, as FedGKD fine-tunes it (its Table 4).

Built with Hugging Face ``transformers`` (``pip install 'mpifed[nlp]'``), imported only when
the model is built, so image runs never load it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mpifed.models.base import Classifier
from mpifed.plugin.options import opt
from mpifed.plugin.registry import MODELS

HOW_TO_GET = (
    "mpifed never downloads weights. On a machine with internet, save them into that folder, e.g. "
    "`python -c \"from transformers import AutoModel, AutoTokenizer; "
    "[c.from_pretrained('distilbert-base-uncased').save_pretrained('PATH') for c in (AutoModel, AutoTokenizer)]\"`, "
    "copy the folder here and set model.pretrained (and data.tokenizer) to it")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ImportError("the distilbert model needs transformers: pip install 'mpifed[nlp]'") from None
    return transformers


class DistilBertClassifier(Classifier):
    """Hugging Face's ``DistilBertForSequenceClassification`` split at the contract's seam:
    ``features`` = ReLU(pre_classifier(h_[CLS])), the last layer's [CLS] state through the
    pre-classifier layer and ReLU; ``head`` = dropout (``seq_classif_dropout``) + classifier.
    ``forward`` equals Hugging Face's logits."""

    def __init__(self, hf: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.distilbert = hf.distilbert
        # the position ids are a constant (0..511); without the buffer HF builds them per batch,
        # and the flat model state holds no integer buffer that the server would average
        del self.distilbert.embeddings.position_ids
        self.pre_classifier = hf.pre_classifier
        self.dropout = hf.dropout
        self.classifier = hf.classifier
        self.feature_dim = hf.config.dim
        self.num_classes = num_classes
        self.vocab_size = hf.config.vocab_size
        self.max_length = hf.config.max_position_embeddings

    def features(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        mask = x["attention_mask"]
        if self.distilbert.config._attn_implementation == "sdpa":
            # the 4-D boolean mask SDPA takes, built here: given the 2-D mask, Hugging Face first asks
            # whether any token is padding, which makes the host wait for the GPU on every forward.
            # The same numbers on the CPU; on a GPU a batch without padding no longer takes the
            # flash kernel, which takes no mask
            mask = mask.bool()[:, None, None, :]
        h = self.distilbert(input_ids=x["input_ids"], attention_mask=mask).last_hidden_state
        return torch.relu(self.pre_classifier(h[:, 0]))

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(z))


@MODELS.register("distilbert")
class DistilBert:
    """DistilBERT with a sequence-classification head (FedGKD Table 4). ``pretrained``: a local
    folder with a Hugging Face checkpoint (config.json and the weights; the classifier is
    new); without it, random weights of the shape the other keys give (DistilBERT-base's by
    default: 6 layers, hidden 768, 12 heads, 66M parameters)."""

    modality = "text"

    @dataclass
    class Options:
        pretrained: str | None = opt(None, "local folder with a Hugging Face DistilBERT checkpoint (config.json and "
                                           "model.safetensors); null: random weights of the shape below (ignored when "
                                           "set)")
        vocab_size: int = opt(30522, "token embeddings (at least the tokenizer's vocabulary)", min=1)
        dim: int = opt(768, "hidden size", min=1)
        n_layers: int = opt(6, "transformer layers", min=1)
        n_heads: int = opt(12, "attention heads (dim must be a multiple)", min=1)
        hidden_dim: int = opt(3072, "feed-forward inner size", min=1)
        max_position_embeddings: int = opt(512, "longest input (data.max_length must not exceed it)", min=1)
        dropout: float = opt(0.1, "dropout in embeddings and layers", min=0, max=1)
        attention_dropout: float = opt(0.1, "dropout on attention weights", min=0, max=1)
        seq_classif_dropout: float = opt(0.2, "dropout before the classifier (the head)", min=0, max=1)

        def check(self) -> list[str]:
            if self.dim % self.n_heads:
                return [f"dim ({self.dim}) must be a multiple of n_heads ({self.n_heads})"]
            return []

    @staticmethod
    def build(options: "DistilBert.Options", input_shape: tuple[int, ...], num_classes: int) -> Classifier:
        tf = _transformers()
        if options.pretrained:
            folder = Path(options.pretrained)
            if not (folder / "config.json").is_file():
                raise FileNotFoundError(f"model.pretrained: {folder} holds no config.json. "
                                        + HOW_TO_GET.replace("PATH", str(folder)))
            hf = tf.DistilBertForSequenceClassification.from_pretrained(
                folder, num_labels=num_classes, local_files_only=True, dtype=torch.float32)
        else:
            hf = tf.DistilBertForSequenceClassification(tf.DistilBertConfig(
                vocab_size=options.vocab_size, dim=options.dim, n_layers=options.n_layers, n_heads=options.n_heads,
                hidden_dim=options.hidden_dim, max_position_embeddings=options.max_position_embeddings,
                dropout=options.dropout, attention_dropout=options.attention_dropout,
                seq_classif_dropout=options.seq_classif_dropout, num_labels=num_classes))
        net = DistilBertClassifier(hf, num_classes)
        if input_shape[0] > net.max_length:
            raise ValueError(f"data.max_length ({input_shape[0]}) exceeds the model's {net.max_length} positions; "
                             f"lower data.max_length")
        return net
