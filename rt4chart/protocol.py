"""The backend contract: the one cut between the method and any judge model.

A backend answers one :class:`JudgeRequest` with one :class:`JudgeResponse`. The request carries
both the rendered chat messages (what a language model reads) and the structured payload they were
rendered from (what a non-LLM judge such as the scripted or embedded one reads). A backend never
raises for a judge failure: the response carries ``error`` and no ``parsed`` object, so a bad reply
becomes data on one claim instead of crashing a batch.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny

from rt4chart.languages import language_name
from rt4chart.types import Usage


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "context"]
    """Who speaks; ``context`` is a retrieved document's turn, for a verifier whose chat template reads
    one (Granite Guardian 3.0-3.2's groundedness check)."""
    content: str
    """What is said."""


DEFAULT_MAX_TOKENS = 1024
"""Completion tokens a judge call may use unless told otherwise (room for a batch of judgements)."""


class GenerationParams(BaseModel):
    """Sampling parameters; every field is part of the cache key."""

    model_config = ConfigDict(frozen=True)

    temperature: float = 0.0
    """Sampling temperature; 0 for reproducible verdicts."""
    seed: int | None = 42
    """Sampling seed, for providers that honour one (the paper's 42)."""
    max_tokens: int = DEFAULT_MAX_TOKENS
    """Upper bound on completion tokens (also the worst case a budget reserves)."""


@cache
def _json_schema_text(schema: type[BaseModel]) -> str:
    return json.dumps(schema.model_json_schema())


def output_json_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of a reply model: generated once per model (pydantic takes milliseconds),
    handed out as a fresh copy so a caller that edits it cannot change the next request."""
    return dict(json.loads(_json_schema_text(schema)))


class JudgeRequest(BaseModel):
    """One call to a judge. Which steps exist, and how their payloads and prompts look, is the
    task registry's business (:mod:`rt4chart.method.tasks`); the transport knows none of them."""

    task: str
    """Which step of the method is asking (part of the cache key)."""
    payload: SerializeAsAny[BaseModel]
    """Structured inputs the messages were rendered from (what non-LLM judges read)."""
    output_schema: type[BaseModel] = Field(exclude=True)
    """The pydantic model a reply must validate against."""
    build_bounded_schema: Callable[[], type[BaseModel]] | None = Field(default=None, exclude=True)
    """Builds a stricter form of ``output_schema`` fixed by this request's payload (exactly one
    entry per claim or sentence, numbered in order, evidence chosen among the context sentences in
    view, short strings), or ``None``. A judge whose server turns the schema into a decoding grammar
    (``CallSettings.bounded_replies``) sends that one instead, so that a small model cannot loop
    until ``max_tokens`` cuts its JSON; its replies are read back as ``output_schema``. Built only
    when asked: a model per request costs milliseconds that other judges need not pay."""
    messages: list[Message]
    """Rendered prompt."""
    params: GenerationParams = Field(default_factory=GenerationParams)
    """Sampling parameters."""
    prompt_version: str
    """Content hash of the template and the rendering code that produced the messages."""
    template_kwargs: dict[str, Any] | None = None
    """Arguments for the model's own chat template, which the server applies (vLLM's
    ``chat_template_kwargs``: Granite Guardian's ``guardian_config``); ``None`` for every request that
    brings its prompt whole. Part of the cache key only when set."""


class JudgeResponse(BaseModel):
    """What a backend returns for one request."""

    parsed: SerializeAsAny[BaseModel] | None = None
    """The reply, validated against the request's ``output_schema``; ``None`` when the call failed."""
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
    deployment: str | None = None
    """Which deployment of a judge fleet answered the last attempt (its model and base URL), for
    debugging; never part of the judge's identity. ``None`` for a judge with one endpoint."""
    usage_by_judge: dict[str, Usage] = Field(default_factory=dict)
    """``usage`` split by the judge that incurred it, when several answered (a cascade's stages);
    empty when all of it belongs to ``judge``."""
    claim_judges: list[str] | None = None
    """Judge that settled each judgement of ``parsed``, in its order, when several judges shared one
    reply (a cascade); ``None`` when ``judge`` answered for all of it."""
    error: str | None = None
    """Why there is no parsed reply."""


# The two exceptions that cross the contract: a backend never raises for a judge failure, but a
# judge stack stops a run when its endpoint is gone (the circuit) or a call would cross the budget.


class JudgeUnavailable(Exception):
    """The judge's endpoint failed non-transiently on several requests in a row; the run stops.

    The message names the judge and its endpoint (base URL or provider, never a key) and the last
    error.
    """

    def __init__(self, endpoint: str, failures: int, last_error: str) -> None:
        super().__init__(
            f"judge unreachable or refusing: {endpoint}: {failures} requests in a row failed "
            f"non-transiently; last error: {last_error}"
        )
        self.endpoint = endpoint
        self.failures = failures
        self.last_error = last_error


class BudgetExhausted(Exception):
    """A call was refused because its worst-case cost would cross the budget."""



class Capabilities(BaseModel):
    """What a judge can do: declared by each backend, forwarded unchanged by every wrapper (a cache,
    the budget meter) and combined by judges made of judges, so the method and the run layer ask a
    judge's :attr:`Backend.capabilities` instead of looking through its wrappers."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    can_write_text: bool = True
    """Whether the judge writes text (splits answer sentences into claims, rewrites a sentence); the
    embedded verifier only scores claims, so it does not."""
    languages: frozenset[str] | None = None
    """The languages the judge reads (ISO 639-1 codes); ``None``: whatever its model reads (a
    language model's prompt names the answer's language). The embedded verifier reads English only."""
    claim_threshold: float | None = None
    """A calibrated profile's threshold: the unsupported score at or above which a claim's final
    verdict is not entailed (``None``: the judge's own operating point)."""
    answers_offline: bool = False
    """Whether the judge answers deterministically, in process and for free, reading no prompt
    (the embedded verifier): ``rt4 estimate`` asks it, so its plan is the run's own calls."""
    reads_answer: bool = False
    """Whether the judge reads the answer itself and each claim's span in it (a token classifier such as
    LettuceDetect); only then do its verify requests carry them (``VerifyInput.answer``)."""

    def language_refusal(self, language: str, judge: str) -> str | None:
        """Why ``judge`` must not judge an answer in ``language``; ``None`` when it may."""
        if self.languages is None or language in self.languages:
            return None
        return (
            f"judge {judge!r} serves {', '.join(sorted(self.languages))} only, and this answer is "
            f"{language_name(language)} ({language}): its verdicts would look confident and mean little. "
            f"Audit it with {TEXT_JUDGES}; or give --language en to audit it as English anyway"
        )

    @classmethod
    def of_judges(cls, judges: Iterable[Backend]) -> Capabilities:
        """What a judge made of ``judges`` can do (a cascade's stages, a vote's members): each of them
        decides some verdicts, so it reads only the languages all of them read and answers offline only
        when all of them do; it writes text when any of them does (that one writes it), and its requests
        carry the answer when any of them reads it (the others ignore it)."""
        declared = [judge.capabilities for judge in judges]
        languages = [c.languages for c in declared if c.languages is not None]
        return cls(
            can_write_text=any(c.can_write_text for c in declared),
            languages=frozenset.intersection(*languages) if languages else None,
            answers_offline=all(c.answers_offline for c in declared),
            reads_answer=any(c.reads_answer for c in declared),
        )


TEXT_JUDGES = (
    "a model that writes text: a profile such as gpt-4o-mini, a litellm string (openai/NAME --api-base URL "
    "for a server of your own, e.g. rt4 serve), or scripted:RULES.json"
)
"""Which judges can serve the steps a scoring judge (the embedded verifier) cannot, in the words of errors."""


@runtime_checkable
class Backend(Protocol):
    """A judge. Implementations: scripted, embedded, the transport policy's (litellm, the
    OpenAI-compatible client, fleets), cascade and vote, and wrappers (cache, budget meter)."""

    @property
    def name(self) -> str:
        """Stable identifier of the judge, recorded in every output record and cache key."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        """What the judge can do (:class:`Capabilities`)."""
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
class ReplyCostEstimator(Protocol):
    """Optional backend capability: what one call costs at a given reply size (``rt4 estimate``'s
    expected cost; :meth:`CostEstimator.max_cost_usd` is the bound a budget reserves)."""

    def call_cost_usd(self, request: JudgeRequest, completion_tokens: int) -> float:
        """What answering ``request`` costs, in USD, with a reply of ``completion_tokens`` tokens
        that needs no re-ask."""
        ...


def reply_cost_usd(backend: object, request: JudgeRequest, completion_tokens: int) -> float:
    """:meth:`ReplyCostEstimator.call_cost_usd` of ``backend``; for a judge that can only bound
    its cost, that bound (never less than a call can cost); 0 for one that states no cost."""
    if isinstance(backend, ReplyCostEstimator):
        return backend.call_cost_usd(request, completion_tokens)
    if isinstance(backend, CostEstimator):
        return backend.max_cost_usd(request)
    return 0.0


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


def cut_call_usage(backend: object, request: JudgeRequest) -> Usage:
    """What a call cut before its reply (a latency budget's deadline, a shutdown) costs: its prompt was
    sent and is paid, no completion is counted. Booked, never $0; for a judge that can only bound its
    cost, that bound (see :func:`reply_cost_usd`)."""
    return Usage(calls=1, prompt_tokens=prompt_tokens(backend, request), cost_usd=reply_cost_usd(backend, request, 0))


_loading: list[str] = []
_loading_lock = threading.Lock()


@contextmanager
def loading(what: str) -> Iterator[None]:
    """Mark ``what`` (a model, a tokenizer) as loading while the block runs: a backend that loads
    one on its first request says so here, and the progress line shows it (:func:`loading_now`)
    instead of a run that seems to stand still."""
    with _loading_lock:
        _loading.append(what)
    try:
        yield
    finally:
        with _loading_lock:
            _loading.remove(what)


def loading_now() -> str | None:
    """What some backend of this process is loading now, ``None`` when nothing is."""
    with _loading_lock:
        return _loading[0] if _loading else None


_provider_waits: list[Callable[[], str]] = []


@contextmanager
def waiting_on_provider(describe: Callable[[], str]) -> Iterator[None]:
    """Mark a wait on the provider (a submitted batch) while the block runs: the progress line shows
    ``describe()``, called each time the line is written, so it can say for how long."""
    with _loading_lock:
        _provider_waits.append(describe)
    try:
        yield
    finally:
        with _loading_lock:
            _provider_waits.remove(describe)


def provider_wait_now() -> str | None:
    """What this process waits on at the provider now (the oldest wait), ``None`` when nothing."""
    with _loading_lock:
        describe = _provider_waits[0] if _provider_waits else None
    return describe() if describe is not None else None


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
    def capabilities(self) -> Capabilities:
        return self.inner.capabilities

    def max_cost_usd(self, request: JudgeRequest) -> float:
        return self.inner.max_cost_usd(request) if isinstance(self.inner, CostEstimator) else 0.0

    def call_cost_usd(self, request: JudgeRequest, completion_tokens: int) -> float:
        return reply_cost_usd(self.inner, request, completion_tokens)

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        return await self.inner.complete(request)

    async def aclose(self) -> None:
        await self.inner.aclose()
