"""The backend contract: the one cut between the method and any judge model.

A backend answers one :class:`JudgeRequest` with one :class:`JudgeResponse`. The request carries
both the rendered chat messages (what a language model reads) and the structured payload they were
rendered from (what a non-LLM judge such as the scripted or embedded one reads). A backend never
raises for a judge failure: the response carries ``error`` and no ``parsed`` object, so a bad reply
becomes data on one claim instead of crashing a batch.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rt4chart.types import Label, Sentence, Usage

Task = Literal["decompose", "verify", "decompose_holistic", "direct", "repair"]


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant"]
    """Who speaks."""
    content: str
    """What is said."""


DEFAULT_MAX_TOKENS = 1024
"""Completion tokens a judge call may use unless told otherwise (room for a batch of judgements)."""


class GenerationParams(BaseModel):
    """Sampling parameters; every field is part of the cache key."""

    model_config = ConfigDict(frozen=True)

    temperature: float = 0.0
    """Sampling temperature; 0 for reproducible verdicts."""
    seed: int | None = 0
    """Sampling seed, for providers that honour one."""
    max_tokens: int = DEFAULT_MAX_TOKENS
    """Upper bound on completion tokens (also the worst case a budget reserves)."""


class DecomposeInput(BaseModel):
    """What the decomposer sees: the answer's sentences and the question, never the context."""

    question: str | None
    """The user question, if any."""
    sentences: list[str]
    """Answer sentences, numbered by position."""


class VerifyInput(BaseModel):
    """What a verifier sees for one call: claims and the context sentences in view."""

    stage: Literal["local", "global"]
    """Local (one chunk) or global (full context) verification."""
    claims: list[str]
    """Claims to judge, numbered by position in this list."""
    sentences: list[Sentence]
    """Context sentences in view: the chunk's for local, all for global."""
    chunk: int | None = None
    """Index of the chunk under judgement (local stage only)."""
    hint: list[int] | None = None
    """Sentence ids of the deciding local chunk, passed as a location hint (global stage only)."""
    question: str | None = None
    """The user question, if any."""


class DecomposedSentence(BaseModel):
    """Claims drawn from one answer sentence."""

    sentence: int = Field(ge=0)
    """Index of the answer sentence."""
    claims: list[str]
    """Self-contained claims stated by that sentence (empty when it states no fact)."""


class DecomposeOutput(BaseModel):
    """Judge reply schema for decomposition."""

    sentences: list[DecomposedSentence]
    """One entry per answer sentence."""


class ClaimJudgement(BaseModel):
    """Judge reply for one claim."""

    claim: int = Field(ge=0)
    """Index of the claim in the request."""
    label: Label
    """entailed, contradicted or baseless."""
    evidence: list[str] = Field(default_factory=list)
    """Verbatim quotes from the context that support or refute the claim."""
    rationale: str = ""
    """One or two sentences explaining the label."""
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    """Judge's confidence in the label, when it reports one."""


class VerifyOutput(BaseModel):
    """Judge reply schema for verification: one judgement per claim of the request."""

    judgements: list[ClaimJudgement]
    """Verdicts, one per claim."""


class HolisticDecomposeInput(BaseModel):
    """Holistic decomposition (ablation): the whole answer at once, no sentence numbering."""

    question: str | None
    """The user question, if any."""
    answer: str
    """The whole answer."""


class HolisticDecomposeOutput(BaseModel):
    """Judge reply schema for holistic decomposition."""

    claims: list[str]
    """Self-contained claims of the answer, not tied to any answer sentence."""


class DirectInput(BaseModel):
    """The direct baseline (ablation): one call over the whole context and answer."""

    question: str | None
    """The user question, if any."""
    context: str
    """The whole context (passages joined)."""
    answer: str
    """The whole answer."""


class DirectSpan(BaseModel):
    """One hallucinated part of the answer, as the direct baseline reports it."""

    text: str
    """Verbatim quote of the answer."""
    label: Label
    """contradicted or baseless (a span labelled entailed is not a hallucination and is ignored)."""
    rationale: str = ""
    """One sentence explaining the label."""
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    """Judge's confidence that the span is hallucinated, when it reports one."""


class DirectOutput(BaseModel):
    """Judge reply schema for the direct baseline: the hallucinated spans (empty when faithful)."""

    spans: list[DirectSpan]
    """Hallucinated answer spans."""


class RepairItem(BaseModel):
    """One answer sentence to repair (issue 18): which of its claims stay, and which go or get fixed."""

    sentence: int = Field(ge=0)
    """Position of the item in the request."""
    text: str
    """The answer sentence as it stands."""
    keep: list[str] = Field(default_factory=list)
    """Supported claims of the sentence: the rewrite must still state them."""
    fix: list[str] = Field(default_factory=list)
    """Unsupported claims to rewrite so that the context supports them (or leave out if it cannot)."""
    drop: list[str] = Field(default_factory=list)
    """Unsupported claims the rewrite must no longer state."""


class RepairInput(BaseModel):
    """What a repairing judge sees: the context and the flagged sentences of one answer."""

    question: str | None
    """The user question, if any."""
    context: list[Sentence]
    """All context sentences (a fix may draw on any of them)."""
    items: list[RepairItem]
    """The sentences to rewrite, in answer order."""


class RepairedSentence(BaseModel):
    """Judge reply for one sentence to repair."""

    sentence: int = Field(ge=0)
    """Position of the item in the request."""
    text: str
    """The rewritten sentence; empty to delete the sentence."""


class RepairOutput(BaseModel):
    """Judge reply schema for repair: one rewritten sentence per item of the request."""

    sentences: list[RepairedSentence]
    """Rewritten sentences."""


JudgePayload = DecomposeInput | VerifyInput | HolisticDecomposeInput | DirectInput | RepairInput
"""Every structured input a request can carry."""
JudgeOutput = DecomposeOutput | VerifyOutput | HolisticDecomposeOutput | DirectOutput | RepairOutput
"""Every parsed reply a response can carry."""


OUTPUT_SCHEMAS: dict[Task, type[BaseModel]] = {
    "decompose": DecomposeOutput,
    "verify": VerifyOutput,
    "decompose_holistic": HolisticDecomposeOutput,
    "direct": DirectOutput,
    "repair": RepairOutput,
}


@cache
def _json_schema_text(schema: type[BaseModel]) -> str:
    return json.dumps(schema.model_json_schema())


def output_json_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of a reply model: generated once per model (pydantic takes milliseconds),
    handed out as a fresh copy so a caller that edits it cannot change the next request."""
    return dict(json.loads(_json_schema_text(schema)))


class JudgeRequest(BaseModel):
    """One call to a judge."""

    task: Task
    """Which step of the method is asking."""
    payload: JudgePayload
    """Structured inputs the messages were rendered from."""
    messages: list[Message]
    """Rendered prompt."""
    params: GenerationParams = Field(default_factory=GenerationParams)
    """Sampling parameters."""
    prompt_version: str
    """Content hash of the template(s) that rendered the messages."""

    @property
    def output_schema(self) -> type[BaseModel]:
        return OUTPUT_SCHEMAS[self.task]


class JudgeResponse(BaseModel):
    """What a backend returns for one request."""

    parsed: JudgeOutput | None = None
    """The schema-validated reply; ``None`` when the call failed."""
    raw: str = ""
    """The judge's raw text (for debugging; never a source of verdicts)."""
    usage: Usage = Field(default_factory=Usage)
    """Calls, tokens and cost of this request, retries included."""
    latency_s: float = 0.0
    """Wall time of the request."""
    cached: bool = False
    """True when the reply came from the disk cache."""
    judge: str = ""
    """Name of the judge that answered (a cascade stage names itself)."""
    usage_by_judge: dict[str, Usage] = Field(default_factory=dict)
    """``usage`` split by the judge that incurred it, when several answered (a cascade's stages);
    empty when all of it belongs to ``judge``."""
    claim_judges: list[str] | None = None
    """Judge that settled each judgement of ``parsed``, in its order, when several judges shared one
    reply (a cascade); ``None`` when ``judge`` answered for all of it."""
    error: str | None = None
    """Why there is no parsed reply."""


@runtime_checkable
class Backend(Protocol):
    """A judge. Implementations: scripted, embedded, litellm, cascade, and the cache wrapper."""

    @property
    def name(self) -> str:
        """Stable identifier of the judge, recorded in every output record and cache key."""
        ...

    @property
    def supports_decompose(self) -> bool:
        """Whether the judge can split answer sentences into claims."""
        ...

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        """Answer one request. Never raises for judge failures; sets ``error`` instead."""
        ...

    async def aclose(self) -> None:
        """Release connections, servers or models."""
        ...


@runtime_checkable
class CostEstimator(Protocol):
    """Optional backend capability: the worst-case cost of a request, before it is sent.

    The budget reserves this amount before each call (prompt tokens counted with the model's
    tokenizer plus ``params.max_tokens`` of output, at the judge's prices). A backend without it
    is treated as free.
    """

    def max_cost_usd(self, request: JudgeRequest) -> float:
        """Upper bound on what answering ``request`` can cost, in USD."""
        ...


@runtime_checkable
class TokenCounter(Protocol):
    """Optional backend capability: count a request's prompt tokens with the model's tokenizer."""

    def count_prompt_tokens(self, request: JudgeRequest) -> int:
        """Prompt tokens ``request`` would use."""
        ...


def approximate_tokens(text: str) -> int:
    """Token count for judges without a tokenizer: one token per four characters, rounded up."""
    return -(-len(text) // 4)


def prompt_tokens(backend: object, request: JudgeRequest) -> int:
    """Prompt tokens of ``request``: the backend's own count when it has one, else the approximation."""
    if isinstance(backend, TokenCounter):
        return backend.count_prompt_tokens(request)
    return approximate_tokens("".join(m.content for m in request.messages))


class BackendWrapper:
    """A backend in front of another: the same judge to the pipeline, with something added.

    It forwards the judge's identity, capabilities and closing; subclasses override ``complete``
    (the cache, the budget meter, recorders in tests and benchmarks).
    """

    def __init__(self, inner: Backend) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def supports_decompose(self) -> bool:
        return self.inner.supports_decompose

    def max_cost_usd(self, request: JudgeRequest) -> float:
        return self.inner.max_cost_usd(request) if isinstance(self.inner, CostEstimator) else 0.0

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        return await self.inner.complete(request)

    async def aclose(self) -> None:
        await self.inner.aclose()
