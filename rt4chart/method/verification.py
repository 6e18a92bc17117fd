"""Local verification with OR-join, adaptive global verification, AND-join.

Claims are judged in batches (``batch_claims`` per call; 1 reproduces the reference algorithm's
one-claim-per-call). Every judgement passes the retromorphic check before it counts: its quotes
must be found in the part of the context the judge was shown.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from rt4chart.method.grounding import ContextIndex, anchor_quotes
from rt4chart.method.joins import and_join as and_join  # re-exported: pipeline and direct import the joins from here
from rt4chart.method.joins import answer_hallucinated as answer_hallucinated
from rt4chart.method.joins import or_join
from rt4chart.method.session import JudgeSession
from rt4chart.method.tasks import AnswerSpans, ClaimJudgement, VerifyInput, VerifyOutput
from rt4chart.options import AuditOptions, UngroundedPolicy
from rt4chart.protocol import JudgeRequest, JudgeResponse, Message
from rt4chart.types import Chunk, Claim, ClaimVerdict, Label, Sentence, Span, Verdict, Vote, merge_spans


def hallucinated_spans(verdicts: Iterable[ClaimVerdict]) -> list[Span]:
    """Answer spans of sentences that hold a non-entailed claim, merged where they touch."""
    return merge_spans([v.answer_span for v in verdicts if v.label != Label.ENTAILED and v.answer_span])


class Judged(Verdict):
    """One claim's judgement in one call, after the retromorphic check."""

    error: str | None = None
    """What went wrong: why the judgement is missing, not trusted, or came another way."""


def _needs_evidence(judgement: ClaimJudgement) -> bool:
    return judgement.label != Label.BASELESS


@dataclass
class ClaimVerifier:
    """The verification step of one sample: asks the sample's judge (through its session) about
    batches of claims against a view of the context, anchors the evidence (grounding) and re-asks.
    It judges nothing itself; the judge is the session's backend."""

    session: JudgeSession
    index: ContextIndex
    question: str | None
    ungrounded: UngroundedPolicy = "downgrade"
    """What a verdict whose evidence is not in the context becomes (see :class:`AuditOptions`)."""
    answer: str | None = None
    """The answer as given, sent with each claim's span only to a judge that reads it
    (:attr:`~rt4chart.protocol.Capabilities.reads_answer`)."""
    charges: dict[int, tuple[int, float]] = field(default_factory=dict)
    """Per claim index: judge calls that judged it and its share of their cost."""

    async def _send(self, request: JudgeRequest, claims: list[Claim]) -> JudgeResponse:
        """Send a request about ``claims`` and split what it cost evenly among them."""
        response = await self.session.send(request)
        share = response.usage.cost_usd / len(claims) if claims else 0.0
        for claim in claims:
            calls, cost = self.charges.get(claim.index, (0, 0.0))
            self.charges[claim.index] = (calls + response.usage.calls, cost + share)
        return response

    def build_request(
        self,
        claims: list[Claim],
        view: list[Sentence],
        stage: str,
        chunk: int | None = None,
        hint: list[int] | None = None,
        follow_up: list[Message] | None = None,
        local_labels: list[Label | None] | None = None,
    ) -> JudgeRequest:
        """The request that judges ``claims`` against the sentences in ``view``."""
        answer = None
        if self.answer is not None and self.session.backend.capabilities.reads_answer:
            answer = AnswerSpans(text=self.answer, spans=[c.answer_span for c in claims])
        payload = VerifyInput(
            stage="local" if stage == "local" else "global",
            claims=[c.text for c in claims],
            sentences=view,
            chunk=chunk,
            hint=hint,
            question=self.question,
            local_labels=local_labels,
            answer=answer,
        )
        return self.session.request(payload, follow_up)

    async def judge(
        self,
        claims: list[Claim],
        view: list[Sentence],
        stage: str,
        chunk: int | None = None,
        hint: list[int] | None = None,
        local_labels: list[Label | None] | None = None,
    ) -> dict[int, Judged]:
        """Judge ``claims`` against the sentences in ``view``; keyed by claim index.

        A batched reply counts only when it judges exactly the claims asked, each once (a reply that
        numbers claims from 1 would otherwise move verdicts onto the wrong claims); a reply that is
        off, or holds no valid verdict at all even after the backend's re-ask, sends every claim of
        the batch to a call of its own. A call that got no reply at all fails its claims.
        """
        within = (view[0].start, view[-1].end) if view else (0, 0)
        request = self.build_request(claims, view, stage, chunk, hint, local_labels=local_labels)
        response = await self._send(request, claims)
        problem = _batch_problem(response, len(claims))
        if problem is not None:
            if len(claims) == 1 or not response.raw:
                # One claim, or no reply at all (a transport failure): asking claim by claim would
                # only multiply failing calls.
                return {claim.index: Judged(label=None, error=problem) for claim in claims}
            return await self._one_by_one(claims, view, stage, chunk, hint, local_labels, problem)
        assert isinstance(response.parsed, VerifyOutput)
        judges = _judges_by_position(response, self.session.backend.name)
        results: dict[int, Judged] = {}
        ungrounded: list[int] = []
        for judgement in response.parsed.judgements:
            claim = claims[judgement.claim]
            results[claim.index] = judged = self._ground(judgement, within, judges[judgement.claim])
            if not judged.grounded:
                ungrounded.append(judgement.claim)
        if ungrounded:
            reask = self.build_request(
                claims, view, stage, chunk, hint, reask_messages(sorted(ungrounded), response.raw), local_labels
            )
            await self._reask_ungrounded(claims, sorted(ungrounded), reask, within, results)
        if self.ungrounded == "downgrade":
            for judged in results.values():
                _downgrade_if_ungrounded(judged)
        return results

    async def _one_by_one(
        self,
        claims: list[Claim],
        view: list[Sentence],
        stage: str,
        chunk: int | None,
        hint: list[int] | None,
        local_labels: list[Label | None] | None,
        problem: str,
    ) -> dict[int, Judged]:
        """Judge each claim of a batch in a call of its own, noting why the batch reply was dropped."""
        results: dict[int, Judged] = {}
        for position, claim in enumerate(claims):
            label = [local_labels[position]] if local_labels is not None else None
            judged = (await self.judge([claim], view, stage, chunk, hint, label))[claim.index]
            note = f"batched reply not used ({problem}); judged alone"
            judged.error = f"{note}: {judged.error}" if judged.error else note
            results[claim.index] = judged
        return results

    def _ground(self, judgement: ClaimJudgement, within: tuple[int, int], judge: str) -> Judged:
        if not _needs_evidence(judgement):
            return Judged(
                label=judgement.label,
                rationale=judgement.rationale,
                confidence=judgement.confidence,
                score=judgement.score,
                judge=judge,
            )
        anchoring = anchor_quotes(self.index, judgement.evidence, within)
        problem = anchoring.problem
        return Judged(
            label=judgement.label,
            evidence=anchoring.evidence,
            rationale=judgement.rationale,
            confidence=judgement.confidence,
            score=judgement.score,
            grounded=problem is None,
            judge=judge,
            error=problem,
        )

    async def _reask_ungrounded(
        self,
        claims: list[Claim],
        positions: list[int],
        reask: JudgeRequest,
        within: tuple[int, int],
        results: dict[int, Judged],
    ) -> None:
        """Re-ask once for claims whose evidence is not in the context; keep what then holds."""
        response = await self._send(reask, [claims[position] for position in positions])
        by_position: dict[int, ClaimJudgement] = {}
        if isinstance(response.parsed, VerifyOutput):
            for judgement in response.parsed.judgements:
                by_position.setdefault(judgement.claim, judgement)
        judges = _judges_by_position(response, self.session.backend.name)
        for position in positions:
            claim = claims[position]
            first = results[claim.index]
            again = by_position.get(position)
            second = self._ground(again, within, judges[position]) if again else None
            if second is not None and second.grounded:
                results[claim.index] = second
            else:
                first.grounded = False
                first.error = f"{first.error}; still ungrounded after a re-ask"


def _batch_problem(response: JudgeResponse, n_claims: int) -> str | None:
    """Why a reply cannot be used as the verdicts of its ``n_claims`` claims; ``None`` when it can."""
    if not isinstance(response.parsed, VerifyOutput):
        return f"judge failed: {response.error}"
    indices = [judgement.claim for judgement in response.parsed.judgements]
    if sorted(indices) != list(range(n_claims)):
        return f"the reply judged claims {indices}, not exactly claims {list(range(n_claims))}"
    return None


def _downgrade_if_ungrounded(judged: Judged) -> None:
    """``--ungrounded downgrade``: only evidence found in the context supports a verdict. The paper
    only checks the evidence (the retromorphic relation); turning the label into baseless is ours."""
    if judged.grounded or judged.label in (None, Label.BASELESS):
        return
    note = f"{judged.label} verdict downgraded to baseless: its evidence is not in the context"
    judged.error = f"{judged.error}; {note}" if judged.error else note
    judged.label = Label.BASELESS
    judged.evidence = []


def _judges_by_position(response: JudgeResponse, fallback: str) -> defaultdict[int, str]:
    """Which judge answered for each claim position of a reply (stages differ in a cascade)."""
    judge = response.judge or fallback
    judges: defaultdict[int, str] = defaultdict(lambda: judge)
    if isinstance(response.parsed, VerifyOutput) and response.claim_judges:
        judges.update(zip((j.claim for j in response.parsed.judgements), response.claim_judges, strict=False))
    return judges


ClaimJudge = ClaimVerifier
"""The old name of :class:`ClaimVerifier` (it drives the step and is no judge), importable for one release."""


def max_calls(batch_size: int) -> int:
    """The most calls :meth:`ClaimVerifier.judge` makes for a batch: the call, one re-ask for
    ungrounded evidence, and for a batch of several claims each claim left without a judgement
    asked alone (and re-asked); the planner's worst case is built from this."""
    return 2 if batch_size == 1 else 1 + 2 * batch_size


def reask_messages(positions: list[int], raw: str) -> list[Message]:
    return [
        Message(role="assistant", content=raw),
        Message(
            role="user",
            content=(
                f"For claims {positions} your evidence is not a verbatim quote of the context "
                "(or too short to decide anything). "
                "Reply again with the full JSON; every evidence string must be copied exactly "
                "from the context (without [S..] markers). If nothing in the context decides a "
                "claim, label it baseless."
            ),
        ),
    ]


def batches(claims: list[Claim], size: int) -> list[list[Claim]]:
    """Consecutive groups of at most ``size`` claims."""
    return [claims[i : i + size] for i in range(0, len(claims), size)]


async def verify_locally(
    judge: ClaimVerifier, claims: list[Claim], chunks: list[Chunk], options: AuditOptions
) -> dict[int, list[Vote]]:
    """Judge every claim against every chunk; returns the votes per claim in chunk order."""
    votes: dict[int, list[Vote]] = {c.index: [] for c in claims}
    sentences = judge.index.sentences
    for chunk in chunks:
        active: list[Claim] = []
        for claim in claims:
            decided = next(
                (v.chunk for v in votes[claim.index] if v.label == Label.CONTRADICTED), None
            )
            if options.skip_decided and decided is not None:
                votes[claim.index].append(
                    Vote(chunk=chunk.index, label=None, skipped=f"contradicted in chunk {decided}")
                )
            else:
                active.append(claim)
        view = sentences[chunk.first : chunk.last + 1]
        outcomes = await asyncio.gather(
            *(judge.judge(batch, view, "local", chunk=chunk.index)
              for batch in batches(active, options.batch_claims))
        )
        for outcome in outcomes:
            for claim_index, judged in outcome.items():
                votes[claim_index].append(Vote(chunk=chunk.index, **judged.verdict_fields(), error=judged.error))
        for claim in active:
            votes[claim.index].sort(key=lambda vote: vote.chunk)
    return votes


def deciding_chunk(votes: list[Vote], label: Label | None) -> int | None:
    """First chunk whose vote equals the local label (None for baseless or unknown)."""
    if label in (Label.BASELESS, None):
        return None
    return next((v.chunk for v in votes if v.label == label), None)


async def verify_claims(
    judge: ClaimVerifier, claims: list[Claim], chunks: list[Chunk], options: AuditOptions, run_global: bool = True
) -> list[ClaimVerdict]:
    """The whole verification of one answer's claims: local, OR-join, adaptive global."""
    votes = await verify_locally(judge, claims, chunks, options)
    verdicts: list[ClaimVerdict] = []
    for claim in claims:
        claim_votes = votes[claim.index]
        local = or_join(v.label for v in claim_votes)
        hint_chunk = deciding_chunk(claim_votes, local)
        deciding = next((v for v in claim_votes if v.chunk == hint_chunk), None)
        verdicts.append(
            ClaimVerdict(
                index=claim.index,
                text=claim.text,
                sentence_index=claim.sentence_index,
                answer_span=claim.answer_span,
                votes=claim_votes,
                local_label=local,
                hint_chunk=hint_chunk,
                **{**(deciding.verdict_fields() if deciding else {}), "label": local},
                errors=[f"chunk {v.chunk}: {v.error}" for v in claim_votes if v.error],
            )
        )
    if run_global and judge.index.sentences:
        await verify_globally(judge, claims, verdicts, chunks, options)
    for verdict in verdicts:
        verdict.calls, verdict.cost_usd = judge.charges.get(verdict.index, (0, 0.0))
    return verdicts


async def verify_globally(
    judge: ClaimVerifier,
    claims: list[Claim],
    verdicts: list[ClaimVerdict],
    chunks: list[Chunk],
    options: AuditOptions,
) -> None:
    """Re-judge every claim against the full context, in place, adapting the prompt to its local
    label: claims are grouped by (deciding chunk, local label), each call names the first pass's
    label of every claim and, for entailed and contradicted ones, the deciding chunk as a location
    hint, and asks whether that decision holds against the whole context."""
    groups: dict[tuple[int | None, Label | None], list[ClaimVerdict]] = {}
    for verdict in verdicts:
        groups.setdefault((verdict.hint_chunk, verdict.local_label), []).append(verdict)
    by_index = {claim.index: claim for claim in claims}
    sentences = judge.index.sentences
    calls: list[Coroutine[Any, Any, dict[int, Judged]]] = []
    for (hint_chunk, local_label), members in groups.items():
        hint = list(chunks[hint_chunk].sentence_ids) if hint_chunk is not None else None
        for batch in batches([by_index[member.index] for member in members], options.batch_claims):
            labels: list[Label | None] = [local_label] * len(batch)
            calls.append(judge.judge(batch, sentences, "global", hint=hint, local_labels=labels))
    outcomes: dict[int, Judged] = {}
    for outcome in await asyncio.gather(*calls):
        outcomes.update(outcome)
    for verdict in verdicts:
        judged = outcomes[verdict.index]
        if judged.label is None:
            kept = "kept the local label" if verdict.label is not None else "no label: every judge call failed"
            verdict.errors.append(f"global verification failed ({judged.error}); {kept}")
            continue
        for name, value in judged.verdict_fields().items():
            setattr(verdict, name, value)
        if judged.error:
            verdict.errors.append(f"global: {judged.error}")
