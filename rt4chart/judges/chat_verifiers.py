"""Chat models trained to verify, as judges: each claim asked in the model's own prompt and read from
its own reply format, over any chat backend (the OpenAI-compatible transport to a vLLM server, litellm).

Patronus' Lynx (``adapter = "lynx"`` in a profile) reads QUESTION, DOCUMENT and ANSWER in the prompt
it was trained with (``prompts/lynx.txt``) and answers ``{"REASONING": ..., "SCORE": "PASS"|"FAIL"}``.
Each claim of a verify request is one Lynx call, its ANSWER the claim and its DOCUMENT the context
sentences in view; PASS is entailed (its evidence: the sentences it was shown, all of which it
judged), FAIL baseless (Lynx does not tell a contradiction from a missing fact). Lynx states no
probability, so its verdicts carry no confidence: in a cascade it is the last stage.

The fields go into Lynx's prompt as they are, not between the delimiting tags of rt4chart's own
prompts (:func:`rt4chart.method.prompts.delimit`): the model was trained on this layout, and a
tag it never saw changes what it reads.
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from pydantic import BaseModel

from rt4chart.method.prompts import load_templates
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
from rt4chart.types import Label, Usage

ChatAdapter = Literal["lynx"]
"""The chat verifiers a profile's ``adapter`` can name."""

LYNX_MAX_TOKENS = 600
"""Completion tokens a Lynx reply may use (its reasoning bullets, then the score)."""


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


class ChatVerifierBackend:
    """A chat verifier (Lynx) over a chat backend (see the module docstring)."""

    capabilities = Capabilities(can_write_text=False)
    """It verifies claims only: the chat model behind it is asked nothing else."""

    def __init__(self, inner: Backend, adapter: ChatAdapter) -> None:
        self.inner = inner
        self.adapter = adapter
        self.template = load_templates(("lynx",))["lynx"]

    @property
    def name(self) -> str:
        # The prompt's version is in the name: records and cached replies say which prompt judged.
        return f"{self.inner.name}+{self.adapter}#{self.template.version}"

    def requests(self, payload: VerifyInput) -> list[JudgeRequest]:
        """One Lynx call per claim of ``payload``."""
        context = " ".join(sentence.text for sentence in payload.sentences)
        calls = []
        for claim in payload.claims:
            call = LynxInput(question=payload.question or "", context=context, answer=claim)
            user = self.template.user.substitute(call.model_dump())
            calls.append(JudgeRequest(
                task="verify_lynx", payload=call, output_schema=LynxReply,
                messages=[Message(role="user", content=user)], prompt_version=self.template.version,
                params=GenerationParams(max_tokens=LYNX_MAX_TOKENS),
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
        failed = next((reply for reply in replies if not isinstance(reply.parsed, LynxReply)), None)
        if failed is not None:
            return JudgeResponse(error=failed.error or "no Lynx reply", usage=usage, judge=self.name,
                                 latency_s=time.perf_counter() - started)
        judgements = []
        for position, reply in enumerate(replies):
            assert isinstance(reply.parsed, LynxReply), "checked above"
            passed = reply.parsed.SCORE == "PASS"
            reasoning = reply.parsed.REASONING
            judgements.append(ClaimJudgement(
                claim=position,
                label=Label.ENTAILED if passed else Label.BASELESS,
                evidence=[sentence.text for sentence in payload.sentences] if passed else [],
                rationale=" ".join(reasoning) if isinstance(reasoning, list) else reasoning,
            ))
        parsed = VerifyOutput(judgements=judgements)
        return JudgeResponse(parsed=parsed, raw=parsed.model_dump_json(), usage=usage, judge=self.name,
                             latency_s=time.perf_counter() - started)

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
