"""What an audit will cost, computed by running the audit itself against a judge that answers
nothing, so the plan cannot drift from the method.

The planner backend records every request the pipeline sends and fails each one. That run is the
*expected* plan: the decomposer falls back to rule-based claims (a judge decomposer's claim count
is unknown until it answers), no claim is settled early, and every claim reaches global
verification with no location hint. With rule-based claims and no global stage it is exactly what
a cold audit sends to a judge that answers every claim with grounded evidence.

The *expected cost* prices the expected calls at the sizes replies typically have
(:func:`typical_completion_tokens`: one judgement per claim quoting about the claim's length of
evidence with a rationale as long, the claims of a sentence about as long as the sentence), scaled
per task by the replies the cache already holds for planned calls (their real completion tokens
over their typical size), and counts a call whose reply is cached as free (the run makes no call).

The *worst case* bounds what a cold run can send whatever the judge answers (what a budget must
be ready for): each verification batch may be re-asked for ungrounded evidence and split into
single-claim calls for judgements it left out (:func:`rt4chart.method.verification.max_calls`), a judge
decomposer may return up to ``max_claims_per_sentence`` claims per sentence, and global
verification may split the claims into one group per location hint.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from rt4chart.judges.cache import JudgeCache, request_key
from rt4chart.judges.registry import JudgeConfigError
from rt4chart.languages import audit_language
from rt4chart.method.citations import find_citations, max_check_calls
from rt4chart.method.decompose import decompose_by_rules, rule_claims
from rt4chart.method.tasks import (
    ClaimJudgement,
    DecomposedSentence,
    DecomposeInput,
    DecomposeOutput,
    DecomposeSentenceInput,
    DirectInput,
    DirectOutput,
    DirectSpan,
    HolisticDecomposeInput,
    HolisticDecomposeOutput,
    RepairedSentence,
    RepairInput,
    RepairOutput,
    SentenceClaims,
    VerifyInput,
    VerifyOutput,
)
from rt4chart.method.text import chunk_sentences, segment_context, split_sentences
from rt4chart.method.verification import max_calls, reask_messages
from rt4chart.protocol import (
    Backend,
    BackendWrapper,
    CostEstimator,
    JudgeRequest,
    JudgeResponse,
    Message,
    approximate_tokens,
    prompt_tokens,
    reply_cost_usd,
)
from rt4chart.records.io import InputLine
from rt4chart.report.progress import AuditEstimate
from rt4chart.runs.engine import Pipeline
from rt4chart.runs.run import RunUsageError, input_lines
from rt4chart.runs.spec import RunSpec
from rt4chart.types import Label, Sample, Sentence

NOT_SENT = "not sent: planning run"


class PlannerBackend(BackendWrapper):
    """Stands in for a judge during planning: records each request and answers none, except for a
    judge that answers offline (:attr:`Capabilities.answers_offline`), which it asks (the plan is then
    exactly the run's calls)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.requests: list[JudgeRequest] = []

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        self.requests.append(request)
        if self.inner.capabilities.answers_offline:
            return await self.inner.complete(request)
        return JudgeResponse(error=NOT_SENT, judge=self.name)

    async def aclose(self) -> None:
        return None  # the judge it stands for belongs to the caller


def worst_case_calls(pipeline: Pipeline, sample: Sample) -> int:
    """The most judge calls a cold audit of ``sample`` can make, whatever the judge answers."""
    options = pipeline.options
    if options.method == "direct":
        return 1
    language = audit_language(sample.language, options.language, sample.answer, sample.context)
    if pipeline.backend.capabilities.language_refusal(language, pipeline.backend.name) is not None:
        return 0
    cited = find_citations(sample, options.citation_pattern, language)
    answer_sentences = cited.sentences if cited is not None else split_sentences(sample.answer, language=language)
    if not answer_sentences:
        return 0
    _, sentences = segment_context(sample.context, language)
    chunks = chunk_sentences(len(sentences), options.window, options.overlap)
    by_judge = pipeline.decomposes_by_judge
    n_claims = (
        options.max_claims_per_sentence * len(answer_sentences)
        if by_judge
        else len(decompose_by_rules(answer_sentences))
    )
    batch = options.batch_claims
    sizes = [min(batch, n_claims - start) for start in range(0, n_claims, batch)]
    if options.decomposer == "holistic":
        decompose_calls = 1
    elif by_judge:
        # One call for the answer and each sentence asked again alone; per sentence, each sentence
        # asked twice (again when its claims are not pieces of it: rt4chart.method.decompose).
        n_sentences = len(answer_sentences)
        decompose_calls = 2 * n_sentences if options.decompose_per_sentence else n_sentences + 1
    else:
        decompose_calls = 0
    calls = decompose_calls + len(chunks) * sum(max_calls(size) for size in sizes)
    run_global = options.global_verification and not (options.global_auto and len(chunks) == 1)
    if run_global and sentences and n_claims:
        # Global calls group claims by (deciding chunk, local label): entailed or contradicted in
        # each chunk, plus baseless and unknown claims with no hint.
        groups = min(n_claims, 2 * len(chunks) + 2)
        batches = (groups - 1) + math.ceil((n_claims - groups + 1) / batch)
        # Every batch may be re-asked once and each of its claims asked alone (and re-asked).
        calls += batches + 2 * n_claims
    if cited is not None and options.decomposer != "holistic":
        # Claims whose evidence lies outside the passages they cite are checked against those alone.
        def claims_of(sentence: Sentence) -> int:
            return options.max_claims_per_sentence if by_judge else len(rule_claims(sentence))

        calls += max_check_calls(cited, claims_of, batch)
    return calls


def planned_requests(pipeline: Pipeline, sample: Sample) -> list[JudgeRequest]:
    """The requests of the expected plan of ``sample``: what the audit sends when no judge answers."""
    planner = PlannerBackend(pipeline.backend)
    asyncio.run(Pipeline(planner, pipeline.options, pipeline.prompts).verify_sample(sample))
    return planner.requests


def typical_reply(request: JudgeRequest) -> BaseModel | None:
    """The reply a judge typically writes to ``request``: per claim one judgement quoting about the
    claim's length of evidence, with a rationale as long; the claims of a sentence about as long as
    the sentence; a repair as long as the sentence it rewrites. ``None`` for a task it cannot size."""
    payload = request.payload
    if isinstance(payload, VerifyInput):
        return VerifyOutput(judgements=[
            ClaimJudgement(claim=n, label=Label.ENTAILED, evidence=[claim], rationale=claim, confidence=0.9)
            for n, claim in enumerate(payload.claims)
        ])
    if isinstance(payload, DecomposeInput):
        return DecomposeOutput(sentences=[DecomposedSentence(sentence=n, claims=[text])
                                          for n, text in enumerate(payload.sentences)])
    if isinstance(payload, DecomposeSentenceInput):
        return SentenceClaims(claims=[payload.sentences[payload.target]])
    if isinstance(payload, HolisticDecomposeInput):
        return HolisticDecomposeOutput(claims=payload.sentences)
    if isinstance(payload, DirectInput):
        return DirectOutput(spans=[DirectSpan(text=text, label=Label.ENTAILED, evidence=[text], confidence=0.9)
                                   for text in payload.sentences])
    if isinstance(payload, RepairInput):
        return RepairOutput(sentences=[RepairedSentence(sentence=item.sentence, text=item.text)
                                       for item in payload.items])
    return None


def typical_completion_tokens(request: JudgeRequest) -> int:
    """Completion tokens of :func:`typical_reply` (four characters a token), at most ``max_tokens``;
    ``max_tokens`` for a task it cannot size."""
    reply = typical_reply(request)
    if reply is None:
        return request.params.max_tokens
    return min(approximate_tokens(reply.model_dump_json()), request.params.max_tokens)


@dataclass
class _ReplySizes:
    """Per task, the real completion tokens of the cached replies of planned calls and the typical
    sizes of the same calls: their ratio scales the typical size of the calls not cached."""

    real: dict[str, int] = field(default_factory=dict)
    typical: dict[str, int] = field(default_factory=dict)

    def add(self, task: str, real: int, typical: int) -> None:
        self.real[task] = self.real.get(task, 0) + real
        self.typical[task] = self.typical.get(task, 0) + typical

    def expected(self, request: JudgeRequest) -> int:
        typical = typical_completion_tokens(request)
        seen = self.typical.get(request.task, 0)
        scaled = round(typical * self.real[request.task] / seen) if seen else typical
        return min(scaled, request.params.max_tokens)


def estimate_audit(pipeline: Pipeline, items: list[InputLine], cache: JudgeCache | None) -> AuditEstimate:
    """Plan every request of an audit of ``items`` and price it; calls no judge."""
    judge = pipeline.backend
    plan = AuditEstimate(counts_tokens=not judge.capabilities.answers_offline)
    planned: list[tuple[JudgeRequest, bool]] = []  # every expected request, and whether its reply is cached
    sizes = _ReplySizes()
    for item in items:
        if item.sample is None:
            plan.invalid += 1
            continue
        plan.samples += 1
        expected = planned_requests(pipeline, item.sample)
        plan.calls_expected += len(expected)
        for request in expected:
            if not judge.capabilities.answers_offline:  # a verifier that reads no prompt bills no tokens
                plan.prompt_tokens += prompt_tokens(judge, request)
                plan.max_completion_tokens += request.params.max_tokens
            hit = cache.get(request_key(judge.name, request), request.output_schema) if cache is not None else None
            plan.cached += hit is not None
            if hit is not None and hit.usage.completion_tokens > 0:
                sizes.add(request.task, hit.usage.completion_tokens, typical_completion_tokens(request))
                plan.sized_from_cache += 1
            planned.append((request, hit is not None))
        worst_calls = max(worst_case_calls(pipeline, item.sample), len(expected))
        plan.calls_worst_case += worst_calls
        if isinstance(judge, CostEstimator) and expected:
            costs = [judge.max_cost_usd(request) for request in expected]
            # A re-ask carries the earlier reply: the largest request plus a reply of max_tokens.
            largest = expected[costs.index(max(costs))]
            padded = largest.model_copy(
                update={"messages": largest.messages + _longest_reask(largest.params.max_tokens)}
            )
            plan.worst_case_usd += worst_calls * judge.max_cost_usd(padded)
    for request, cached in planned:
        tokens = sizes.expected(request)
        if not judge.capabilities.answers_offline:
            plan.expected_completion_tokens += tokens
        if not cached:
            plan.expected_usd += reply_cost_usd(judge, request, tokens)
    expected_note = (
        f"expected: the calls of the run itself ({judge.name} answered the plan: offline, deterministic, free)"
        if judge.capabilities.answers_offline
        else "expected: rule-based claims, no re-asks, no chunk skipped, one global call per batch of claims"
    )
    sized = (f"; reply sizes scaled by {plan.sized_from_cache} cached replies of this plan" if plan.sized_from_cache
             else "")
    plan.notes = [
        expected_note,
        "expected cost: each call not in the cache at its prompt and a typical reply (one judgement per claim,"
        f" evidence and rationale about the claim's length){sized}; cached calls cost nothing",
        "worst case: every batch re-asked and split into single claims, global calls split by location hint",
    ]
    if any(item.sample is not None and find_citations(item.sample, pipeline.options.citation_pattern)
           for item in items):
        plan.notes.append(
            "citations: a claim whose evidence lies outside the passages it cites is verified again against"
            " them alone (in the worst case every citing claim; in the expected plan only where the judge"
            " that answered the plan put it)"
        )
    if pipeline.decomposes_by_judge:
        plan.notes.append(
            f"worst case: up to {pipeline.options.max_claims_per_sentence} claims per answer sentence"
            " from the decomposer"
        )
    return plan


def _longest_reask(max_tokens: int) -> list[Message]:
    return reask_messages(list(range(8)), "x " * max_tokens)


def estimate(spec: RunSpec, samples: Iterable[Sample | Mapping[str, Any] | InputLine]) -> AuditEstimate:
    """``rt4 estimate``: the calls, tokens and USD a run of ``spec`` would need (expected and worst
    case), from the real pipeline against a judge that answers nothing; calls no judge. Under
    ``spec.limits.batch`` priced at the batch rate."""
    from rt4chart.judges.cache import CacheError, open_cache
    from rt4chart.judges.registry import resolve_judge_for_pricing

    owned = not isinstance(spec.judge, Backend)  # a caller's backend stays the caller's
    try:
        # Pricing needs no key: a user can price an audit before getting one.
        backend = (
            spec.judge
            if isinstance(spec.judge, Backend)
            else resolve_judge_for_pricing(spec.judge, api_base=spec.api_base, batch=spec.limits.batch)
        )
    except JudgeConfigError as error:
        raise RunUsageError(str(error)) from error
    try:
        cache = open_cache(spec.cache) if spec.cache is not None else None
        try:
            return estimate_audit(Pipeline(backend, spec.options), input_lines(samples), cache)
        finally:
            if cache is not None:
                cache.close()
    except CacheError as error:
        raise RunUsageError(str(error)) from error
    finally:
        if owned:
            asyncio.run(backend.aclose())
