"""A cascade of judges: a cheap first judge settles what it is sure of, the rest go further.

``cascade:embedded@0.8,gpt-4o-mini`` sends every verify request to the embedded verifier first;
its judgements with confidence >= 0.8 stand, and the other claims go to gpt-4o-mini in one
request holding only those claims. The last stage settles whatever reaches it. Judgements are
merged back by claim position, and usage is reported per stage (``JudgeResponse.usage_by_judge``)
so an audit shows what each stage cost. Decomposition and the other single-judge tasks go to the
first stage that can decompose.

A sub-request for the claims left is rebuilt by the task registry from the narrowed payload
(:func:`rt4chart.method.tasks.narrow_verify_request`), so its messages are rendered exactly as the
pipeline renders them. A request that cannot be narrowed (a re-ask carries the earlier reply and
refers to claim positions) goes to the stage whole, and only its judgements of the claims left are
used: costlier, never wrong.

A latency budget (:func:`latency_budget`, set by the caller around an audit: ``rt4 guard`` sets one
per request) bounds the time the later stages may take: a stage is asked only while time is left,
and only until the deadline. When it runs out, each claim left open keeps the most confident
judgement an earlier stage gave it, and the budget records the claim (:attr:`LatencyBudget.cut`)
so the caller can say so in its record: the outcome is never a silent settlement. The first stage
always runs whole.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from rt4chart.method.tasks import ClaimJudgement, VerifyInput, VerifyOutput, narrow_verify_request
from rt4chart.protocol import (
    Backend,
    Capabilities,
    CostEstimator,
    JudgeRequest,
    JudgeResponse,
    cut_call_usage,
    reply_cost_usd,
)
from rt4chart.types import Usage


@dataclass(frozen=True)
class CascadeStage:
    """One judge of a cascade."""

    backend: Backend
    """The judge (already wrapped in cache and budget by the caller)."""
    confidence: float
    """A judgement with at least this confidence settles its claim (ignored for the last stage)."""


@dataclass
class LatencyBudget:
    """The time an audit's cascade may spend beyond its first stage, and what it could not settle."""

    seconds: float
    """The allowance, counted from :func:`latency_budget`'s entry."""
    deadline: float
    """``time.perf_counter()`` value past which no later stage is asked."""
    cut: dict[str, str] = field(default_factory=dict)
    """Claim text -> why its judgement stands unsettled (the stage not asked, the judgement kept)."""

    def remaining(self) -> float:
        return self.deadline - time.perf_counter()


_LATENCY_BUDGET: ContextVar[LatencyBudget | None] = ContextVar("rt4chart.cascade_latency_budget", default=None)


@contextmanager
def latency_budget(seconds: float | None) -> Iterator[LatencyBudget | None]:
    """Bound the later stages of every cascade called inside the block (tasks started in it included)
    to ``seconds`` from now; ``None``: no bound. Yields the budget, whose ``cut`` the block reads after."""
    budget = None if seconds is None else LatencyBudget(seconds, time.perf_counter() + seconds)
    token = _LATENCY_BUDGET.set(budget)
    try:
        yield budget
    finally:
        _LATENCY_BUDGET.reset(token)


class CascadeBackend:
    """Judges in sequence; see the module docstring."""

    def __init__(self, stages: list[CascadeStage]) -> None:
        if len(stages) < 2:
            raise ValueError("a cascade needs at least two stages")
        self.stages = stages
        self._name = "cascade:" + ",".join(
            [f"{s.backend.name}@{s.confidence:g}" for s in stages[:-1]] + [stages[-1].backend.name]
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities.of_judges(stage.backend for stage in self.stages)

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        if not isinstance(request.payload, VerifyInput):
            decomposer = next((s for s in self.stages if s.backend.capabilities.can_write_text), self.stages[0])
            return await decomposer.backend.complete(request)
        return await self._verify(request, len(request.payload.claims))

    async def _verify(self, request: JudgeRequest, n_claims: int) -> JudgeResponse:
        started = time.perf_counter()
        pending = list(range(n_claims))
        settled: dict[int, ClaimJudgement] = {}
        settled_by: dict[int, str] = {}
        usage_by_judge: dict[str, Usage] = {}
        unsure: dict[int, tuple[ClaimJudgement, str, float]] = {}  # best open judgement, its judge, threshold
        errors: list[str] = []
        cached = True
        budget = _LATENCY_BUDGET.get()
        for number, stage in enumerate(self.stages):
            last = number == len(self.stages) - 1
            narrowed, originals = narrow_verify_request(request, pending)
            if number == 0 or budget is None:
                response = await stage.backend.complete(narrowed)
            elif budget.remaining() <= 0:
                self._keep_unsure(budget, request, stage, pending, unsure, settled, settled_by)
                break
            else:
                try:
                    async with asyncio.timeout(budget.remaining()):
                        response = await stage.backend.complete(narrowed)
                except TimeoutError:
                    # The call was sent and is paid, reply or not: its cost is the record's too.
                    spent = usage_by_judge.get(stage.backend.name, Usage())
                    usage_by_judge[stage.backend.name] = spent + cut_call_usage(stage.backend, narrowed)
                    self._keep_unsure(budget, request, stage, pending, unsure, settled, settled_by)
                    break
            judge = response.judge or stage.backend.name
            usage_by_judge[judge] = usage_by_judge.get(judge, Usage()) + response.usage
            cached = cached and response.cached
            if not isinstance(response.parsed, VerifyOutput):
                errors.append(f"{judge}: {response.error}")
                continue
            for judgement in response.parsed.judgements:
                if judgement.claim >= len(originals):
                    continue
                original = originals[judgement.claim]
                sure = judgement.confidence is not None and judgement.confidence >= stage.confidence
                if original in pending and original not in settled and (last or sure):
                    settled[original] = judgement.model_copy(update={"claim": original})
                    settled_by[original] = judge
                elif original in pending and not last:
                    kept = unsure.get(original)
                    if kept is None or (judgement.confidence or 0.0) > (kept[0].confidence or 0.0):
                        unsure[original] = (judgement.model_copy(update={"claim": original}), judge, stage.confidence)
            pending = [p for p in pending if p not in settled]
            if not pending:
                break
        usage = sum(usage_by_judge.values(), Usage())
        latency = time.perf_counter() - started
        if not settled:
            return JudgeResponse(
                usage=usage,
                usage_by_judge=usage_by_judge,
                latency_s=latency,
                judge=self.name,
                error="; ".join(errors) or "no stage judged the claims",
            )
        parsed = VerifyOutput(judgements=[settled[p] for p in sorted(settled)])
        deciders = set(settled_by.values())
        return JudgeResponse(
            parsed=parsed,
            raw=parsed.model_dump_json(),
            usage=usage,
            usage_by_judge=usage_by_judge,
            latency_s=latency,
            cached=cached,
            # One stage decided every claim of this request: name it; otherwise the cascade.
            judge=deciders.pop() if len(deciders) == 1 else self.name,
            claim_judges=[settled_by[p] for p in sorted(settled)],
        )

    @staticmethod
    def _keep_unsure(
        budget: LatencyBudget,
        request: JudgeRequest,
        stage: CascadeStage,
        pending: list[int],
        unsure: dict[int, tuple[ClaimJudgement, str, float]],
        settled: dict[int, ClaimJudgement],
        settled_by: dict[int, str],
    ) -> None:
        """The budget ran out before ``stage`` answered: each open claim keeps its best earlier
        judgement (a claim no stage judged stays open), and the budget records why."""
        assert isinstance(request.payload, VerifyInput)
        for original in pending:
            claim = request.payload.claims[original]
            kept = unsure.get(original)
            if kept is None:
                budget.cut[claim] = (
                    f"latency budget of {budget.seconds * 1000:g} ms spent before {stage.backend.name} judged it; "
                    "no earlier stage judged it"
                )
                continue
            judgement, judge, threshold = kept
            settled[original] = judgement
            settled_by[original] = judge
            confidence = "none" if judgement.confidence is None else f"{judgement.confidence:g}"
            budget.cut[claim] = (
                f"latency budget of {budget.seconds * 1000:g} ms spent before {stage.backend.name} judged it: "
                f"{judge}'s {judgement.label} (confidence {confidence}, under {threshold:g}) stands unconfirmed"
            )

    def max_cost_usd(self, request: JudgeRequest) -> float:
        """Every stage may see every claim: the sum of the stages' worst cases."""
        return sum(
            s.backend.max_cost_usd(request) for s in self.stages if isinstance(s.backend, CostEstimator)
        )

    def call_cost_usd(self, request: JudgeRequest, completion_tokens: int) -> float:
        """The first stage sees every claim; the later ones only those it leaves open, which no plan
        knows: every stage counted (the figure errs high)."""
        return sum(reply_cost_usd(s.backend, request, completion_tokens) for s in self.stages)

    async def aclose(self) -> None:
        for stage in self.stages:
            await stage.backend.aclose()
