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
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rt4chart.method.tasks import ClaimJudgement, VerifyInput, VerifyOutput, narrow_verify_request
from rt4chart.protocol import Backend, Capabilities, CostEstimator, JudgeRequest, JudgeResponse, reply_cost_usd
from rt4chart.types import Usage


@dataclass(frozen=True)
class CascadeStage:
    """One judge of a cascade."""

    backend: Backend
    """The judge (already wrapped in cache and budget by the caller)."""
    confidence: float
    """A judgement with at least this confidence settles its claim (ignored for the last stage)."""


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
        errors: list[str] = []
        cached = True
        for number, stage in enumerate(self.stages):
            last = number == len(self.stages) - 1
            narrowed, originals = narrow_verify_request(request, pending)
            response = await stage.backend.complete(narrowed)
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
