"""What an audit will cost, computed by running the audit itself against a judge that answers
nothing, so the plan cannot drift from the method.

The planner backend records every request the pipeline sends and fails each one. That run is the
*expected* plan: the decomposer falls back to rule-based claims (a judge decomposer's claim count
is unknown until it answers), no claim is settled early, and every claim reaches global
verification with no location hint. With rule-based claims and no global stage it is exactly what
a cold audit sends to a judge that answers every claim with grounded evidence.

The *worst case* bounds what a cold run can send whatever the judge answers (what a budget must
be ready for): each verification batch may be re-asked for ungrounded evidence and split into
single-claim calls for judgements it left out (:func:`rt4chart.method.verification.max_calls`), a judge
decomposer may return up to ``max_claims_per_sentence`` claims per sentence, and global
verification may split the claims into one group per location hint.
"""

from __future__ import annotations

import asyncio
import math

from rt4chart.judges.cache import JudgeCache, request_key
from rt4chart.judges.registry import language_refusal
from rt4chart.languages import audit_language
from rt4chart.method.citations import find_citations, max_check_calls
from rt4chart.method.decompose import decompose_by_rules, rule_claims
from rt4chart.method.text import chunk_sentences, segment_context, split_sentences
from rt4chart.method.verification import max_calls, reask_messages
from rt4chart.protocol import (
    Backend,
    BackendWrapper,
    CostEstimator,
    JudgeRequest,
    JudgeResponse,
    Message,
    prompt_tokens,
)
from rt4chart.records.io import InputLine
from rt4chart.report.progress import AuditEstimate
from rt4chart.runs.engine import Pipeline
from rt4chart.types import Sample, Sentence

NOT_SENT = "not sent: planning run"


def answers_offline(judge: Backend) -> bool:
    """Whether ``judge`` answers deterministically in this process at no cost (the embedded
    verifier), so that planning may ask it: its answers decide the global stage's grouping, and a
    plan that does not know them would miss calls the run makes."""
    return bool(getattr(judge, "answers_offline", False))


class PlannerBackend(BackendWrapper):
    """Stands in for a judge during planning: records each request and answers none, except for a
    judge that :func:`answers_offline`, which it asks (the plan is then exactly the run's calls)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.requests: list[JudgeRequest] = []

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        self.requests.append(request)
        if answers_offline(self.inner):
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
    if language_refusal(pipeline.backend, language) is not None:
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


def estimate_audit(pipeline: Pipeline, items: list[InputLine], cache: JudgeCache | None) -> AuditEstimate:
    """Plan every request of an audit of ``items`` and price it; calls no judge."""
    judge = pipeline.backend
    plan = AuditEstimate(counts_tokens=not answers_offline(judge))
    for item in items:
        if item.sample is None:
            plan.invalid += 1
            continue
        plan.samples += 1
        expected = planned_requests(pipeline, item.sample)
        plan.calls_expected += len(expected)
        for request in expected:
            if not answers_offline(judge):  # a verifier that reads no prompt bills no tokens
                plan.prompt_tokens += prompt_tokens(judge, request)
                plan.max_completion_tokens += request.params.max_tokens
            if cache is not None:
                plan.cached += cache.get(request_key(judge.name, request), request.output_schema) is not None
        worst_calls = max(worst_case_calls(pipeline, item.sample), len(expected))
        plan.calls_worst_case += worst_calls
        if isinstance(judge, CostEstimator) and expected:
            costs = [judge.max_cost_usd(request) for request in expected]
            plan.expected_usd += sum(costs)
            # A re-ask carries the earlier reply: the largest request plus a reply of max_tokens.
            largest = expected[costs.index(max(costs))]
            padded = largest.model_copy(
                update={"messages": largest.messages + _longest_reask(largest.params.max_tokens)}
            )
            plan.worst_case_usd += worst_calls * judge.max_cost_usd(padded)
    expected_note = (
        f"expected: the calls of the run itself ({judge.name} answered the plan: offline, deterministic, free)"
        if answers_offline(judge)
        else "expected: rule-based claims, no re-asks, no chunk skipped, one global call per batch of claims"
    )
    plan.notes = [
        expected_note,
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
