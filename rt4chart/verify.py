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

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rt4chart.backends.base import ClaimJudgement, JudgeRequest, JudgeResponse, Message, VerifyInput, VerifyOutput
from rt4chart.grounding import ContextIndex, anchor_quotes
from rt4chart.session import JudgeSession
from rt4chart.types import Chunk, Claim, ClaimVerdict, Evidence, Label, Sentence, Span, Vote


class VerifyOptions(BaseModel):
    """How claims are verified."""

    # A misspelt option (``windw=5``) must fail loudly rather than silently audit with defaults.
    model_config = ConfigDict(extra="forbid")

    window: int = Field(default=25, ge=1)
    """Sentences per chunk (W)."""
    overlap: int = Field(default=10, ge=0)
    """Sentences shared by consecutive chunks (O); must be smaller than ``window``."""
    batch_claims: int = Field(default=8, ge=1)
    """Claims judged per call; 1 reproduces the reference algorithm."""
    global_verification: bool = True
    """Re-judge every claim against the full context (adaptive by local label)."""
    skip_decided: bool = True
    """Stop asking further chunks about a claim already contradicted (its OR-join is settled)."""

    @model_validator(mode="after")
    def _overlap_below_window(self) -> VerifyOptions:
        # Checked here, not only in the CLI, so API callers get the usage error before any judge call.
        if self.overlap >= self.window:
            raise ValueError(f"overlap must be smaller than window (got window={self.window}, overlap={self.overlap})")
        return self


def or_join(labels: Iterable[Label | None]) -> Label:
    """Local join over chunk votes: contradicted > entailed > baseless (missing votes ignored)."""
    present = set(labels)
    if Label.CONTRADICTED in present:
        return Label.CONTRADICTED
    if Label.ENTAILED in present:
        return Label.ENTAILED
    return Label.BASELESS


def and_join(labels: Iterable[Label | None]) -> Label:
    """Answer join over claims: contradicted > baseless > entailed.

    A claim that could not be judged (``None``) has no established basis and counts as baseless,
    and so does an answer with no claim at all: nothing in it was verified.
    """
    present = {Label.BASELESS if label is None else label for label in labels} or {Label.BASELESS}
    if Label.CONTRADICTED in present:
        return Label.CONTRADICTED
    if Label.BASELESS in present:
        return Label.BASELESS
    return Label.ENTAILED


def hallucinated_spans(verdicts: Iterable[ClaimVerdict]) -> list[Span]:
    """Answer spans of sentences that hold a non-entailed claim, merged where they touch."""
    spans = sorted(
        (v.answer_span for v in verdicts if v.label != Label.ENTAILED and v.answer_span),
        key=lambda span: (span.start, span.end),
    )
    merged: list[Span] = []
    for span in spans:
        if merged and span.start <= merged[-1].end:
            merged[-1] = Span(start=merged[-1].start, end=max(merged[-1].end, span.end))
        else:
            merged.append(span)
    return merged


@dataclass
class Judged:
    """One claim's judgement in one call, after the retromorphic check."""

    label: Label | None
    evidence: list[Evidence] = field(default_factory=list)
    rationale: str = ""
    confidence: float | None = None
    grounded: bool = True
    judge: str | None = None
    error: str | None = None


def _render_sentences(sentences: list[Sentence]) -> str:
    return "\n".join(f"[S{s.index}] {s.text}" for s in sentences)


def _render_claims(claims: list[Claim]) -> str:
    return "\n".join(f"[{position}] {claim.text}" for position, claim in enumerate(claims))


def _needs_evidence(judgement: ClaimJudgement) -> bool:
    return judgement.label != Label.BASELESS


@dataclass
class ClaimJudge:
    """Judges batches of claims against a view of the context, with grounding and re-asks."""

    session: JudgeSession
    index: ContextIndex
    question: str | None
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
    ) -> JudgeRequest:
        """The request that judges ``claims`` against the sentences in ``view``."""
        template = "verify_local" if stage == "local" else (
            "verify_global_hint" if hint else "verify_global"
        )
        payload = VerifyInput(
            stage="local" if stage == "local" else "global",
            claims=[c.text for c in claims],
            sentences=view,
            chunk=chunk,
            hint=hint,
            question=self.question,
        )
        fields = {
            "context": _render_sentences(view),
            "question": self.question or "(none)",
            "claims": _render_claims(claims),
            "hint": f"S{hint[0]}-S{hint[-1]}" if hint else "",
        }
        return self.session.request("verify", template, payload, fields, follow_up)

    async def judge(
        self,
        claims: list[Claim],
        view: list[Sentence],
        stage: str,
        chunk: int | None = None,
        hint: list[int] | None = None,
    ) -> dict[int, Judged]:
        """Judge ``claims`` against the sentences in ``view``; keyed by claim index."""
        within = (view[0].start, view[-1].end) if view else (0, 0)
        response = await self._send(self.build_request(claims, view, stage, chunk, hint), claims)
        if not isinstance(response.parsed, VerifyOutput):
            return {c.index: Judged(label=None, error=f"judge failed: {response.error}") for c in claims}
        judges = _judges_by_position(response, self.session.backend.name)
        by_position = self._by_position(response.parsed, len(claims))
        results: dict[int, Judged] = {}
        ungrounded: list[int] = []
        for position, claim in enumerate(claims):
            judgement = by_position.get(position)
            if judgement is None:
                continue
            judged = self._ground(judgement, within, judges[position])
            results[claim.index] = judged
            if not judged.grounded:
                ungrounded.append(position)
        if ungrounded:
            reask = self.build_request(
                claims, view, stage, chunk, hint, follow_up=_reask_messages(ungrounded, response.raw)
            )
            await self._reask_ungrounded(claims, ungrounded, reask, within, results)
        missing = [c for c in claims if c.index not in results]
        if missing and len(claims) > 1:
            for claim in missing:
                results.update(await self.judge([claim], view, stage, chunk, hint))
        for claim in missing:
            results.setdefault(claim.index, Judged(label=None, error="judge gave no verdict for the claim"))
        return results

    @staticmethod
    def _by_position(output: VerifyOutput, n_claims: int) -> dict[int, ClaimJudgement]:
        by_position: dict[int, ClaimJudgement] = {}
        for judgement in output.judgements:
            if judgement.claim < n_claims:
                by_position.setdefault(judgement.claim, judgement)
        return by_position

    def _ground(self, judgement: ClaimJudgement, within: tuple[int, int], judge: str) -> Judged:
        if not _needs_evidence(judgement):
            return Judged(
                label=judgement.label,
                rationale=judgement.rationale,
                confidence=judgement.confidence,
                judge=judge,
            )
        evidence, missing = anchor_quotes(self.index, judgement.evidence, within)
        return Judged(
            label=judgement.label,
            evidence=evidence,
            rationale=judgement.rationale,
            confidence=judgement.confidence,
            grounded=bool(evidence) and not missing,
            judge=judge,
            error=(
                f"evidence not found in the context: {missing!r}" if missing
                else None if evidence else "no evidence quoted"
            ),
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
        by_position = (
            self._by_position(response.parsed, len(claims))
            if isinstance(response.parsed, VerifyOutput) else {}
        )
        judges = _judges_by_position(response, self.session.backend.name)
        for position in positions:
            claim = claims[position]
            first = results[claim.index]
            judgement = by_position.get(position)
            second = self._ground(judgement, within, judges[position]) if judgement else None
            if second is not None and second.grounded:
                results[claim.index] = second
            else:
                first.grounded = False
                first.error = f"{first.error}; still ungrounded after a re-ask"


def _judges_by_position(response: JudgeResponse, fallback: str) -> defaultdict[int, str]:
    """Which judge answered for each claim position of a reply (stages differ in a cascade)."""
    judge = response.judge or fallback
    judges: defaultdict[int, str] = defaultdict(lambda: judge)
    if isinstance(response.parsed, VerifyOutput) and response.claim_judges:
        judges.update(zip((j.claim for j in response.parsed.judgements), response.claim_judges, strict=False))
    return judges


def _reask_messages(positions: list[int], raw: str) -> list[Message]:
    return [
        Message(role="assistant", content=raw),
        Message(
            role="user",
            content=(
                f"For claims {positions} your evidence is not a verbatim quote of the context. "
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
    judge: ClaimJudge, claims: list[Claim], chunks: list[Chunk], options: VerifyOptions
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
                votes[claim_index].append(
                    Vote(
                        chunk=chunk.index,
                        label=judged.label,
                        evidence=judged.evidence,
                        rationale=judged.rationale,
                        confidence=judged.confidence,
                        grounded=judged.grounded,
                        judge=judged.judge,
                        error=judged.error,
                    )
                )
        for claim in active:
            votes[claim.index].sort(key=lambda vote: vote.chunk)
    return votes


def deciding_chunk(votes: list[Vote], label: Label) -> int | None:
    """First chunk whose vote equals the local label (None for baseless)."""
    if label == Label.BASELESS:
        return None
    return next((v.chunk for v in votes if v.label == label), None)


async def verify_claims(
    judge: ClaimJudge, claims: list[Claim], chunks: list[Chunk], options: VerifyOptions
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
                label=local,
                evidence=deciding.evidence if deciding else [],
                rationale=deciding.rationale if deciding else "",
                confidence=deciding.confidence if deciding else None,
                grounded=deciding.grounded if deciding else True,
                judge=deciding.judge if deciding else None,
                errors=[f"chunk {v.chunk}: {v.error}" for v in claim_votes if v.error],
            )
        )
    if options.global_verification and judge.index.sentences:
        await verify_globally(judge, claims, verdicts, chunks, options)
    for verdict in verdicts:
        verdict.calls, verdict.cost_usd = judge.charges.get(verdict.index, (0, 0.0))
    return verdicts


async def verify_globally(
    judge: ClaimJudge,
    claims: list[Claim],
    verdicts: list[ClaimVerdict],
    chunks: list[Chunk],
    options: VerifyOptions,
) -> None:
    """Re-judge every claim against the full context, grouped by location hint, in place."""
    groups: dict[int | None, list[Claim]] = {}
    for claim, verdict in zip(claims, verdicts, strict=True):
        groups.setdefault(verdict.hint_chunk, []).append(claim)
    sentences = judge.index.sentences
    calls: list[Coroutine[Any, Any, dict[int, Judged]]] = []
    for hint_chunk, members in groups.items():
        hint = list(chunks[hint_chunk].sentence_ids) if hint_chunk is not None else None
        calls.extend(
            judge.judge(batch, sentences, "global", hint=hint)
            for batch in batches(members, options.batch_claims)
        )
    outcomes: dict[int, Judged] = {}
    for outcome in await asyncio.gather(*calls):
        outcomes.update(outcome)
    for verdict in verdicts:
        judged = outcomes[verdict.index]
        if judged.label is None:
            verdict.errors.append(f"global verification failed ({judged.error}); kept the local label")
            continue
        verdict.label = judged.label
        verdict.evidence = judged.evidence
        verdict.rationale = judged.rationale
        verdict.confidence = judged.confidence
        verdict.grounded = judged.grounded
        verdict.judge = judged.judge
        if judged.error:
            verdict.errors.append(f"global: {judged.error}")
