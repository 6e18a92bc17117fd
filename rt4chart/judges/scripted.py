"""A judge that replays verdicts from a rules file: exact, free, and chosen openly.

It implements the same backend contract as every model-backed judge (it reads the request's
structured payload instead of its messages), so tests and users can pin exact verdicts::

    {"decompose": {"<substring of an answer sentence>": ["claim", "claim"]},
     "verify": [{"claim": "<substring of the claim>", "stage": "local",
                 "chunk_contains": "<substring of the chunk text>", "label": "contradicted",
                 "evidence": ["<exact substring of the context>"]}],
     "repair": [{"sentence": "<substring of the answer sentence>", "text": "its rewrite"}],
     "default": "baseless"}

The first matching rule wins; an answer sentence with no decompose rule becomes one claim;
``stage`` and ``chunk_contains`` are optional; an unmatched claim gets ``default``. Optional
``cost_per_call`` (USD) and ``latency_s`` make it stand in for a paid or slow judge; token counts
are estimated as one token per four characters of the messages and the reply. A repair request
(``rt4 repair``) gets the ``text`` of the first ``repair`` rule whose ``sentence`` is in the sentence;
with no rule, the sentence's kept claims joined by spaces (its unsupported claims left out).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
from rt4chart.protocol import Capabilities, JudgeRequest, JudgeResponse, approximate_tokens
from rt4chart.types import Label, Sentence, Usage


class VerifyRule(BaseModel):
    """One scripted verdict."""

    # A misspelt key (``chunk_contain``) would silently widen the rule to every chunk.
    model_config = ConfigDict(extra="forbid")

    claim: str
    """Substring of the claim text the rule applies to."""
    stage: Literal["local", "global"] | None = None
    """Stage the rule applies to; both when absent."""
    chunk_contains: str | None = None
    """Substring the judged context view must contain."""
    label: Label
    """Verdict to return."""
    evidence: list[str] = Field(default_factory=list)
    """Quotes to return as evidence (should be exact substrings of the context)."""
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    """Confidence to report."""


class RepairRule(BaseModel):
    """One scripted rewrite of an answer sentence."""

    model_config = ConfigDict(extra="forbid")

    sentence: str
    """Substring of the answer sentence the rule applies to."""
    text: str
    """The rewritten sentence to return (empty deletes the sentence)."""


class ScriptedRules(BaseModel):
    """The rules file."""

    model_config = ConfigDict(extra="forbid")

    decompose: dict[str, list[str]] = Field(default_factory=dict)
    """Answer-sentence substring -> claims of that sentence."""
    verify: list[VerifyRule] = Field(default_factory=list)
    """Verdict rules, first match wins."""
    repair: list[RepairRule] = Field(default_factory=list)
    """Sentence rewrites for repair requests, first match wins."""
    default: Label = Label.BASELESS
    """Verdict for a claim no rule matches."""
    cost_per_call: float = Field(default=0.0, ge=0.0)
    """USD charged per call, to stand in for a paid judge."""
    latency_s: float = Field(default=0.0, ge=0.0)
    """Seconds each call takes, to stand in for a slow judge."""


def _squash(text: str) -> str:
    return " ".join(text.split())


class ScriptedBackend:
    """Backend that answers from :class:`ScriptedRules`."""

    def __init__(self, rules: ScriptedRules, name: str = "scripted") -> None:
        self.rules = rules
        self._name = name

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedBackend:
        """Load a rules file; raises ``ValueError`` naming the file when it is unusable."""
        try:
            source = Path(path).read_text(encoding="utf-8")
            rules = ScriptedRules.model_validate(json.loads(source))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValidationError) as error:
            raise ValueError(f"cannot use scripted rules file {str(path)!r}: {error}") from error
        # The content hash in the name keeps cached replies of an edited rules file from being reused.
        digest = hashlib.sha256(source.encode()).hexdigest()[:8]
        return cls(rules, name=f"scripted:{Path(path).name}#{digest}")

    @property
    def name(self) -> str:
        return self._name

    capabilities = Capabilities()
    """Rules answer every step, decomposition and repair included."""

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        started = time.perf_counter()
        if self.rules.latency_s:
            await asyncio.sleep(self.rules.latency_s)
        parsed = self._reply(request.payload)
        if parsed is None:
            return JudgeResponse(error=f"the scripted judge cannot answer {request.task!r} requests", judge=self.name)
        raw = parsed.model_dump_json()
        prompt = "".join(m.content for m in request.messages)
        return JudgeResponse(
            parsed=parsed,
            raw=raw,
            usage=Usage(
                calls=1,
                prompt_tokens=approximate_tokens(prompt),
                completion_tokens=approximate_tokens(raw),
                cost_usd=self.rules.cost_per_call,
            ),
            latency_s=time.perf_counter() - started,
            judge=self.name,
        )

    def _reply(self, payload: BaseModel) -> BaseModel | None:
        if isinstance(payload, DecomposeInput):
            return self._decompose(payload)
        if isinstance(payload, VerifyInput):
            return self._verify(payload)
        if isinstance(payload, HolisticDecomposeInput):
            return self._decompose_holistic(payload)
        if isinstance(payload, DirectInput):
            return self._direct(payload)
        if isinstance(payload, RepairInput):
            return self._repair(payload)
        if isinstance(payload, DecomposeSentenceInput):
            target = DecomposeInput(question=payload.question, sentences=[payload.sentences[payload.target]])
            return SentenceClaims(claims=self._decompose(target).sentences[0].claims)
        return None

    def _repair(self, payload: RepairInput) -> RepairOutput:
        rewritten = []
        for item in payload.items:
            rule = next((r for r in self.rules.repair if r.sentence in item.text), None)
            text = rule.text if rule is not None else " ".join(item.keep)
            rewritten.append(RepairedSentence(sentence=item.sentence, text=text))
        return RepairOutput(sentences=rewritten)

    def _decompose_holistic(self, payload: HolisticDecomposeInput) -> HolisticDecomposeOutput:
        """The decompose rules applied sentence by sentence, returned as one list of claims."""
        per_sentence = self._decompose(DecomposeInput(question=payload.question, sentences=payload.sentences))
        return HolisticDecomposeOutput(claims=[c for entry in per_sentence.sentences for c in entry.claims])

    def _direct(self, payload: DirectInput) -> DirectOutput:
        """Each answer sentence judged by the verify rules against the whole context (stage
        ``global``); the sentences not entailed come back as hallucinated spans."""
        sentences = payload.sentences
        whole_context = Sentence(index=0, start=0, end=len(payload.context), text=payload.context)
        verdicts = self._verify(
            VerifyInput(stage="global", claims=sentences, sentences=[whole_context], question=payload.question)
        )
        return DirectOutput(
            spans=[
                DirectSpan(
                    text=sentences[j.claim], label=j.label, evidence=j.evidence, rationale=j.rationale,
                    confidence=j.confidence,
                )
                for j in verdicts.judgements if j.label != Label.ENTAILED
            ]
        )

    def _decompose(self, payload: DecomposeInput) -> DecomposeOutput:
        entries = []
        for position, sentence in enumerate(payload.sentences):
            claims = next(
                (claims for key, claims in self.rules.decompose.items() if key in sentence),
                [sentence],
            )
            entries.append(DecomposedSentence(sentence=position, claims=claims))
        return DecomposeOutput(sentences=entries)

    def _verify(self, payload: VerifyInput) -> VerifyOutput:
        # Whitespace-insensitive, so a chunk_contains copied across a line or passage break matches.
        view = _squash(" ".join(s.text for s in payload.sentences))
        judgements = []
        for position, claim in enumerate(payload.claims):
            rule = next(
                (
                    r for r in self.rules.verify
                    if r.claim in claim
                    and r.stage in (None, payload.stage)
                    and (r.chunk_contains is None or _squash(r.chunk_contains) in view)
                ),
                None,
            )
            if rule is None:
                judgements.append(
                    ClaimJudgement(claim=position, label=self.rules.default, rationale="no rule matched")
                )
            else:
                judgements.append(
                    ClaimJudgement(
                        claim=position,
                        label=rule.label,
                        evidence=rule.evidence,
                        rationale=f"scripted rule {self.rules.verify.index(rule)}",
                        confidence=rule.confidence,
                    )
                )
        return VerifyOutput(judgements=judgements)

    def max_cost_usd(self, request: JudgeRequest) -> float:
        return self.rules.cost_per_call

    def call_cost_usd(self, request: JudgeRequest, completion_tokens: int) -> float:
        return self.rules.cost_per_call

    async def aclose(self) -> None:
        return None
