"""The numpy MiniLM encoder computes what transformers' BertModel and the plain-torch implementation
compute on the same files.

Tolerance: 1e-5 absolute per embedding component (the vectors have unit length; the three
implementations sum in different orders in float32, measured 3e-7 apart at most on these sentences).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from conftest import require_embedded

from rt4chart.judges.embedded.verifier import SentenceEncoder, model_dir

require_embedded()
minilm = pytest.importorskip("rt4chart.judges.embedded.minilm")
MiniLM, PIECE_ROWS = minilm.MiniLM, minilm.PIECE_ROWS

TOLERANCE = 1e-5
"""Largest absolute difference allowed per component of a unit-length embedding."""

SENTENCES = [
    "The Eiffel Tower was completed in 1889.",
    "Riverton's council voted on Tuesday to raise the bus fare from 2 dollars to 2.50 dollars.",
    "ok",
    # Longer than MiniLM's 128 word pieces: truncated the same way by all.
    " ".join(["The library lends books, maps and seed packets to the residents of Ashford County."] * 12),
]


def reference_embeddings(texts: list[str]) -> np.ndarray:
    """Mean-pooled, normalised BertModel output (what sentence-transformers does for this model)."""
    torch = pytest.importorskip("torch", reason="the reference needs torch (the signals extra)")
    transformers = pytest.importorskip("transformers", reason="the reference needs transformers (the signals extra)")
    directory = model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(directory, local_files_only=True).eval()
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**encoded).last_hidden_state
    mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()


def test_embeddings_equal_transformers_bert_model() -> None:
    ours = MiniLM(model_dir()).encode(SENTENCES)
    assert ours.shape == (len(SENTENCES), 384)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference_embeddings(SENTENCES), rtol=0, atol=TOLERANCE)
    # Padding does not leak into a sentence's embedding: alone or in a batch, the same vector.
    alone = MiniLM(model_dir()).encode(SENTENCES[:1])
    np.testing.assert_allclose(alone[0], ours[0], rtol=0, atol=TOLERANCE)


def test_embeddings_equal_the_torch_implementation() -> None:
    pytest.importorskip("torch", reason="the torch implementation needs torch (the signals extra)")
    from rt4chart.judges.embedded.minilm_torch import TorchMiniLM

    ours = MiniLM(model_dir()).encode(SENTENCES)
    theirs = TorchMiniLM(model_dir()).encode(SENTENCES).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=TOLERANCE)
    # Near-identical sentences stay apart by the same margin (what the verifier ranks on).
    np.testing.assert_allclose(ours @ ours.T, theirs @ theirs.T, rtol=0, atol=TOLERANCE)


def test_concurrent_requests_embed_each_text_once() -> None:
    encoder = SentenceEncoder(model_dir(), threads=2)
    passes: list[list[str]] = []
    forward = encoder.model.encode

    def counting(texts: list[str], *args: Any, **kwargs: Any) -> np.ndarray:
        passes.append(texts)
        return forward(texts, *args, **kwargs)

    encoder.model.encode = counting  # type: ignore[method-assign]
    shared = SENTENCES[:2]
    results: dict[int, np.ndarray] = {}

    def request(number: int) -> None:
        results[number] = encoder.encode([*shared, f"claim number {number}"])

    workers = [threading.Thread(target=request, args=(n,)) for n in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    embedded = [text for batch in passes for text in batch]
    assert sorted(embedded) == sorted({*shared, *(f"claim number {n}" for n in range(6))})
    expected = MiniLM(model_dir()).encode(shared)
    for number in range(6):
        np.testing.assert_allclose(results[number][:2], expected, rtol=0, atol=TOLERANCE)


def test_token_rows_cut_across_threads_give_the_same_numbers_bit_for_bit() -> None:
    model = MiniLM(model_dir())
    texts = SENTENCES * 6
    _, attention = model.checkpoint.token_arrays(texts)
    assert int(attention.sum()) > 3 * PIECE_ROWS  # rows enough for a run of pieces on each of three threads
    with ThreadPoolExecutor(2) as helpers:
        cut = model.encode(texts, helpers, threads=3)
    np.testing.assert_array_equal(cut, model.encode(texts))


def test_a_lone_pass_uses_the_idle_threads_and_a_busy_encoder_does_not() -> None:
    encoder = SentenceEncoder(model_dir(), threads=2)
    threads_asked: list[int] = []
    forward = encoder.model.encode

    def counting(texts: list[str], helpers: Any = None, threads: int = 1) -> np.ndarray:
        threads_asked.append(threads)
        return forward(texts, helpers, threads=threads)

    encoder.model.encode = counting  # type: ignore[method-assign]
    encoder.encode(["A lone request has both threads."])
    with encoder._passes:  # another pass holds the other thread
        encoder.encode(["A request beside another one has its own thread only."])
    assert threads_asked == [2, 1]
