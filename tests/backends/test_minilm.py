"""The plain-torch MiniLM encoder computes what transformers' BertModel computes on the same files."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("torch", reason="needs torch (the embedded extra)")
pytest.importorskip("transformers", reason="needs transformers (the embedded extra)")

import torch
import transformers

from rt4chart.judges.embedded.minilm import MiniLM
from rt4chart.judges.embedded.verifier import SentenceEncoder, model_dir

SENTENCES = [
    "The Eiffel Tower was completed in 1889.",
    "Riverton's council voted on Tuesday to raise the bus fare from 2 dollars to 2.50 dollars.",
    "ok",
    # Longer than MiniLM's 128 word pieces: truncated the same way by both.
    " ".join(["The library lends books, maps and seed packets to the residents of Ashford County."] * 12),
]


def reference_embeddings(texts: list[str]) -> torch.Tensor:
    """Mean-pooled, normalised BertModel output (what sentence-transformers does for this model)."""
    directory = model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(directory, local_files_only=True).eval()
    encoded = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**encoded).last_hidden_state
    mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    return torch.nn.functional.normalize(pooled, p=2, dim=1)


def test_embeddings_equal_transformers_bert_model() -> None:
    ours = MiniLM(model_dir()).encode(SENTENCES)
    assert ours.shape == (len(SENTENCES), 384)
    assert torch.allclose(ours, reference_embeddings(SENTENCES), atol=1e-5)
    # Padding does not leak into a sentence's embedding: alone or in a batch, the same vector.
    alone = MiniLM(model_dir()).encode(SENTENCES[:1])
    assert torch.allclose(alone[0], ours[0], atol=1e-5)


def test_concurrent_requests_embed_each_text_once() -> None:
    encoder = SentenceEncoder(model_dir(), threads=2)
    passes: list[list[str]] = []
    forward = encoder.model.encode

    def counting(texts: list[str]) -> torch.Tensor:
        passes.append(texts)
        return forward(texts)

    encoder.model.encode = counting  # type: ignore[method-assign]
    shared = SENTENCES[:2]
    results: dict[int, torch.Tensor] = {}

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
        assert torch.allclose(results[number][:2], expected, atol=1e-5)
