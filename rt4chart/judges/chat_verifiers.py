"""Chat models trained to verify, as judges: each claim asked in the model's own prompt and read from
its own reply format, over any chat backend (the OpenAI-compatible transport to a vLLM server, litellm).

Patronus' Lynx (``adapter = "lynx"`` in a profile) reads QUESTION, DOCUMENT and ANSWER in the prompt
it was trained with (``prompts/lynx.txt``) and answers ``{"REASONING": ..., "SCORE": "PASS"|"FAIL"}``.
Each claim of a verify request is one Lynx call, its ANSWER the claim and its DOCUMENT the context
sentences in view; PASS is entailed (its evidence: the sentences it was shown, all of which it
judged), FAIL baseless (Lynx does not tell a contradiction from a missing fact). Lynx states no
probability, so its verdicts carry no confidence: in a cascade it is the last stage.

Bespoke-MiniCheck-7B (``adapter = "bespoke-minicheck"``) reads MiniCheck's system prompt and
``Document: ...\nClaim: ...`` (``prompts/bespoke_minicheck.txt``, as its authors' ``LLMCheck`` builds
it) and answers one token, Yes or No. It is asked for that one token with its log probabilities
(``max_tokens: 1``, ``logprobs``, ``top_logprobs: 5``: :class:`~rt4chart.judges.replies.FirstTokenChoices`)
and P(supported) is the probability mass of the candidates that read "yes" (case and surrounding space
ignored), entailed above 0.5 as its authors decide. Its verdicts carry that probability as
``confidence`` and ``score``, as a pair classifier's do, so ``rt4 calibrate`` moves its threshold and a
cascade can let it settle the claims it is sure of.

The fields go into each model's prompt as they are, not between the delimiting tags of rt4chart's own
prompts (:func:`rt4chart.method.prompts.delimit`): the model was trained on this layout, and a
tag it never saw changes what it reads.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from rt4chart.judges.replies import FirstTokenChoices
from rt4chart.method.prompts import PromptTemplate, load_templates
from rt4chart.method.tasks import ClaimJudgement, VerifyInput, VerifyOutput
from rt4chart.protocol import (
    Backend,
    Capabilities,
    CostEstimator,
    GenerationParams,
    JudgeRequest,
    JudgeResponse,
    Message,
    reply_cost_usd,
)
from rt4chart.types import JudgeScore, Label, Usage

ChatAdapter = Literal["lynx", "bespoke-minicheck"]
"""The chat verifiers a profile's ``adapter`` can name."""

LYNX_MAX_TOKENS = 600
"""Completion tokens a Lynx reply may use (its reasoning bullets, then the score)."""

MINICHECK_SUPPORT_THRESHOLD = 0.5
"""P(Yes) above which Bespoke-MiniCheck's claim is supported (its authors' ``final_score > 0.5``)."""


class LynxInput(BaseModel):
    """One Lynx call: a claim as the ANSWER, the sentences in view as the DOCUMENT."""

    question: str
    """The user question ("" when there is none)."""
    context: str
    """The context sentences in view, joined by spaces."""
    answer: str
    """The claim under judgement."""


class LynxReply(BaseModel):
    """Lynx's reply format."""

    REASONING: list[str] | str = ""
    """Its reasoning (bullet points, as a list or one string)."""
    SCORE: Literal["PASS", "FAIL"]
    """PASS: the answer is faithful to the document; FAIL: it is not."""


class MiniCheckInput(BaseModel):
    """One Bespoke-MiniCheck call: the sentences in view as the document, a claim to check against it."""

    document: str
    """The context sentences in view, joined by spaces."""
    claim: str
    """The claim under judgement."""


class MiniCheckReply(FirstTokenChoices):
    """Bespoke-MiniCheck's one-token reply (Yes or No) with the first token's candidates."""

    def support(self) -> float:
        """P(supported): the probability of the candidates that read "yes" (MiniCheck's ``get_support_prob``;
        case and space around the token ignored, as tokenizers render it with or without a leading space)."""
        return min(1.0, sum(math.exp(c.logprob) for c in self.top_logprobs if c.token.strip().lower() == "yes"))


@dataclass(frozen=True)
class Verdict:
    """What one call says of its claim, before it is numbered."""

    entailed: bool
    """Whether the claim is supported by the document it was shown."""
    rationale: str
    """Why, in the model's words or numbers."""
    support: float | None = None
    """P(supported), for a model that states one."""


def _lynx_input(payload: VerifyInput, context: str, claim: str) -> BaseModel:
    return LynxInput(question=payload.question or "", context=context, answer=claim)


def _lynx_verdict(reply: BaseModel) -> Verdict:
    assert isinstance(reply, LynxReply), "the request's reply model"
    reasoning = reply.REASONING
    return Verdict(entailed=reply.SCORE == "PASS",
                   rationale=" ".join(reasoning) if isinstance(reasoning, list) else reasoning)


def _minicheck_input(payload: VerifyInput, context: str, claim: str) -> BaseModel:
    return MiniCheckInput(document=context.strip(), claim=claim.strip())


def _minicheck_verdict(reply: BaseModel) -> Verdict:
    assert isinstance(reply, MiniCheckReply), "the request's reply model"
    support = reply.support()
    return Verdict(entailed=support > MINICHECK_SUPPORT_THRESHOLD, support=support,
                   rationale=f"P(Yes) {support:.3f} (replied {reply.text!r})")


@dataclass(frozen=True)
class AdapterSpec:
    """How one chat verifier is asked and read."""

    template: str
    """Its prompt (``prompts/<template>.txt``)."""
    reply: type[BaseModel]
    """Its reply model (a JSON object, or a first token read from its log probabilities)."""
    max_tokens: int
    """Completion tokens its reply may use."""
    render: Callable[[VerifyInput, str, str], BaseModel]
    """The prompt's fields for one claim, from the request and the context in view."""
    read: Callable[[BaseModel], Verdict]
    """The verdict in its reply."""


ADAPTERS: dict[str, AdapterSpec] = {
    "lynx": AdapterSpec("lynx", LynxReply, LYNX_MAX_TOKENS, _lynx_input, _lynx_verdict),
    "bespoke-minicheck": AdapterSpec("bespoke_minicheck", MiniCheckReply, 1, _minicheck_input, _minicheck_verdict),
}
"""Each chat verifier by the profile's ``adapter`` name."""


class ChatVerifierBackend:
    """A chat verifier (Lynx, Bespoke-MiniCheck) over a chat backend (see the module docstring)."""

    capabilities = Capabilities(can_write_text=False)
    """It verifies claims only: the chat model behind it is asked nothing else."""

    def __init__(self, inner: Backend, adapter: ChatAdapter) -> None:
        self.inner = inner
        self.adapter = adapter
        self.spec = ADAPTERS[adapter]
        self.template: PromptTemplate = load_templates((self.spec.template,))[self.spec.template]

    @property
    def name(self) -> str:
        # The prompt's version is in the name: records and cached replies say which prompt judged.
        return f"{self.inner.name}+{self.adapter}#{self.template.version}"

    def requests(self, payload: VerifyInput) -> list[JudgeRequest]:
        """One call per claim of ``payload``."""
        context = " ".join(sentence.text for sentence in payload.sentences)
        calls = []
        for claim in payload.claims:
            call = self.spec.render(payload, context, claim)
            fields = call.model_dump()
            system = self.template.system.substitute(fields)
            messages = [Message(role="system", content=system)] if system else []
            messages.append(Message(role="user", content=self.template.user.substitute(fields)))
            calls.append(JudgeRequest(
                task=f"verify_{self.spec.template}", payload=call, output_schema=self.spec.reply,
                messages=messages, prompt_version=self.template.version,
                params=GenerationParams(max_tokens=self.spec.max_tokens),
            ))
        return calls

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        started = time.perf_counter()
        payload = request.payload
        if not isinstance(payload, VerifyInput):
            return JudgeResponse(error=f"the chat verifier {self.name} only verifies claims; use the rule-based "
                                 "decomposer", usage=Usage(calls=0), judge=self.name)
        replies = await asyncio.gather(*(self.inner.complete(call) for call in self.requests(payload)))
        usage = Usage()
        for reply in replies:
            usage = usage + reply.usage
        failed = next((reply for reply in replies if not isinstance(reply.parsed, self.spec.reply)), None)
        if failed is not None:
            return JudgeResponse(error=failed.error or f"no {self.adapter} reply", usage=usage, judge=self.name,
                                 latency_s=time.perf_counter() - started)
        judgements = []
        for position, reply in enumerate(replies):
            assert reply.parsed is not None, "checked above"
            verdict = self.spec.read(reply.parsed)
            judgements.append(self._judgement(position, verdict, payload))
        parsed = VerifyOutput(judgements=judgements)
        return JudgeResponse(parsed=parsed, raw=parsed.model_dump_json(), usage=usage, judge=self.name,
                             latency_s=time.perf_counter() - started)

    @staticmethod
    def _judgement(position: int, verdict: Verdict, payload: VerifyInput) -> ClaimJudgement:
        """Claim ``position``'s judgement: entailed with every sentence shown as its evidence (the model
        judged them together), else baseless (these models do not tell a contradiction from a missing fact)."""
        label = Label.ENTAILED if verdict.entailed else Label.BASELESS
        evidence = [sentence.text for sentence in payload.sentences] if verdict.entailed else []
        if verdict.support is None:
            return ClaimJudgement(claim=position, label=label, evidence=evidence, rationale=verdict.rationale)
        # The probability of the label given, and P(not supported) against the threshold, as a pair
        # classifier states them: rt4 calibrate and cascades read them alike.
        return ClaimJudgement(
            claim=position, label=label, evidence=evidence, rationale=verdict.rationale,
            confidence=verdict.support if verdict.entailed else 1.0 - verdict.support,
            score=JudgeScore(p_unsupported=1.0 - verdict.support, threshold=1.0 - MINICHECK_SUPPORT_THRESHOLD,
                             decided_by="head"),
        )

    def max_cost_usd(self, request: JudgeRequest) -> float:
        if not isinstance(request.payload, VerifyInput):
            return 0.0
        if not isinstance(self.inner, CostEstimator):
            return 0.0
        return sum(self.inner.max_cost_usd(call) for call in self.requests(request.payload))

    def call_cost_usd(self, request: JudgeRequest, completion_tokens: int) -> float:
        if not isinstance(request.payload, VerifyInput):
            return 0.0
        calls = self.requests(request.payload)
        return sum(reply_cost_usd(self.inner, call, completion_tokens // max(1, len(calls))) for call in calls)

    async def aclose(self) -> None:
        await self.inner.aclose()
