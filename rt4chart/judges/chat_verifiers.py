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

IBM's Granite Guardian asks its groundedness risk of each claim in the model's own chat template, which
the server applies (a stock ``vllm serve``): rt4chart sends the turns and template arguments its
authors pass to ``apply_chat_template``, never a prompt rendered here, which the template would wrap as
a user message to be judged for harm. ``adapter = "granite-guardian"`` (3.0-3.2) sends a ``context``
turn (the sentences in view) and an ``assistant`` turn (the claim) with ``guardian_config =
{"risk_name": "groundedness"}``; ``"granite-guardian-3.3"`` sends the claim as the ``assistant`` turn,
the sentences in view as ``documents`` and ``guardian_config = {"criteria_id": "groundedness"}``,
``think`` off. Its answer is about risk: "Yes" is a claim NOT grounded. 3.0-3.2 answer Yes or No as the
first token, read from its log probabilities as their authors read them (P(risk) = P(yes) / (P(yes) +
P(no)) over the candidates), P(supported) = 1 - P(risk), entailed above 0.5; 3.3 answers ``<score> yes|no
</score>``, read from the text when the first token's candidates hold no Yes or No (as from 3.3, or a
server without log probabilities). A verdict read from the text states no probability (as Lynx's).

Long contexts: with ``max_model_len`` (the server's context length), the sentences in view are packed,
whole and in order, into chunks such that each call fits in it beside the prompt, the claim and the
reply (the authors of Bespoke-MiniCheck cut documents into chunks of 32768 - 300 tokens), each chunk is
asked, and the claim takes its best chunk's verdict (their max over chunks): entailed when any chunk
entails it, with that chunk's sentences as evidence. Tokens are counted conservatively as UTF-8 bytes
(:func:`~rt4chart.judges.replies.prompt_token_bound`: no byte-level tokenizer makes more tokens than
bytes), so a chunk may hold fewer tokens than the server could take, never more; a sentence longer than
a chunk is cut at a character boundary. Without ``max_model_len`` the whole context in view is one call.

The fields go into each model's prompt as they are, not between the delimiting tags of rt4chart's own
prompts (:func:`rt4chart.method.prompts.delimit`): the model was trained on this layout, and a
tag it never saw changes what it reads.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from rt4chart.judges.packing import pack_sentences
from rt4chart.judges.replies import FirstTokenChoices, TokenLogprob, prompt_token_bound
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

ChatAdapter = Literal["lynx", "bespoke-minicheck", "granite-guardian", "granite-guardian-3.3"]
"""The chat verifiers a profile's ``adapter`` can name."""

LYNX_MAX_TOKENS = 600
"""Completion tokens a Lynx reply may use (its reasoning bullets, then the score)."""

SUPPORT_THRESHOLD = 0.5
"""P(supported) above which a claim is supported (Bespoke-MiniCheck's authors' ``final_score > 0.5``;
Granite Guardian's P(risk) below 0.5)."""

GUARDIAN_TEMPLATE_TOKENS = 2048
"""Tokens Granite Guardian's chat template may write around the turns: its system message, instructions
and risk definition (about 1,100 bytes in 3.1's), with room to spare for later releases' longer ones."""

GUARDIAN_3_3_MAX_TOKENS = 32
"""Completion tokens of a Granite Guardian 3.3 reply without thinking (``<score> yes </score>``)."""


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


class GuardianInput(BaseModel):
    """One Granite Guardian call: the sentences in view as the context, a claim as the assistant's message."""

    context: str
    """The context sentences in view, joined by spaces."""
    claim: str
    """The claim under judgement."""


_SCORE_TAG = re.compile(r"<score>\s*(yes|no)\s*</score>", re.IGNORECASE)
_FIRST_WORD = re.compile(r"\A\W*(yes|no)\b", re.IGNORECASE)


class GuardianReply(FirstTokenChoices):
    """Granite Guardian's groundedness answer: Yes (risk: not grounded) or No, as the first token with
    its candidates (3.0-3.2) or in a ``<score>`` tag (3.3)."""

    NEEDS_LOGPROBS: ClassVar[bool] = False
    top_logprobs: list[TokenLogprob] = Field(default_factory=list)
    """The first token's most likely candidates (none from a server that returns no log probabilities)."""

    def _mass(self, word: str) -> float:
        return sum(math.exp(c.logprob) for c in self.top_logprobs if c.token.strip().lower() == word)

    def risk(self) -> float | None:
        """P(risk) from the first token's Yes/No candidates (the authors' softmax over the two masses),
        or ``None`` when they hold neither."""
        yes, no = self._mass("yes"), self._mass("no")
        return yes / (yes + no) if yes + no > 0 else None

    def stated(self) -> bool | None:
        """The risk its text states: the ``<score>`` tag (3.3), else a leading Yes or No; ``None``: neither."""
        found = _SCORE_TAG.search(self.text) or _FIRST_WORD.search(self.text)
        return None if found is None else found.group(1).lower() == "yes"

    @model_validator(mode="after")
    def _readable(self) -> GuardianReply:
        if self.risk() is None and self.stated() is None:
            raise ValueError("neither Yes/No candidates among the first token's log probabilities nor a "
                             "'<score> yes|no </score>' tag or a leading Yes/No in the reply")
        return self


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
    return Verdict(entailed=support > SUPPORT_THRESHOLD, support=support,
                   rationale=f"P(Yes) {support:.3f} (replied {reply.text!r})")


def _guardian_input(payload: VerifyInput, context: str, claim: str) -> BaseModel:
    return GuardianInput(context=context.strip(), claim=claim.strip())


def _guardian_turns(call: BaseModel) -> tuple[list[Message], dict[str, Any]]:
    """Granite Guardian 3.0-3.2: a context turn and the claim as the assistant's, the risk by name."""
    assert isinstance(call, GuardianInput), "the adapter's own input"
    return ([Message(role="context", content=call.context), Message(role="assistant", content=call.claim)],
            {"guardian_config": {"risk_name": "groundedness"}})


def _guardian_3_3_turns(call: BaseModel) -> tuple[list[Message], dict[str, Any]]:
    """Granite Guardian 3.3: the claim as the assistant's turn, the context as its one document."""
    assert isinstance(call, GuardianInput), "the adapter's own input"
    return ([Message(role="assistant", content=call.claim)],
            {"guardian_config": {"criteria_id": "groundedness"}, "documents": [{"doc_id": "0", "text": call.context}],
             "think": False})


def _guardian_verdict(reply: BaseModel) -> Verdict:
    assert isinstance(reply, GuardianReply), "the request's reply model"
    risk = reply.risk()
    if risk is None:
        stated = reply.stated()
        assert stated is not None, "the reply model refuses a reply that states no risk"
        return Verdict(entailed=not stated, rationale=f"replied {reply.text.strip()!r} (no log probabilities)")
    return Verdict(entailed=1.0 - risk > SUPPORT_THRESHOLD, support=1.0 - risk,
                   rationale=f"P(risk) {risk:.3f} (replied {reply.text!r})")


ChatTemplateTurns = Callable[[BaseModel], tuple[list[Message], dict[str, Any]]]
"""The turns and chat-template arguments of one call, for a model whose own template the server applies."""


@dataclass(frozen=True)
class AdapterSpec:
    """How one chat verifier is asked and read."""

    prompt: str | ChatTemplateTurns
    """Its prompt: ``prompts/<name>.txt`` rendered here, or the turns and arguments the model's own chat
    template takes (the server renders them)."""
    reply: type[BaseModel]
    """Its reply model (a JSON object, or a first token read from its log probabilities)."""
    max_tokens: int
    """Completion tokens its reply may use."""
    render: Callable[[VerifyInput, str, str], BaseModel]
    """The prompt's fields for one claim, from the request and the context in view."""
    read: Callable[[BaseModel], Verdict]
    """The verdict in its reply."""
    template_tokens: int = 0
    """Tokens the server's chat template writes around the turns, beyond what
    :func:`~rt4chart.judges.replies.prompt_token_bound` allows per message (a model's own template with
    its instructions); what a chunk of context leaves room for."""


ADAPTERS: dict[str, AdapterSpec] = {
    "lynx": AdapterSpec("lynx", LynxReply, LYNX_MAX_TOKENS, _lynx_input, _lynx_verdict),
    "bespoke-minicheck": AdapterSpec("bespoke_minicheck", MiniCheckReply, 1, _minicheck_input, _minicheck_verdict),
    # One token: 3.2's reply goes on with a <confidence> tag that the verdict does not need.
    "granite-guardian": AdapterSpec(_guardian_turns, GuardianReply, 1, _guardian_input, _guardian_verdict,
                                    GUARDIAN_TEMPLATE_TOKENS),
    "granite-guardian-3.3": AdapterSpec(_guardian_3_3_turns, GuardianReply, GUARDIAN_3_3_MAX_TOKENS,
                                        _guardian_input, _guardian_verdict, GUARDIAN_TEMPLATE_TOKENS),
}
"""Each chat verifier by the profile's ``adapter`` name."""


def _source_version(turns: ChatTemplateTurns) -> str:
    """A version for turns built in code: the hash of the turns and arguments of a call with fixed fields."""
    messages, arguments = turns(GuardianInput(context="$context", claim="$claim"))
    shape = json.dumps([[m.model_dump() for m in messages], arguments], sort_keys=True)
    return hashlib.sha256(shape.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Call:
    """One request to the chat model: a claim asked against one chunk of the sentences in view."""

    claim: int
    """The claim's position in the verify request."""
    sentences: tuple[int, ...]
    """Positions of the chunk's sentences in the verify request."""
    request: JudgeRequest
    """What is sent."""


class ContextTooLong(ValueError):
    """A claim whose prompt alone leaves no room for context within ``max_model_len``."""


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8"))


def _cut_to_bytes(text: str, budget: int) -> str:
    """``text`` within ``budget`` UTF-8 bytes, cut at a character boundary."""
    return text.encode("utf-8")[:budget].decode("utf-8", errors="ignore")


class ChatVerifierBackend:
    """A chat verifier (Lynx, Bespoke-MiniCheck, Granite Guardian) over a chat backend (see the module docstring)."""

    capabilities = Capabilities(can_write_text=False)
    """It verifies claims only: the chat model behind it is asked nothing else."""

    def __init__(self, inner: Backend, adapter: ChatAdapter, max_model_len: int | None = None) -> None:
        self.inner = inner
        self.adapter = adapter
        self.spec = ADAPTERS[adapter]
        self.max_model_len = max_model_len
        prompt = self.spec.prompt
        self.template: PromptTemplate | None = None
        if isinstance(prompt, str):
            self.template = load_templates((prompt,))[prompt]
            self.version = self.template.version
        else:
            self.version = _source_version(prompt)

    @property
    def name(self) -> str:
        # The prompt's version is in the name: records and cached replies say which prompt judged.
        return f"{self.inner.name}+{self.adapter}#{self.version}"

    def request(self, payload: VerifyInput, context: str, claim: str) -> JudgeRequest:
        """The call asking ``claim`` against ``context``."""
        call = self.spec.render(payload, context, claim)
        arguments: dict[str, Any] | None = None
        if self.template is None:
            assert not isinstance(self.spec.prompt, str), "an adapter without a prompt file builds its turns"
            messages, arguments = self.spec.prompt(call)
        else:
            fields = call.model_dump()
            system = self.template.system.substitute(fields)
            messages = [Message(role="system", content=system)] if system else []
            messages.append(Message(role="user", content=self.template.user.substitute(fields)))
        name = self.spec.prompt if isinstance(self.spec.prompt, str) else self.adapter.replace("-", "_")
        return JudgeRequest(
            task=f"verify_{name}", payload=call, output_schema=self.spec.reply, messages=messages,
            prompt_version=self.version, params=GenerationParams(max_tokens=self.spec.max_tokens),
            template_kwargs=arguments,
        )

    def calls(self, payload: VerifyInput) -> list[Call]:
        """Every call of ``payload``: each claim against each chunk of the sentences in view (one chunk,
        all of them, without ``max_model_len``)."""
        texts = [sentence.text for sentence in payload.sentences]
        everything = tuple(range(len(texts)))
        calls = []
        for position, claim in enumerate(payload.claims):
            if self.max_model_len is None:
                calls.append(Call(position, everything, self.request(payload, " ".join(texts), claim)))
                continue
            # The call's bound without context: what the prompt, the claim and the reply leave for it.
            prompt = prompt_token_bound(self._sent(self.request(payload, "", claim))) + self.spec.template_tokens
            room = self.max_model_len - self.spec.max_tokens - prompt
            if room < 1:
                raise ContextTooLong(f"claim {position} leaves no room for context within max_model_len "
                                     f"{self.max_model_len} (its prompt alone may take {prompt} tokens)")
            for chunk in pack_sentences(texts, room, _utf8_size) or [()]:
                context = _cut_to_bytes(" ".join(texts[i] for i in chunk), room)
                calls.append(Call(position, chunk, self.request(payload, context, claim)))
        return calls

    @staticmethod
    def _sent(request: JudgeRequest) -> list[Message]:
        """What a request sends that counts against the context length: its messages, and the template's
        arguments (a document) as one more message."""
        if request.template_kwargs is None:
            return request.messages
        return [*request.messages, Message(role="context", content=json.dumps(request.template_kwargs))]

    def requests(self, payload: VerifyInput) -> list[JudgeRequest]:
        """Every request sent for ``payload``."""
        return [call.request for call in self.calls(payload)]

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        started = time.perf_counter()
        payload = request.payload
        if not isinstance(payload, VerifyInput):
            return JudgeResponse(error=f"the chat verifier {self.name} only verifies claims; use the rule-based "
                                 "decomposer", usage=Usage(calls=0), judge=self.name)
        try:
            calls = self.calls(payload)
        except ContextTooLong as error:
            return JudgeResponse(error=str(error), usage=Usage(calls=0), judge=self.name)
        replies = await asyncio.gather(*(self.inner.complete(call.request) for call in calls))
        usage = Usage()
        for reply in replies:
            usage = usage + reply.usage
        failed = next((reply for reply in replies if not isinstance(reply.parsed, self.spec.reply)), None)
        if failed is not None:
            return JudgeResponse(error=failed.error or f"no {self.adapter} reply", usage=usage, judge=self.name,
                                 latency_s=time.perf_counter() - started)
        verdicts: dict[int, list[tuple[Verdict, tuple[int, ...]]]] = {}
        for call, reply in zip(calls, replies, strict=True):
            assert reply.parsed is not None, "checked above"
            verdicts.setdefault(call.claim, []).append((self.spec.read(reply.parsed), call.sentences))
        judgements = [self._judgement(position, verdicts[position], payload) for position in sorted(verdicts)]
        parsed = VerifyOutput(judgements=judgements)
        return JudgeResponse(parsed=parsed, raw=parsed.model_dump_json(), usage=usage, judge=self.name,
                             latency_s=time.perf_counter() - started)

    @staticmethod
    def _judgement(position: int, chunks: list[tuple[Verdict, tuple[int, ...]]],
                   payload: VerifyInput) -> ClaimJudgement:
        """Claim ``position``'s judgement from its best chunk (entailed before not, then the higher
        P(supported)): entailed with that chunk's sentences as its evidence (the model judged them
        together), else baseless (these models do not tell a contradiction from a missing fact)."""
        verdict, sentences = max(chunks, key=lambda chunk: (chunk[0].entailed, chunk[0].support or 0.0))
        label = Label.ENTAILED if verdict.entailed else Label.BASELESS
        evidence = [payload.sentences[i].text for i in sentences] if verdict.entailed else []
        rationale = verdict.rationale if len(chunks) == 1 else f"{verdict.rationale}; the best of {len(chunks)} chunks"
        if verdict.support is None:
            return ClaimJudgement(claim=position, label=label, evidence=evidence, rationale=rationale)
        # The probability of the label given, and P(not supported) against the threshold, as a pair
        # classifier states them: rt4 calibrate and cascades read them alike.
        return ClaimJudgement(
            claim=position, label=label, evidence=evidence, rationale=rationale,
            confidence=verdict.support if verdict.entailed else 1.0 - verdict.support,
            score=JudgeScore(p_unsupported=1.0 - verdict.support, threshold=1.0 - SUPPORT_THRESHOLD,
                             decided_by="head"),
        )

    def max_cost_usd(self, request: JudgeRequest) -> float:
        if not isinstance(request.payload, VerifyInput) or not isinstance(self.inner, CostEstimator):
            return 0.0
        try:
            return sum(self.inner.max_cost_usd(call) for call in self.requests(request.payload))
        except ContextTooLong:
            return 0.0

    def call_cost_usd(self, request: JudgeRequest, completion_tokens: int) -> float:
        if not isinstance(request.payload, VerifyInput):
            return 0.0
        try:
            calls = self.requests(request.payload)
        except ContextTooLong:
            return 0.0
        return sum(reply_cost_usd(self.inner, call, completion_tokens // max(1, len(calls))) for call in calls)

    async def aclose(self) -> None:
        await self.inner.aclose()
