"""REFIND's context sensitivity ratio (CSR) per answer token, flagged spans, and claim summaries.

For each answer token t_i, both terms by teacher forcing the given answer under the same model::

    CSR(t_i) = log p(t_i | D, q, t_<i) / (log p(t_i | q, t_<i) + 1e-8)

D = context, q = question (:mod:`rt4chart.signals.template` places them). Tokens with
``CSR >= delta`` are flagged and merged into answer character spans.

What the REFIND sources say (checked, not remembered):

- The paper (Lee & Yu, "REFIND at SemEval-2025 Task 3", arXiv 2502.13622) defines the ratio as
  above: the log-probability WITH the retrieved documents in the numerator, WITHOUT them in the
  denominator, epsilon added to the denominator, and flags tokens whose CSR exceeds delta (the
  paper sweeps delta over 0.1-0.4). Both log-probabilities are <= 0, so CSR >= 0: CSR < 1 when
  the context made the token more likely (the context explains it), about 1 when the context
  changed nothing, > 1 when the context made it less likely. High CSR = not supported by D.
- The public code (``oneonlee/REFIND``, ``model/REFIND.py``) differs from the paper: it scores each
  output token by re-running the model on the decoded prefix and takes that token's raw logit,
  then applies a softmax ACROSS THE OUTPUT POSITIONS (not over the vocabulary), so its
  "probabilities" are not token probabilities; its conditions compare ``p_without / (p_with +
  1e-8)`` (question-only over context-given, the inverse direction, no logarithm) with thresholds
  0.1-0.9 and smaller, and it appends EOS to the answer. We follow the paper's formula, which the
  issue specifies, with true log-softmax probabilities, and append nothing to the answer.
- Edge case kept literal: when ``log p(t_i | q)`` rounds to exactly 0, the denominator is +1e-8
  and CSR becomes a large negative number (never flagged), as the formula says.

Token-to-answer alignment: the answer is tokenized as part of each prompt (prefix + answer), so
its tokens are the ones the model really sees; the fast tokenizer's offset mapping gives each
token's characters. A token belongs to the answer if its range overlaps the answer; a token that
straddles the prefix/answer boundary is kept with its range clipped to the answer (its
log-probability is that of the whole token, prefix characters included). Byte-level BPE can also
merge the prefix's last character with the first bytes of a multi-byte answer character while the
offset mapping names only the prefix character: such a token is found where the joint
tokenization departs from the prefix's own, and gets the answer's first character as its range.
Byte-level tokens that hold part of a multi-byte character all map to that character, so
consecutive tokens may share a range. A vocabulary that lacks some byte tokens (SmolLM2 has none for
U+0016 or for the lead byte of Unicode planes 4-7) makes the tokenizer drop those bytes and shift
the offsets after them; an answer whose tokens then leave a character uncovered gets an error. Both prefixes end
with the same text, so the answer tokenizes identically under both; a sample where it does not
(or that is longer than the model's context) gets an error instead of values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import diskcache
import platformdirs
from pydantic import BaseModel, Field

from rt4chart.records.io import InputLine
from rt4chart.signals.base import LogprobBackend, ScoreRequest, TokenizedText
from rt4chart.signals.template import CsrTemplate, load_csr_template
from rt4chart.types import AttentionSignalReport, AuditRecord, ProbeTokenScore, Sample, SignalReport, Span, TokenSignal

CSR_EPSILON = 1e-8
"""Added to the denominator, as in the REFIND paper."""
DEFAULT_DELTA = 0.2
T = TypeVar("T")

SIGNAL_CACHE_FORMAT = 1
"""Bumped when the stored value format changes; part of every key."""


def context_sensitivity_ratio(logprob_with_context: float, logprob_without_context: float) -> float:
    """``log p(t | D, q) / (log p(t | q) + 1e-8)``."""
    return logprob_with_context / (logprob_without_context + CSR_EPSILON)


@dataclass(frozen=True)
class AnswerTokens:
    """The answer's tokens inside one tokenized prompt."""

    first: int
    """Index of the first answer token in the prompt's token ids."""
    ids: list[int]
    """The answer tokens' ids."""
    offsets: list[tuple[int, int]]
    """Each answer token's character range in the answer, clipped to it."""


def answer_tokens(
    encoding: TokenizedText, prefix_ids: Sequence[int], answer_start: int, answer_end: int
) -> AnswerTokens:
    """Answer tokens of ``prefix + answer`` tokenized as one text (the answer is ``[answer_start, answer_end)``).

    A token is the answer's when its offsets overlap the answer, or when it lies past the point
    where the joint tokenization stops agreeing with the prefix tokenized alone (``prefix_ids``):
    byte-level BPE can merge the prefix's last character with the first BYTES of a multi-byte
    answer character, and the offset mapping then names only the prefix character. Such a token
    gets the range of the answer's first character.
    """
    overlapping = [i for i, (start, end) in enumerate(encoding.offsets) if start < answer_end and end > answer_start]
    if not overlapping:
        return AnswerTokens(len(encoding.ids), [], [])
    shared = 0
    while shared < min(len(prefix_ids), len(encoding.ids)) and encoding.ids[shared] == prefix_ids[shared]:
        shared += 1
    first = min(overlapping[0], shared)
    first_char_end = min(encoding.offsets[overlapping[0]][1], answer_end) - answer_start
    offsets = []
    for start, end in encoding.offsets[first : overlapping[-1] + 1]:
        clipped = (max(start, answer_start) - answer_start, min(end, answer_end) - answer_start)
        offsets.append(clipped if clipped[1] > clipped[0] else (0, first_char_end))
    return AnswerTokens(first, encoding.ids[first : overlapping[-1] + 1], offsets)


def flagged_spans(answer: str, tokens: Sequence[TokenSignal | ProbeTokenScore]) -> list[Span]:
    """Flagged tokens merged where they touch or overlap, whitespace at span edges trimmed."""
    merged: list[list[int]] = []
    for token in tokens:
        if not token.flagged:
            continue
        if merged and token.start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], token.end)
        else:
            merged.append([token.start, token.end])
    spans = []
    for start, end in merged:
        text = answer[start:end]
        trimmed_start = start + len(text) - len(text.lstrip())
        trimmed_end = end - (len(text) - len(text.rstrip()))
        if trimmed_end > trimmed_start:
            spans.append(Span(start=trimmed_start, end=trimmed_end))
    return spans


def default_signal_cache_dir() -> Path:
    """Per-user signal cache (``~/.cache/rt4chart/signals`` on Linux)."""
    return Path(platformdirs.user_cache_dir("rt4chart")) / "signals"


class SampleSignalStore:
    """A diskcache directory of one signal's per-sample values, so a text passes through a model once
    per model. Subclasses name the signal and its value format and encode/decode the values.

    The key covers the signal, its value format, the model identity (name and content hash, or
    server), the template version and the full context, question and answer. A damaged entry is a
    miss; a write that fails (full or read-only disk) never stops a run.
    """

    SIGNAL: ClassVar[str]
    FORMAT: ClassVar[int]

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or default_signal_cache_dir()
        self._store = diskcache.Cache(str(self.directory))

    @classmethod
    def key(cls, model: str, template_version: str, sample: Sample) -> str:
        material = {
            "format": cls.FORMAT,
            "signal": cls.SIGNAL,
            "model": model,
            "template": template_version,
            "context": sample.context,
            "question": sample.question,
            "answer": sample.answer,
        }
        return hashlib.sha256(json.dumps(material, sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    def _read(self, key: str, decode: Callable[[Any], T]) -> T | None:
        try:
            stored = self._store.get(key)
            return None if stored is None else decode(stored)
        except Exception:  # a damaged entry is a miss
            return None

    def _write(self, key: str, value: str | bytes) -> None:
        try:
            self._store.set(key, value)
        except Exception:  # a full or read-only disk must not stop a run
            return

    def close(self) -> None:
        self._store.close()


class SignalCache(SampleSignalStore):
    """Teacher-forced log-probability pairs per sample; the value holds the per-token
    log-probabilities and offsets, not the flags, so changing delta needs no model call."""

    SIGNAL = "csr"
    FORMAT = SIGNAL_CACHE_FORMAT

    def get(self, key: str) -> list[tuple[int, int, float, float]] | None:
        return self._read(key, _decode_rows)

    def put(self, key: str, rows: list[tuple[int, int, float, float]]) -> None:
        self._write(key, json.dumps(rows))


def _decode_rows(stored: str) -> list[tuple[int, int, float, float]]:
    return [(int(a), int(b), float(c), float(d)) for a, b, c, d in json.loads(stored)]


@dataclass
class CsrOutcome:
    """One sample's CSR, or why it has none."""

    report: SignalReport | None
    error: str | None = None


@dataclass
class _Pending:
    index: int
    key: str
    answer: AnswerTokens
    with_context: ScoreRequest
    without_context: ScoreRequest


def compute_csr(
    samples: Sequence[Sample],
    backend: LogprobBackend,
    *,
    delta: float = DEFAULT_DELTA,
    cache: SignalCache | None = None,
    template: CsrTemplate | None = None,
) -> list[CsrOutcome]:
    """CSR of every sample's answer tokens; all uncached passes go to the backend in one call."""
    template = template or load_csr_template()
    rows: list[list[tuple[int, int, float, float]] | None] = [None] * len(samples)
    cached = [False] * len(samples)
    errors: list[str | None] = [None] * len(samples)
    pending: list[_Pending] = []
    for index, sample in enumerate(samples):
        key = SignalCache.key(backend.identity, template.version, sample)
        hit = cache.get(key) if cache is not None else None
        if hit is not None:
            rows[index], cached[index] = hit, True
            continue
        prepared = prepare_requests(sample, backend, template)
        if isinstance(prepared, str):
            errors[index] = prepared
            continue
        answer, with_context, without_context = prepared
        pending.append(_Pending(index, key, answer, with_context, without_context))
    requests = [request for item in pending for request in (item.with_context, item.without_context)]
    scores = backend.score(requests) if requests else []
    for position, item in enumerate(pending):
        with_scores, without_scores = scores[2 * position], scores[2 * position + 1]
        computed = [
            (start, end, with_scores[i], without_scores[i]) for i, (start, end) in enumerate(item.answer.offsets)
        ]
        rows[item.index] = computed
        if cache is not None:
            cache.put(item.key, computed)
    outcomes = []
    for index, sample in enumerate(samples):
        sample_rows = rows[index]
        if sample_rows is None:
            outcomes.append(CsrOutcome(None, errors[index]))
            continue
        tokens = [
            TokenSignal(
                start=start,
                end=end,
                logprob_with_context=with_lp,
                logprob_without_context=without_lp,
                csr=(ratio := context_sensitivity_ratio(with_lp, without_lp)),
                flagged=ratio >= delta,
            )
            for start, end, with_lp, without_lp in sample_rows
        ]
        spans = flagged_spans(sample.answer, tokens)
        report = SignalReport(
            signal="csr",
            model=backend.identity,
            template_version=template.version,
            delta=delta,
            tokens=tokens,
            spans=spans,
            flagged=any(token.flagged for token in tokens),
            cached=cached[index],
        )
        outcomes.append(CsrOutcome(report))
    return outcomes


def prepare_requests(
    sample: Sample, backend: LogprobBackend, template: CsrTemplate
) -> tuple[AnswerTokens, ScoreRequest, ScoreRequest] | str:
    """The two teacher-forcing requests of a sample, or why it cannot be scored."""
    prefixes = template.prefixes(sample.context, sample.question)
    located = []
    for prefix in prefixes:
        encoding = backend.encode(prefix + sample.answer)
        answer = answer_tokens(encoding, backend.encode(prefix).ids, len(prefix), len(prefix) + len(sample.answer))
        located.append((encoding, answer))
    (with_encoding, with_answer), (without_encoding, without_answer) = located
    if not with_answer.ids:
        return "the answer has no tokens"
    covered = {i for start, end in with_answer.offsets for i in range(start, end)}
    if len(covered) != len(sample.answer):
        # The tokenizer dropped bytes it has no token for and shifted the offsets after them.
        return "the model's vocabulary cannot encode some answer characters, so token offsets would be wrong"
    if with_answer.ids != without_answer.ids or with_answer.offsets != without_answer.offsets:
        return "the answer tokenizes differently with and without the context; check the prompt template"
    limit = backend.max_positions
    if limit is not None and len(with_encoding.ids) > limit:
        return f"prompt with context is {len(with_encoding.ids)} tokens, more than the model's {limit}"
    if with_answer.first < 1:
        return "the prompt template must put at least one token before the answer"
    return (
        with_answer,
        ScoreRequest(with_encoding.ids, with_answer.first),
        ScoreRequest(without_encoding.ids, without_answer.first),
    )


def span_mean_max(tokens: Sequence[tuple[int, int, float]], span: Span | None) -> tuple[float | None, float | None]:
    """Mean and max of the token values ``(start, end, value)`` that overlap ``span`` (a claim's
    answer span); ``(None, None)`` when there is no span or no token in it."""
    values = [value for start, end, value in tokens if span and start < span.end and end > span.start]
    return (sum(values) / len(values), max(values)) if values else (None, None)


def attach_token_signal(
    reports: Sequence[AuditRecord],
    results: Mapping[int, tuple[SignalReport | AttentionSignalReport, Sequence[tuple[int, int, float]]] | str],
    *,
    name: str,
    failure: str,
) -> list[AuditRecord]:
    """Reports enriched with one token-level signal (the one mechanism under ``--signals csr`` and
    ``--signals attention``): the sample's token scores under ``signal_tokens``, the answer's largest
    token value as ``signals[name + "_max"]``, and each claim's mean and max token value over its
    answer span as ``signals[name + "_mean"]`` / ``signals[name + "_max"]``.

    ``results`` is keyed by the report's input line: the signal with its token values ``(start,
    end, value)``, or why the sample has none (added to its ``errors`` after ``failure``). A report
    without a result is returned as is.
    """
    attached = []
    for report in reports:
        result = results.get(report.line)
        if result is None:
            attached.append(report)
            continue
        if isinstance(result, str):
            attached.append(report.model_copy(update={"errors": [*report.errors, f"{failure}: {result}"]}))
            continue
        signal, tokens = result
        claims = []
        for claim in report.claims:
            mean, largest = span_mean_max(tokens, claim.answer_span)
            values = {} if mean is None or largest is None else {f"{name}_mean": mean, f"{name}_max": largest}
            claims.append(claim.model_copy(update={"signals": {**claim.signals, **values}}))
        answer = {f"{name}_max": max(value for _, _, value in tokens)} if tokens else {}
        attached.append(report.model_copy(update={
            "signal_tokens": {**report.signal_tokens, signal.signal: signal},
            "signals": {**report.signals, **answer},
            "claims": claims,
        }))
    return attached


def attach_signals(reports: Sequence[AuditRecord], outcomes: dict[int, CsrOutcome]) -> list[AuditRecord]:
    """Reports with their sample's CSR signals and each claim's mean/max CSR over its answer span;
    a sample whose signal failed gets the failure in its ``errors``."""
    results: dict[int, tuple[SignalReport | AttentionSignalReport, Sequence[tuple[int, int, float]]] | str] = {
        line: (o.report, [(t.start, t.end, t.csr) for t in o.report.tokens]) if o.report is not None else f"{o.error}"
        for line, o in outcomes.items()
    }
    return attach_token_signal(reports, results, name="csr", failure="signals")


class SignalRecord(BaseModel):
    """One output line of ``rt4 signals csr``: an input line's signals, or why it has none."""

    id: str | None
    """Sample id, or ``None`` when the line could not be read."""
    line: int
    """1-based line number in the input file."""
    signals: SignalReport | None = None
    """The answer's token signals and flagged spans; ``None`` on error."""
    errors: list[str] = Field(default_factory=list)
    """Why the line has no signals."""

    @property
    def flagged(self) -> bool:
        """Whether any answer token was flagged."""
        return bool(self.signals and self.signals.flagged)


def csr_records(
    items: Sequence[InputLine],
    backend: LogprobBackend,
    *,
    delta: float = DEFAULT_DELTA,
    cache: SignalCache | None = None,
) -> list[SignalRecord]:
    """One record per input line, in input order."""
    valid = [item for item in items if item.sample is not None]
    outcomes = dict(
        zip(
            (item.line for item in valid),
            compute_csr([item.sample for item in valid if item.sample], backend, delta=delta, cache=cache),
            strict=True,
        )
    )
    records = []
    for item in items:
        if item.sample is None:
            records.append(SignalRecord(id=item.raw_id, line=item.line, errors=[item.error or "invalid input"]))
            continue
        outcome = outcomes[item.line]
        errors = [] if outcome.error is None else [outcome.error]
        records.append(SignalRecord(id=item.sample.id, line=item.line, signals=outcome.report, errors=errors))
    return records
