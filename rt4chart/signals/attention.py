"""AggTruth attention-over-context features per layer, head and answer token, and their windows.

AggTruth (Matys et al., "AggTruth: Contextual Hallucination Detection using Aggregated Attention
Scores in LLMs", ICCS 2025 workshops, arXiv 2506.18628) reads, for every generated token t, layer
l and head h, the attention row a_{l,h,t} restricted to the C context (passage) tokens, and reduces
it to one number per (l, h, t):

- **Sum**: ``sum_i a_{l,h,t,i}``, the attention mass on the context;
- **CosSim**: the mean cosine similarity of ``a_{l,h,t}`` to the other H-1 heads of layer l;
- **Entropy** (base 2) of the extended vector ``a' = (a_{l,h,t,1..C}, 1 - Sum)``: the leftover
  mass (attention to everything that is not context) is one extra entry, so ``a'`` sums to 1;
- **JS-Div**: the Jensen-Shannon distance (base 2, the square root of the divergence, in [0, 1])
  between head h's ``a'`` and the mean of ``a'`` over the layer's heads.

Plus one scalar per token, the **passage percentage**: context tokens / tokens the query sees at
that step (``C / (position + 1)``). Windows: 8 consecutive answer tokens sliding by one, features
averaged; a window is positive when any of its tokens overlaps a gold hallucinated span (an answer
shorter than 8 tokens is one window). Answer-level score = the largest window score.

Alignment: the features of answer token t come from the attention computed when the model
predicts token t+1, i.e. the attention row whose QUERY is token t itself. This is what online
detection sees: during generation, token t is fed back and its attention is computed in the step
that produces t+1 (the reviews of the paper describe the features "of a generated token"; the
authors' public code does not show the extraction step, so this reading is ours and the issue's).
Teacher forcing computes every row in one pass; row p is the step that reads token p and outputs
the distribution of token p+1::

    prompt:   [ instructions | c_0 ... c_{C-1} | question, "### Answer" ] [ a_0   a_1   ...  a_{A-1} ]
    position:                  k0 ...  k1-1                               p0    p0+1       p0+A-1
    query row p0+i  -- attends to keys 0..p0+i, of which k0..k1-1 are the context --> predicts a_{i+1}
    features of a_i  =  f( row p0+i, columns k0..k1-1 )        passage percentage = C / (p0 + i + 1)

(a_{A-1}'s row predicts past the answer; it exists in the teacher-forced pass and is kept.)

What the sources say (searched, not remembered): the formulas above match the paper's as restated
in public reviews (Sum over passage tokens; CosSim averaged over h' != h with 1/(H-1); entropy
with log2 over the C+1 entries after appending ``1 - sum``; JS-Div of each head to the layer's
mean distribution). The authors' research code (``Hallucination-LLM/Research``,
``scripts/agg_att_funcs.py``) averages per-token features over the window axis (``np.mean``, with
a commented-out tanh weighting) and appends the passage percentage as one extra feature, which is
what the windows here do (there it is one number per window; here the window's mean of the
per-token values). Not found in public code: the log base and root of the JS term; we use
scipy's ``jensenshannon(base=2)`` convention (a distance in [0, 1]). A head with no attention on
the context has CosSim 0 with every head (cosine of a zero vector, undefined, taken as 0).

Memory: a forward hook on every attention module reduces that layer's ``[heads, T, T]`` map to
its ``[4, A, heads]`` features as soon as the layer produced it; the model never returns the maps
(``output_attentions`` stays off), so at most one layer's map is alive at a time.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import numpy as np
import numpy.typing as npt

from rt4chart.method.text import join_passages
from rt4chart.signals.base import SignalError, Tokenizer, missing_extra
from rt4chart.signals.csr import AnswerTokens, SampleSignalStore, answer_tokens
from rt4chart.signals.template import CsrTemplate, load_csr_template
from rt4chart.types import Sample, Span

FEATURES = ("sum", "cossim", "entropy", "jsdiv")
"""The four AggTruth aggregations, in the order of the feature axis."""
WINDOW = 8
"""Answer tokens per window (the paper's 8)."""
FEATURE_CACHE_FORMAT = 1
"""Bumped when the stored feature format changes; part of every key."""

FloatArray = npt.NDArray[np.float64]
_TINY = float(np.finfo(np.float64).tiny)


@dataclass(frozen=True)
class AttentionPrompt:
    """A sample laid out for one teacher-forced pass: where its context and answer tokens are."""

    ids: list[int]
    """Token ids of the prompt with context, followed by the answer."""
    context_begin: int
    """Index of the first context token."""
    context_end: int
    """Index one past the last context token."""
    answer: AnswerTokens
    """The answer's tokens (first index, ids, character offsets into the answer)."""


@dataclass(frozen=True)
class AttentionFeatures:
    """One answer's AggTruth features."""

    offsets: list[tuple[int, int]]
    """Each answer token's character range in the answer."""
    values: FloatArray
    """``[feature (FEATURES order), token, layer, head]``."""
    passage_fraction: FloatArray
    """``[token]``: context tokens / tokens visible to the query at that step."""

    @property
    def heads(self) -> tuple[int, int]:
        """(layers, heads per layer)."""
        return int(self.values.shape[2]), int(self.values.shape[3])

    def token_matrix(self, feature: str) -> FloatArray:
        """``[token, layer*head + 1]``: one feature's heads (layer-major) and the passage percentage last."""
        index = FEATURES.index(feature)
        tokens = self.values.shape[1]
        return np.concatenate([self.values[index].reshape(tokens, -1), self.passage_fraction[:, None]], axis=1)


def context_char_range(template: CsrTemplate, context: str | list[str], question: str | None) -> tuple[int, int]:
    """Character range of the joined context inside the with-context prefix."""
    joined, _ = join_passages(context)
    source = template.with_context.template
    if source.count("$context") != 1:
        raise SignalError("the prompt template must place $context exactly once")
    before = Template(source.split("$context")[0]).substitute({"question": question or ""})
    return len(before), len(before) + len(joined)


def prepare_prompt(
    sample: Sample, tokenizer: Tokenizer, template: CsrTemplate, max_positions: int | None
) -> AttentionPrompt | str:
    """The sample's prompt with its context and answer token ranges, or why it cannot be read."""
    prefix, _ = template.prefixes(sample.context, sample.question)
    encoding = tokenizer.encode(prefix + sample.answer)
    answer = answer_tokens(encoding, tokenizer.encode(prefix).ids, len(prefix), len(prefix) + len(sample.answer))
    if not answer.ids:
        return "the answer has no tokens"
    covered = {i for start, end in answer.offsets for i in range(start, end)}
    if len(covered) != len(sample.answer):
        return "the model's vocabulary cannot encode some answer characters, so token offsets would be wrong"
    context_start, context_stop = context_char_range(template, sample.context, sample.question)
    if context_stop == context_start:
        return "the context has no tokens"
    inside = [i for i, (start, end) in enumerate(encoding.offsets) if start < context_stop and end > context_start]
    if not inside:
        return "the context has no tokens"
    if max_positions is not None and len(encoding.ids) > max_positions:
        return f"prompt is {len(encoding.ids)} tokens, more than the model's {max_positions}"
    if inside[-1] >= answer.first:
        return "the prompt template must put the context before the answer"
    return AttentionPrompt(encoding.ids, inside[0], inside[-1] + 1, answer)


def reduce_rows(rows: Any, context_begin: int, context_end: int) -> Any:
    """AggTruth features of attention rows: ``[heads, tokens, keys]`` -> ``[4, tokens, heads]`` (torch, float64).

    ``rows`` are the answer tokens' query rows of one layer (each row sums to 1 over its keys);
    the features read columns ``context_begin:context_end`` only. Written to pass over the
    ``[heads, tokens, context]`` block as few times as possible (it runs inside every layer's
    forward): cosines from one Gram product, and the Jensen-Shannon divergence from entropies,
    ``JSD(P, M) = H((P + M) / 2) - H(P) / 2 - H(M) / 2``, where the entropy of the normalised
    extended vector follows from its unnormalised ``sum x log x`` and its total Z:
    ``H(x / Z) = -sum(x log x) / Z + log Z``.
    """
    import torch

    context = rows[:, :, context_begin:context_end].to(torch.float64)
    heads = context.shape[0]
    total = context.sum(dim=-1)
    gram = torch.einsum("htc,gtc->thg", context, context)
    norms = gram.diagonal(dim1=-2, dim2=-1).sqrt()
    products = norms.unsqueeze(-1) * norms.unsqueeze(-2)
    cosines = torch.where(products > 0, gram / products.clamp(min=_TINY), 0.0)
    others = cosines.sum(dim=-1) - cosines.diagonal(dim1=-2, dim2=-1)
    cossim = (others / max(heads - 1, 1)).transpose(0, 1)
    # Rounding can push the mass a hair above 1; the leftover entry is then 0, never negative.
    leftover = (1.0 - total).clamp(min=0.0)
    ln2 = float(np.log(2.0))
    # One scratch buffer and in-place updates: a fresh [heads, tokens, context] tensor per step
    # costs more than the arithmetic on it.
    scratch = context.clamp(min=_TINY)
    x_log_x = scratch.log_().mul_(context).sum(dim=-1) + _x_log_x(leftover)
    entropy = -x_log_x / ln2
    mass = total + leftover
    own = (-x_log_x / mass + mass.log()) / ln2
    shares = context.div_(mass.unsqueeze(-1))
    leftover_shares = leftover / mass
    mean_context = shares.mean(dim=0)
    mean_leftover = leftover_shares.mean(dim=0)
    mean_entropy = -(_x_log_x(mean_context).sum(dim=-1) + _x_log_x(mean_leftover)) / ln2
    doubled = shares.add_(mean_context)  # 2m, where m = (P + M) / 2
    doubled_leftover = leftover_shares + mean_leftover
    torch.clamp(doubled, min=_TINY, out=scratch)
    doubled_x_log_x = scratch.log_().mul_(doubled).sum(dim=-1) + _x_log_x(doubled_leftover)
    doubled_total = doubled.sum(dim=-1) + doubled_leftover
    # sum m ln m = (sum 2m ln 2m) / 2 - ln 2 * (sum 2m) / 2
    mixed_entropy = -(doubled_x_log_x / 2 - ln2 * doubled_total / 2) / ln2
    jsdiv = (mixed_entropy - own / 2 - mean_entropy / 2).clamp(min=0.0).sqrt()
    return torch.stack([total, cossim, entropy, jsdiv]).transpose(1, 2)


def _x_log_x(values: Any) -> Any:
    """``x * ln(x)`` with ``0 ln 0 = 0`` (x >= 0); several times faster on CPU than ``torch.special.xlogy``."""
    return values * values.clamp(min=_TINY).log()


class AttentionExtractor:
    """AggTruth features from an in-process transformers model with eager attention, one layer at a time."""

    def __init__(self, backend: Any) -> None:
        model = backend.model
        if getattr(model.config, "_attn_implementation", "eager") != "eager":
            raise SignalError("attention features need eager attention (open the model with attentions=True)")
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None:
            raise SignalError("attention features need a decoder whose layers are model.model.layers")
        self.backend = backend
        self.layers = len(layers)
        self.heads = int(model.config.num_attention_heads)
        self._reduced: list[Any] = []
        self._window: tuple[int, int, int, int] | None = None
        for layer in layers:
            layer.self_attn.register_forward_hook(self._reduce_layer)

    def _reduce_layer(self, module: Any, inputs: Any, output: Any) -> None:
        if self._window is None:
            return
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise SignalError("the attention module returned no attention weights (eager attention needed)")
        first, last, begin, end = self._window
        self._reduced.append(reduce_rows(weights[0, :, first:last], begin, end))

    def features(self, prompt: AttentionPrompt) -> AttentionFeatures:
        """One teacher-forced pass; each layer's map is reduced inside the pass and then dropped."""
        import torch

        first, count = prompt.answer.first, len(prompt.answer.ids)
        self._reduced, self._window = [], (first, first + count, prompt.context_begin, prompt.context_end)
        try:
            with torch.inference_mode():
                self.backend.model(
                    input_ids=torch.tensor([prompt.ids], device=self.backend.device),
                    use_cache=False,
                    logits_to_keep=1,
                )
        finally:
            self._window = None
        stacked = torch.stack(self._reduced, dim=2).cpu().numpy()
        self._reduced = []
        positions = np.arange(first, first + count, dtype=np.float64)
        fraction = (prompt.context_end - prompt.context_begin) / (positions + 1.0)
        return AttentionFeatures(list(prompt.answer.offsets), stacked, fraction)


def open_attention_extractor(model: Path) -> AttentionExtractor:
    """The model at ``model`` in process with eager attention, ready for AggTruth features.

    Raises :class:`SignalError` when the ``signals`` extra is missing or the model cannot be read.
    """
    absent = missing_extra(model)
    if absent:
        raise SignalError(
            f"attention signals need the 'signals' extra ({', '.join(absent)} not installed): "
            "pip install 'rt4chart[signals]'"
        )
    from rt4chart.signals.transformers_backend import TransformersBackend

    return AttentionExtractor(TransformersBackend(model, attentions=True))


def token_labels(offsets: Sequence[tuple[int, int]], spans: Sequence[Span]) -> npt.NDArray[np.bool_]:
    """Per token: does its character range overlap any gold hallucinated span?"""
    return np.array(
        [any(start < span.end and end > span.start for span in spans) for start, end in offsets], dtype=bool
    )


def window_bounds(tokens: int, size: int = WINDOW) -> list[tuple[int, int]]:
    """``[start, end)`` of every window of ``size`` tokens sliding by one (one window when shorter)."""
    if tokens <= 0:
        return []
    if tokens <= size:
        return [(0, tokens)]
    return [(start, start + size) for start in range(tokens - size + 1)]


def window_average(matrix: FloatArray, size: int = WINDOW) -> FloatArray:
    """``[window, columns]``: the mean of each window's token rows."""
    return np.stack([matrix[start:end].mean(axis=0) for start, end in window_bounds(len(matrix), size)])


def window_labels(labels: npt.NDArray[np.bool_], size: int = WINDOW) -> npt.NDArray[np.bool_]:
    """A window is positive when any of its tokens is."""
    return np.array([bool(labels[start:end].any()) for start, end in window_bounds(len(labels), size)], dtype=bool)


def token_scores_from_windows(window_scores: Sequence[float], tokens: int, size: int = WINDOW) -> list[float]:
    """Each token's score: the largest score of the windows that hold it."""
    scores = [float("-inf")] * tokens
    for (start, end), score in zip(window_bounds(tokens, size), window_scores, strict=True):
        for index in range(start, end):
            scores[index] = max(scores[index], float(score))
    return scores


class FeatureCache(SampleSignalStore):
    """Extracted AggTruth features per sample (npz bytes), so a sample passes through the model once.
    Stored as float32 (half the disk; probes and windows do not need more)."""

    SIGNAL = "aggtruth"
    FORMAT = FEATURE_CACHE_FORMAT

    def get(self, key: str) -> AttentionFeatures | None:
        return self._read(key, _decode_features)

    def put(self, key: str, features: AttentionFeatures) -> None:
        buffer = io.BytesIO()
        np.savez(
            buffer,
            offsets=np.array(features.offsets, dtype=np.int64).reshape(-1, 2),
            values=features.values.astype(np.float32),
            fraction=features.passage_fraction.astype(np.float32),
        )
        self._write(key, buffer.getvalue())


def _decode_features(stored: bytes) -> AttentionFeatures:
    with np.load(io.BytesIO(stored)) as arrays:
        offsets = [(int(a), int(b)) for a, b in arrays["offsets"]]
        return AttentionFeatures(offsets, arrays["values"].astype(np.float64), arrays["fraction"].astype(np.float64))


@dataclass
class FeatureOutcome:
    """One sample's features, or why it has none."""

    features: AttentionFeatures | None
    error: str | None = None
    cached: bool = False


def extract_features(
    samples: Sequence[Sample],
    extractor: AttentionExtractor,
    *,
    cache: FeatureCache | None = None,
    template: CsrTemplate | None = None,
) -> list[FeatureOutcome]:
    """AggTruth features of every sample's answer (cache first, then one pass per sample)."""
    template = template or load_csr_template()
    backend = extractor.backend
    outcomes = []
    for sample in samples:
        key = FeatureCache.key(backend.identity, template.version, sample)
        hit = cache.get(key) if cache is not None else None
        if hit is not None:
            outcomes.append(FeatureOutcome(hit, cached=True))
            continue
        prompt = prepare_prompt(sample, backend, template, backend.max_positions)
        if isinstance(prompt, str):
            outcomes.append(FeatureOutcome(None, prompt))
            continue
        features = extractor.features(prompt)
        if cache is not None:
            cache.put(key, features)
        outcomes.append(FeatureOutcome(features))
    return outcomes
