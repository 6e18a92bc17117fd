"""AggTruth features: the torch reduction equals a plain numpy/scipy reference (hand-made and real
SmolLM2 attention), the t+1 alignment and window labelling on hand-made inputs with known answers."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the signals extra)")
pytest.importorskip("transformers", reason="needs transformers (the signals extra)")

import torch
from conftest import require_smollm2
from scipy.spatial.distance import jensenshannon

from rt4chart.signals.attention import (
    AttentionExtractor,
    FeatureCache,
    extract_features,
    prepare_prompt,
    reduce_rows,
    token_labels,
    token_scores_from_windows,
    window_average,
    window_bounds,
    window_labels,
)
from rt4chart.signals.template import load_csr_template
from rt4chart.signals.transformers_backend import TransformersBackend
from rt4chart.types import Sample, Span

SAMPLE = Sample(
    id="trial",
    context=["The free trial lasts 14 days.", "Only verified new users are eligible."],
    question="How long is the free trial?",
    answer="The free trial lasts 21 days and anyone can join.",
)


def reference_features(rows: np.ndarray, begin: int, end: int) -> np.ndarray:
    """Plain loops over heads and tokens: ``[heads, tokens, keys]`` -> ``[4, tokens, heads]``."""
    heads, tokens, _ = rows.shape
    out = np.zeros((4, tokens, heads))
    for t in range(tokens):
        vectors = [rows[h, t, begin:end].astype(np.float64) for h in range(heads)]
        extended = []
        for h in range(heads):
            mass = float(np.sum(vectors[h]))
            extended.append(np.append(vectors[h], max(1.0 - mass, 0.0)))
        mean = np.mean(extended, axis=0)
        for h in range(heads):
            v = vectors[h]
            out[0, t, h] = np.sum(v)
            sims = []
            for g in range(heads):
                if g != h:
                    denominator = np.linalg.norm(v) * np.linalg.norm(vectors[g])
                    sims.append(float(np.dot(v, vectors[g]) / denominator) if denominator > 0 else 0.0)
            out[1, t, h] = np.mean(sims)
            p = extended[h]
            nonzero = p[p > 0]
            out[2, t, h] = -np.sum(nonzero * np.log2(nonzero))
            out[3, t, h] = jensenshannon(p, mean, base=2)
    return out


def random_rows(rng: np.random.Generator, heads: int, tokens: int, keys: int) -> np.ndarray:
    logits = rng.normal(size=(heads, tokens, keys)) * 3
    weights = np.exp(logits)
    weights[..., : keys // 4] *= rng.uniform(0, 3, size=(heads, tokens, 1))  # uneven context mass
    weights[0, 0, 2:6] = 0.0  # exact zeros inside the context
    return weights / weights.sum(axis=-1, keepdims=True)


def test_features_equal_numpy_reference_on_hand_made_rows() -> None:
    rng = np.random.default_rng(0)
    rows = random_rows(rng, heads=5, tokens=7, keys=40)
    got = reduce_rows(torch.tensor(rows, dtype=torch.float32), 3, 30).numpy()
    expected = reference_features(rows.astype(np.float32), 3, 30)
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


def test_features_of_known_distributions() -> None:
    # Two heads over 4 keys, context = keys 0..1.
    rows = np.array([[[0.5, 0.5, 0.0, 0.0]], [[0.25, 0.0, 0.75, 0.0]]])
    got = reduce_rows(torch.tensor(rows), 0, 2).numpy()[:, 0]
    np.testing.assert_allclose(got[0], [1.0, 0.25])  # mass on the context
    cos = 0.5 * 0.25 / (np.sqrt(0.5) * 0.25)
    np.testing.assert_allclose(got[1], [cos, cos])  # symmetric for two heads
    np.testing.assert_allclose(got[2], [1.0, -(0.25 * np.log2(0.25) + 0.75 * np.log2(0.75))])
    # extended: (0.5, 0.5, 0) and (0.25, 0, 0.75), their mean (0.375, 0.25, 0.375)
    assert got[3][0] == pytest.approx(jensenshannon([0.5, 0.5, 0], [0.375, 0.25, 0.375], base=2))
    assert got[3][1] == pytest.approx(jensenshannon([0.25, 0, 0.75], [0.375, 0.25, 0.375], base=2))
    assert got[3][0] != pytest.approx(got[3][1])


def test_a_head_without_context_mass_has_cosine_zero_and_entropy_zero() -> None:
    rows = np.array([[[0.0, 0.0, 1.0]], [[0.6, 0.2, 0.2]]])
    got = reduce_rows(torch.tensor(rows), 0, 2).numpy()[:, 0]
    assert got[0][0] == 0.0 and got[1][0] == 0.0 and got[1][1] == 0.0
    assert got[2][0] == 0.0  # all the mass in the leftover entry


def test_windows_and_their_labels() -> None:
    assert window_bounds(3) == [(0, 3)]
    assert window_bounds(10) == [(0, 8), (1, 9), (2, 10)]
    assert window_bounds(0) == []
    labels = np.zeros(12, dtype=bool)
    labels[0] = True
    assert window_labels(labels).tolist() == [True, False, False, False, False]
    labels[:] = False
    labels[11] = True
    assert window_labels(labels).tolist() == [False, False, False, False, True]
    matrix = np.arange(20, dtype=np.float64).reshape(10, 2)
    np.testing.assert_allclose(window_average(matrix)[1], matrix[1:9].mean(axis=0))
    assert token_scores_from_windows([0.1, 0.9, 0.2], 10) == [0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.2]


def test_token_labels_follow_character_overlap() -> None:
    offsets = [(0, 3), (3, 8), (8, 9), (9, 14)]
    assert token_labels(offsets, [Span(start=4, end=9)]).tolist() == [False, True, True, False]
    assert token_labels(offsets, []).tolist() == [False] * 4


@pytest.fixture(scope="module")
def backend() -> TransformersBackend:
    torch.set_num_threads(2)
    return TransformersBackend(require_smollm2(), attentions=True)


@pytest.fixture(scope="module")
def extractor(backend: TransformersBackend) -> AttentionExtractor:
    return AttentionExtractor(backend)


def test_hooks_match_full_attention_maps_of_smollm2_with_t_plus_1_alignment(extractor: AttentionExtractor) -> None:
    backend = extractor.backend
    prompt = prepare_prompt(SAMPLE, backend, load_csr_template(), backend.max_positions)
    assert not isinstance(prompt, str)
    # The context range holds exactly the passages' tokens.
    text = backend.tokenizer.hf.decode(prompt.ids[prompt.context_begin : prompt.context_end])
    assert text.strip().startswith("The free trial") and text.strip().endswith("eligible.")
    features = extractor.features(prompt)
    with torch.inference_mode():
        maps = backend.model(input_ids=torch.tensor([prompt.ids]), output_attentions=True, use_cache=False).attentions
    first, count = prompt.answer.first, len(prompt.answer.ids)
    assert features.values.shape == (4, count, extractor.layers, extractor.heads)
    for layer in (0, 7, extractor.layers - 1):
        # Token a_i's features come from query row first + i (the step that predicts a_{i+1}).
        rows = maps[layer][0, :, first : first + count].numpy()
        expected = reference_features(rows, prompt.context_begin, prompt.context_end)
        np.testing.assert_allclose(features.values[:, :, layer, :], expected, atol=1e-6, rtol=0)
        shifted = reference_features(
            maps[layer][0, :, first - 1 : first + count - 1].numpy(), prompt.context_begin, prompt.context_end
        )
        assert np.abs(features.values[0, :, layer, :] - shifted[0]).max() > 1e-3  # the row before is another row
    context = prompt.context_end - prompt.context_begin
    np.testing.assert_allclose(features.passage_fraction, context / (np.arange(first, first + count) + 1.0))
    assert features.offsets[0] == (0, 3)


def test_feature_cache_round_trip(extractor: AttentionExtractor, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cache = FeatureCache(tmp_path)
    first = extract_features([SAMPLE], extractor, cache=cache)[0]
    again = extract_features([SAMPLE], extractor, cache=cache)[0]
    assert first.features is not None and again.features is not None and again.cached and not first.cached
    np.testing.assert_allclose(again.features.values, first.features.values, atol=1e-6)
    assert again.features.offsets == first.features.offsets


def test_sample_without_context_tokens_gets_an_error(extractor: AttentionExtractor) -> None:
    outcome = extract_features([SAMPLE.model_copy(update={"context": ""})], extractor)[0]
    assert outcome.features is None and outcome.error == "the context has no tokens"
