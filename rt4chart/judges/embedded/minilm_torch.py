"""all-MiniLM-L6-v2 in plain torch: the reference the numpy encoder is checked against.

The embedded verifier runs :mod:`rt4chart.judges.embedded.minilm` (numpy, no torch). This implementation
of the same forward pass, built from the same :class:`~rt4chart.judges.embedded.minilm.Checkpoint`, is what
the verifier ran before; ``tests/backends/test_minilm.py`` checks that both give the same
embeddings, and ``evals/embedded/round3.py`` reads its token states. Imports torch (the signals or
evals extra).
"""

from __future__ import annotations

from pathlib import Path

import torch

from rt4chart.judges.embedded.minilm import LAYER_WEIGHTS, Checkpoint


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


class TorchMiniLM(torch.nn.Module):
    """The BERT encoder of all-MiniLM-L6-v2 with mean pooling and L2 normalisation, in torch."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        checkpoint = Checkpoint.read(directory)
        config = checkpoint.config
        width, eps = int(config["hidden_size"]), float(config["layer_norm_eps"])
        layers = int(config["num_hidden_layers"])
        self.words = torch.nn.Embedding(int(config["vocab_size"]), width)
        self.positions = torch.nn.Embedding(int(config["max_position_embeddings"]), width)
        self.token_types = torch.nn.Embedding(int(config["type_vocab_size"]), width)
        self.embedding_norm = torch.nn.LayerNorm(width, eps=eps)
        self.layers = torch.nn.ModuleList(
            _Layer(width, int(config["intermediate_size"]), int(config["num_attention_heads"]), eps)
            for _ in range(layers)
        )
        weights = checkpoint.weights
        state = {
            "words.weight": weights["embeddings.word_embeddings.weight"],
            "positions.weight": weights["embeddings.position_embeddings.weight"],
            "token_types.weight": weights["embeddings.token_type_embeddings.weight"],
            "embedding_norm.weight": weights["embeddings.LayerNorm.weight"],
            "embedding_norm.bias": weights["embeddings.LayerNorm.bias"],
        }
        for index in range(layers):
            for ours in LAYER_WEIGHTS:
                for kind in ("weight", "bias"):
                    state[f"layers.{index}.{ours}.{kind}"] = checkpoint.layer_weight(index, ours, kind)
        self.load_state_dict({name: torch.from_numpy(array) for name, array in state.items()})
        self.eval()
        self.checkpoint = checkpoint
        self.tokenizer = checkpoint.tokenizer
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
        ids, attention = (torch.from_numpy(array) for array in self.checkpoint.token_arrays(texts))
        with torch.inference_mode():
            embedded: torch.Tensor = self(ids, attention)
        return embedded
