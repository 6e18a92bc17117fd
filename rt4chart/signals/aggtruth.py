"""AggTruth end to end: features -> a trained probe -> window and token scores, records and spans.

What ``rt4 signals attention`` writes (one record per input line) and what ``rt4 verify --signals
attention`` adds to finished audit records (the answer's scores plus each claim's mean and max
token score over its answer span); also the training data of ``rt4 signals train`` (samples with
gold spans, as ``rt4 convert`` writes them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from rt4chart.records.io import InputLine
from rt4chart.signals.attention import (
    AttentionExtractor,
    AttentionFeatures,
    FeatureCache,
    FeatureOutcome,
    extract_features,
    open_attention_extractor,
    token_scores_from_windows,
    window_average,
    window_bounds,
)
from rt4chart.signals.base import SignalError
from rt4chart.signals.csr import attach_token_signal, flagged_spans
from rt4chart.signals.probe import (
    AttentionProbe,
    Selector,
    WindowSet,
    build_windows,
    load_probe,
    train_probe,
    training_hash,
)
from rt4chart.signals.template import load_csr_template
from rt4chart.types import AttentionSignalReport, AuditRecord, ProbeTokenScore, ProbeWindowScore, Sample, Span


@dataclass(frozen=True)
class AttentionSetup:
    """An opened attention model with its probe (what ``rt4 signals attention`` and ``rt4 verify
    --signals attention`` share)."""

    extractor: AttentionExtractor
    probe: AttentionProbe
    name: str
    """How records name the probe (:func:`probe_label`)."""


def open_attention_probe(model: Path, probe_path: Path) -> AttentionSetup:
    """Load the probe (cheap, checked first), then open the model it was trained on; raises
    :class:`SignalError` when either cannot be used or they do not belong together."""
    probe = load_probe(probe_path)
    extractor = open_attention_extractor(model)
    probe.check_model(extractor.backend.identity)
    return AttentionSetup(extractor, probe, probe_label(probe, probe_path))


def probe_label(probe: AttentionProbe, path: Path) -> str:
    """How records name a probe: its feature, selector and file hash."""
    return f"{probe.feature}/{probe.selector}#{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"


def score_answer(
    answer: str, features: AttentionFeatures, probe: AttentionProbe, *, name: str, model: str, cached: bool
) -> AttentionSignalReport:
    """The probe's window scores, token scores (largest window holding the token) and flagged spans."""
    window_scores = probe.window_scores(window_average(features.token_matrix(probe.feature), probe.window)).tolist()
    bounds = window_bounds(len(features.offsets), probe.window)
    token_scores = token_scores_from_windows(window_scores, len(features.offsets), probe.window)
    tokens = [
        ProbeTokenScore(start=start, end=end, score=score, flagged=score >= probe.threshold)
        for (start, end), score in zip(features.offsets, token_scores, strict=True)
    ]
    windows = [
        ProbeWindowScore(start=features.offsets[first][0], end=features.offsets[last - 1][1], score=score)
        for (first, last), score in zip(bounds, window_scores, strict=True)
    ]
    return AttentionSignalReport(
        model=model,
        template_version=probe.template_version,
        probe=name,
        threshold=probe.threshold,
        score=max(window_scores),
        windows=windows,
        tokens=tokens,
        spans=flagged_spans(answer, tokens),
        flagged=any(score >= probe.threshold for score in window_scores),
        cached=cached,
    )


def score_samples(
    samples: Sequence[Sample],
    extractor: AttentionExtractor,
    probe: AttentionProbe,
    probe_name: str,
    cache: FeatureCache | None,
) -> list[AttentionSignalReport | str]:
    """Per sample, its attention report or why it has none."""
    identity = extractor.backend.identity
    probe.check_model(identity)
    template = load_csr_template()
    if probe.template_version != template.version:
        raise SignalError(
            f"the probe was trained with prompt template {probe.template_version}, not {template.version}"
        )
    if (probe.layers, probe.heads) != (extractor.layers, extractor.heads):
        raise SignalError(
            f"the probe reads {probe.layers}x{probe.heads} heads; the model has {extractor.layers}x{extractor.heads}"
        )
    results: list[AttentionSignalReport | str] = []
    for sample, outcome in zip(
        samples, extract_features(samples, extractor, cache=cache, template=template), strict=True
    ):
        if outcome.features is None:
            results.append(outcome.error or "no features")
            continue
        results.append(
            score_answer(sample.answer, outcome.features, probe, name=probe_name, model=identity, cached=outcome.cached)
        )
    return results


class AttentionRecord(BaseModel):
    """One output line of ``rt4 signals attention``: an input line's probe scores, or why it has none."""

    id: str | None
    """Sample id, or ``None`` when the line could not be read."""
    line: int
    """1-based line number in the input file."""
    attention: AttentionSignalReport | None = None
    """Window and token scores and flagged spans; ``None`` on error."""
    errors: list[str] = Field(default_factory=list)
    """Why the line has no scores."""

    @property
    def flagged(self) -> bool:
        """Whether the probe flagged any span of the answer."""
        return bool(self.attention and self.attention.flagged)


def attention_records(
    items: Sequence[InputLine],
    extractor: AttentionExtractor,
    probe: AttentionProbe,
    probe_name: str,
    cache: FeatureCache | None = None,
) -> list[AttentionRecord]:
    """One record per input line, in input order."""
    valid = [item for item in items if item.sample is not None]
    scored = score_samples([item.sample for item in valid if item.sample], extractor, probe, probe_name, cache)
    by_line = {item.line: result for item, result in zip(valid, scored, strict=True)}
    records = []
    for item in items:
        if item.sample is None:
            records.append(AttentionRecord(id=item.raw_id, line=item.line, errors=[item.error or "invalid input"]))
            continue
        result = by_line[item.line]
        if isinstance(result, str):
            records.append(AttentionRecord(id=item.sample.id, line=item.line, errors=[result]))
        else:
            records.append(AttentionRecord(id=item.sample.id, line=item.line, attention=result))
    return records


def attach_attention(
    reports: Sequence[AuditRecord], results: dict[int, AttentionSignalReport | str]
) -> list[AuditRecord]:
    """Reports with their answer's probe scores and each claim's mean/max token score over its span
    (``probe_mean`` / ``probe_max`` in the claim's ``signals``)."""
    scored: dict[int, tuple[AttentionSignalReport, Sequence[tuple[int, int, float]]] | str] = {
        line: r if isinstance(r, str) else (r, [(t.start, t.end, t.score) for t in r.tokens])
        for line, r in results.items()
    }
    return attach_token_signal(reports, scored, name="probe", failure="attention signals")


def gold_samples(items: Sequence[InputLine]) -> list[Sample]:
    """The samples of a gold file (``rt4 convert`` output); a line without gold is a :class:`SignalError`."""
    samples = []
    for item in items:
        if item.sample is None:
            raise SignalError(f"line {item.line}: {item.error or 'invalid input'}")
        if item.sample.gold is None:
            raise SignalError(f"line {item.line}: no gold labels (train on the output of rt4 convert)")
        samples.append(item.sample)
    return samples


def training_windows(
    samples: Sequence[Sample], extractor: AttentionExtractor, feature: str, cache: FeatureCache | None
) -> tuple[WindowSet, list[FeatureOutcome]]:
    """Window features and labels of the gold samples (a sample that cannot be read is an error)."""
    outcomes = extract_features(samples, extractor, cache=cache)
    for sample, outcome in zip(samples, outcomes, strict=True):
        if outcome.features is None:
            raise SignalError(f"sample {sample.id}: {outcome.error}")
    spans: list[list[Span]] = [list(s.gold.spans) if s.gold else [] for s in samples]
    return build_windows([o.features for o in outcomes if o.features is not None], spans, feature), outcomes


def train_from_gold(
    samples: Sequence[Sample],
    extractor: AttentionExtractor,
    *,
    feature: str,
    selector: Selector,
    cache: FeatureCache | None = None,
    seed: int = 0,
) -> AttentionProbe:
    """Extract (or read cached) features of the gold samples and train a probe on them."""
    windows, _ = training_windows(samples, extractor, feature, cache)
    spans = [list(s.gold.spans) if s.gold else [] for s in samples]
    return train_probe(
        windows,
        feature=feature,
        selector=selector,
        model=extractor.backend.identity,
        template_version=load_csr_template().version,
        data_sha256=training_hash([s.id for s in samples], [s.answer for s in samples], spans),
        seed=seed,
    )
