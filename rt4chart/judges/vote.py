"""An ensemble judge: several judges verify the same claims and the majority label stands.

``vote:embedded,gpt-4o-mini,glm-4.7`` sends every verify request (each local chunk, each global
re-judgement) to every member at once; per claim, the label most members gave wins. A tie goes to
the more cautious label, contradicted > baseless > entailed, as the AND-join ranks them: an
ensemble that cannot decide whether a claim holds does not call it entailed.

The winning judgement is the first member's (in the order given) that voted for the winning label,
so its evidence and rationale come from a judge that holds that label; its rationale is prefixed
with every member's vote (``votes: a=contradicted, b=entailed, c=contradicted``), so each
member's vote is in the output record, and its confidence is the share of members that voted for
it (abstaining members count in the denominator). It carries no member's ``score`` (the embedded
verifier's probability): the vote decided, so its share is its score (what ``rt4 calibrate`` reads,
:func:`rt4chart.method.settlement.claim_unsupported_score`). A member that fails or leaves a claim out
abstains on it (named in the rationale as ``abstained``); a claim no member judged is left out of
the reply, which the pipeline re-asks. Usage is reported per member (``JudgeResponse.usage_by_judge``).
Decomposition and the other single-judge tasks go to the first member that can decompose.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from rt4chart.method.tasks import ClaimJudgement, VerifyInput, VerifyOutput
from rt4chart.protocol import Backend, Capabilities, CostEstimator, JudgeRequest, JudgeResponse, reply_cost_usd
from rt4chart.types import Label, Usage

TIE_ORDER = (Label.CONTRADICTED, Label.BASELESS, Label.ENTAILED)
"""On a tie the first of these among the tied labels wins (the AND-join's caution)."""


def majority(labels: list[Label]) -> Label:
    """The label most often given; ties go to the earliest label of :data:`TIE_ORDER`."""
    counts = Counter(labels)
    top = max(counts.values())
    return next(label for label in TIE_ORDER if counts[label] == top)


class VoteBackend:
    """Majority vote of several judges per claim; see the module docstring."""

    def __init__(self, members: list[Backend]) -> None:
        if len(members) < 2:
            raise ValueError("a vote needs at least two members")
        self.members = members
        self._name = "vote:" + ",".join(member.name for member in members)

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities.of_judges(self.members)

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        if not isinstance(request.payload, VerifyInput):
            decomposer = next((m for m in self.members if m.capabilities.can_write_text), self.members[0])
            return await decomposer.complete(request)
        return await self._vote(request, len(request.payload.claims))

    async def _vote(self, request: JudgeRequest, n_claims: int) -> JudgeResponse:
        started = time.perf_counter()
        responses = await asyncio.gather(*(member.complete(request) for member in self.members))
        names = [response.judge or member.name for member, response in zip(self.members, responses, strict=True)]
        usage_by_judge: dict[str, Usage] = {}
        ballots: list[dict[int, ClaimJudgement]] = []
        errors = []
        for name, response in zip(names, responses, strict=True):
            usage_by_judge[name] = usage_by_judge.get(name, Usage()) + response.usage
            ballot: dict[int, ClaimJudgement] = {}
            if isinstance(response.parsed, VerifyOutput):
                for judgement in response.parsed.judgements:
                    if judgement.claim < n_claims:
                        ballot.setdefault(judgement.claim, judgement)
            else:
                errors.append(f"{name}: {response.error}")
            ballots.append(ballot)
        counted = [self._count(claim, names, ballots) for claim in range(n_claims)]
        judgements = [judgement for judgement in counted if judgement is not None]
        usage = sum(usage_by_judge.values(), Usage())
        latency = time.perf_counter() - started
        if not judgements:
            return JudgeResponse(
                usage=usage,
                usage_by_judge=usage_by_judge,
                latency_s=latency,
                judge=self.name,
                error="; ".join(errors) or "no member judged the claims",
            )
        parsed = VerifyOutput(judgements=judgements)
        return JudgeResponse(
            parsed=parsed,
            raw=parsed.model_dump_json(),
            usage=usage,
            usage_by_judge=usage_by_judge,
            latency_s=latency,
            cached=all(response.cached for response in responses),
            judge=self.name,
        )

    def _count(self, claim: int, names: list[str], ballots: list[dict[int, ClaimJudgement]]) -> ClaimJudgement | None:
        cast = [ballot[claim] for ballot in ballots if claim in ballot]
        if not cast:
            return None
        winner = majority([judgement.label for judgement in cast])
        chosen = next(judgement for judgement in cast if judgement.label == winner)
        votes = ", ".join(
            f"{name}={ballot[claim].label.value if claim in ballot else 'abstained'}"
            for name, ballot in zip(names, ballots, strict=True)
        )
        share = sum(judgement.label == winner for judgement in cast) / len(self.members)
        rationale = f"votes: {votes}" + (f"; {chosen.rationale}" if chosen.rationale else "")
        return chosen.model_copy(update={"claim": claim, "rationale": rationale, "confidence": share, "score": None})

    def max_cost_usd(self, request: JudgeRequest) -> float:
        """Every member sees every request: the sum of the members' worst cases."""
        return sum(m.max_cost_usd(request) for m in self.members if isinstance(m, CostEstimator))

    def call_cost_usd(self, request: JudgeRequest, completion_tokens: int) -> float:
        """Every member answers every request."""
        return sum(reply_cost_usd(m, request, completion_tokens) for m in self.members)

    async def aclose(self) -> None:
        for member in self.members:
            await member.aclose()
