"""The transport policy: what every judge that sends requests over a network gets, whatever sends them.

A :class:`Sender` knows one thing: how to send one chat request to its model endpoint and read the
reply's text and token counts (litellm's ``acompletion``, a litellm ``Router`` over a fleet, a raw
HTTP POST). :class:`PolicyBackend` turns any sender into a :class:`~rt4chart.protocol.Backend`
with the reliability contract of ARCHITECTURE.md:

- retries with exponential backoff and jitter (tenacity) for 408/409/429 (Retry-After honoured),
  5xx, timeouts and dropped connections, and re-asks of replies that hold no schema-valid object
  (with the validation error, at most ``max_reasks`` times); every attempt that was sent is counted
  in the usage;
- failures that waiting will not cure (connection refused, a host name that does not resolve,
  401/403, 404) get at most one retry and feed the circuit breaker
  (:mod:`rt4chart.judges.circuit`): once it opens, ``complete`` raises
  :class:`~rt4chart.protocol.JudgeUnavailable`, the one exception that stops a run;
- at most ``concurrency`` attempts in flight, per event loop, fewer while the server's rate limit
  says so (:mod:`rt4chart.judges.pacing`);
- the verdict parsed from the reply text (:func:`rt4chart.judges.replies.parse_reply`);
- configured API keys and key-shaped tokens scrubbed from every string that leaves the backend
  (the parsed verdict, ``raw``, ``error``, the circuit's last error);
- the worst-case cost of a request for the budget, at the sender's prices.

A request that still fails returns a response with ``error``: a judge failure is data, never an
exception (apart from the open circuit).
"""

from __future__ import annotations

import asyncio
import socket
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from tenacity import AsyncRetrying, RetryCallState, wait_exponential_jitter

from rt4chart.judges.bounded_http import ReplyRefused
from rt4chart.judges.budget import queued_call
from rt4chart.judges.circuit import (
    NON_TRANSIENT_ATTEMPTS,
    NON_TRANSIENT_WAIT_S,
    TIMEOUT_ATTEMPTS,
    CircuitBreaker,
)
from rt4chart.judges.pacing import Pacer, RateSignal, rate_signal
from rt4chart.judges.replies import (
    REASK_TOKENS,
    REPLY_LIMIT,
    parse_first_token,
    parse_reply,
    prompt_token_bound,
    reads_logprobs,
    reask_messages,
)
from rt4chart.protocol import (
    BudgetExhausted,
    Capabilities,
    JudgeRequest,
    JudgeResponse,
    JudgeUnavailable,
    approximate_tokens,
)
from rt4chart.scrubbing import (
    might_hold_secret,
    redact_url,
    scrub,
    scrub_value,
    secrets_in_environment,
)
from rt4chart.types import Usage

_RETRYABLE_STATUS = frozenset({408, 409, 429})


class CallSettings(BaseModel):
    """How a judge model is called: prices, pacing, structured output and retries. Declared once:
    a judge profile (:class:`rt4chart.judges.registry.JudgeProfile`) and a sender's settings
    (:class:`rt4chart.judges.litellm.LiteLLMSettings`) both extend it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_usd_per_mtok: float | None = Field(default=None, ge=0.0)
    """Price per million prompt tokens; ``None`` means litellm's price list (or 0 if it has none)."""
    cached_input_usd_per_mtok: float | None = Field(default=None, ge=0.0)
    """Price per million prompt tokens read from the provider's prompt cache
    (``prompt_tokens_details.cached_tokens``, Anthropic's cache reads); ``None``: the prompt price
    (no discount), except for an ``anthropic/...`` judge (0.1x, Anthropic's rate)."""
    cache_write_usd_per_mtok: float | None = Field(default=None, ge=0.0)
    """Price per million prompt tokens written to the provider's prompt cache (Anthropic's
    ``cache_creation_input_tokens``); ``None``: the prompt price, except for an ``anthropic/...``
    judge (1.25x, Anthropic's rate)."""
    output_usd_per_mtok: float | None = Field(default=None, ge=0.0)
    """Price per million completion tokens; ``None`` as for input."""
    concurrency: int = Field(default=8, ge=1)
    """Most calls in flight at once (``--concurrency`` overrides it)."""
    adaptive_concurrency: bool = True
    """Ride the server's rate limit below ``concurrency``: start with a few calls in flight, add
    slots while calls are answered, halve them on a 429 or a timeout, and hold new calls for a
    ``Retry-After`` or an exhausted ``x-ratelimit-remaining-*`` (:mod:`rt4chart.judges.pacing`).
    ``false``: always ``concurrency`` calls in flight."""
    response_format: Literal["auto", "json_schema", "json_object", "none"] = "auto"
    """Structured-output mode; ``auto`` asks litellm's capability helpers."""
    timeout_s: float = Field(default=120.0, gt=0.0)
    """Seconds one HTTP attempt may take."""
    max_attempts: int = Field(default=5, ge=1)
    """Attempts per request, the first included (rate limits, 5xx, timeouts, invalid replies)."""
    max_reasks: int = Field(default=1, ge=0)
    """Re-asks after replies that hold no schema-valid object, within ``max_attempts``. Such a
    reply is rarely transient: a model that overran ``max_tokens`` or ignored the schema at
    temperature 0 mostly does it again, and each re-ask pays for a longer prompt."""
    backoff_s: float = Field(default=1.0, ge=0.0)
    """First retry delay; it doubles per attempt, plus up to as much random jitter."""
    backoff_max_s: float = Field(default=60.0, ge=0.0)
    """Longest retry delay, Retry-After included."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most completion tokens per call of this judge, below ``--max-tokens`` (``None``: no cap of its
    own). For a small local model that loops until the limit: on 2 CPU cores every token is time."""
    bounded_replies: bool = False
    """Send each request's bounded schema (:attr:`~rt4chart.protocol.JudgeRequest.build_bounded_schema`:
    one entry per claim, numbered in order, evidence chosen among the context sentences, short
    strings) instead of its plain one. For a server that compiles the schema into a decoding grammar
    (llama.cpp, vLLM): a small model then cannot loop until ``max_tokens`` cuts its JSON."""

    def per_token_prices(self) -> tuple[float, float] | None:
        """USD per prompt and per completion token, or ``None`` when neither price is set."""
        if self.input_usd_per_mtok is None and self.output_usd_per_mtok is None:
            return None
        return (self.input_usd_per_mtok or 0.0) / 1e6, (self.output_usd_per_mtok or 0.0) / 1e6


@dataclass(frozen=True)
class Reply:
    """What one attempt got back from the server."""

    text: str
    """The reply's content (never a model's separate reasoning)."""
    prompt_tokens: int = 0
    """Prompt tokens the server counted."""
    cached_prompt_tokens: int = 0
    """Of those, the tokens the server read from its prompt cache."""
    cache_write_prompt_tokens: int = 0
    """Of those, the tokens the server wrote to its prompt cache (Anthropic's cache creation)."""
    completion_tokens: int = 0
    """Completion tokens the server counted."""
    cost_usd: float | None = None
    """What the attempt cost, when the sender knows better than the judge's per-token prices."""
    deployment: str | None = None
    """Which deployment answered (a fleet's replica), for debugging; ``None`` for one endpoint."""
    rate: RateSignal = field(default_factory=RateSignal)
    """What the answer's headers said of the server's rate limit (for pacing)."""
    top_logprobs: list[dict[str, object]] | None = None
    """The first completion token's candidates (``token``, ``logprob``), when the request asked for them
    (:func:`~rt4chart.judges.replies.reads_logprobs`); ``None`` otherwise or when the server sent none."""
    shared: bool = False
    """The answer of a request another call also made and paid (one batch line two calls share):
    counted as a cache hit, at no cost, as an answer from the judge-call cache is."""


def attempt_max_cost_usd(prompt_tokens: int, max_tokens: int, prices: tuple[float, float]) -> float:
    """The most one attempt can cost: ``prompt_tokens`` and a reply of ``max_tokens`` at ``prices``
    (USD per prompt and per completion token)."""
    input_price, output_price = prices
    return prompt_tokens * input_price + max_tokens * output_price


def status_code(error: BaseException) -> int | None:
    """The HTTP status of a failed attempt (litellm's and OpenAI's errors carry it, httpx's on the response)."""
    for holder in (error, getattr(error, "response", None)):
        status = getattr(holder, "status_code", None)
        if isinstance(status, int):
            return status
    return None


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and what it was raised from or during, innermost last."""
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and all(cause is not seen for seen in chain):
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def refused_reply(error: BaseException) -> ReplyRefused | None:
    """The :class:`~rt4chart.judges.bounded_http.ReplyRefused` behind ``error`` (a client library
    wraps it in its own connection error), or ``None``."""
    return next((cause for cause in _causes(error) if isinstance(cause, ReplyRefused)), None)


def non_transient_reason(error: BaseException) -> str | None:
    """Why ``error`` will not go away by waiting, or ``None`` for a failure worth backing off on.

    Client libraries report a refused connection or an unresolvable host in their own exception
    types (litellm as a 500 "Connection error"), so the cause is read from the exception chain
    (aiohttp or httpx underneath, then the OS error).
    """
    status = status_code(error)
    if status in (401, 403):
        return f"the server refused the credentials (HTTP {status})"
    if status == 404:
        return "the server knows no such model or endpoint (HTTP 404)"
    for cause in _causes(error):
        if isinstance(cause, socket.gaierror):
            return f"the host name does not resolve ({cause})"
        if isinstance(cause, ConnectionRefusedError):
            return f"connection refused ({cause})"
    return None


def is_transient(error: BaseException) -> bool:
    """Whether waiting may cure ``error``: 408/409/429, 5xx, or a timeout or dropped connection
    anywhere in its chain (the OS's errors, or httpx's, which most Python HTTP clients use)."""
    status = status_code(error)
    if status is not None:
        return status in _RETRYABLE_STATUS or status >= 500
    # Imported here: only a failed attempt needs it, and httpx is litellm's own dependency.
    from httpx import TransportError

    return any(isinstance(cause, TimeoutError | ConnectionError | TransportError) for cause in _causes(error))


MIN_REPLY_CAP_CHARS = 65_536
"""The reply size cap never goes below this many characters, whatever ``max_tokens``."""

CHARS_PER_TOKEN_CAP = 32
"""Characters one completion token may stand for in a reply (far above any tokenizer's average)."""


def reply_cap_chars(max_tokens: int) -> int:
    """The longest reply kept: ``max_tokens`` can produce no more text than this, so a longer body
    (a server sending 20 MB) is not the model's answer and is neither parsed, stored nor cached."""
    return max(MIN_REPLY_CAP_CHARS, CHARS_PER_TOKEN_CAP * max_tokens)


REPLY_BODY_SLACK_BYTES = 65_536
"""Bytes a reply body may hold beyond its content: the JSON around it, escapes, usage."""


def reply_body_cap_bytes(max_tokens: int) -> int:
    """The most bytes of decoded HTTP body read for a reply of at most ``max_tokens`` tokens: the
    content cap at up to four bytes a character (UTF-8), plus :data:`REPLY_BODY_SLACK_BYTES`. Every
    transport stops reading there (:mod:`rt4chart.judges.bounded_http`)."""
    return 4 * reply_cap_chars(max_tokens) + REPLY_BODY_SLACK_BYTES


def timed_out(error: BaseException) -> bool:
    """Whether an attempt failed because the server sent no answer in time (a timeout anywhere in
    its chain: the OS's, asyncio's, or httpx's)."""
    from httpx import TimeoutException

    return any(isinstance(cause, TimeoutError | TimeoutException) for cause in _causes(error))


def error_headers(error: BaseException | None) -> Mapping[str, str] | None:
    """The response headers a failed attempt carries (litellm's, OpenAI's and httpx's errors, the
    OpenAI-compatible sender's)."""
    headers = getattr(getattr(error, "response", None), "headers", None)
    return headers if isinstance(headers, Mapping) else None


def retry_after_s(error: BaseException | None) -> float | None:
    """Seconds the server asked the client to wait (``retry-after-ms``, else Retry-After as seconds
    or an HTTP date)."""
    return rate_signal(error_headers(error)).retry_after_s


class InvalidReply(Exception):
    """A reply arrived but holds no schema-valid object (re-asked unless ``final``)."""

    def __init__(self, reason: str, raw: str, *, final: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw
        self.final = final


class Sender:
    """Sends one chat request to a judge's model endpoint. Subclasses implement :attr:`name` and
    :meth:`send`; the rest has defaults that suit one OpenAI-compatible endpoint.

    ``send`` raises for any failure (the policy classifies it with :meth:`refusal` and
    :meth:`is_transient`); it never retries, waits or parses.
    """

    routes_around_failures: ClassVar[bool] = False
    budgeted_by_round: ClassVar[bool] = False
    """True for a sender whose attempts go out in rounds the budget admits whole (a Batch API's,
    :class:`rt4chart.judges.budget.BudgetedByRound`): the sender reserves each round, not the meter each call."""
    """True for a sender that routes each attempt to one of several endpoints and cools a failing
    one down itself (a fleet): a Retry-After is then not waited out, the next attempt goes elsewhere."""

    @property
    def name(self) -> str:
        """The judge's identity in records and cache keys."""
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        """Where the judge is called, for :class:`JudgeUnavailable` (never a key)."""
        return self.name

    @property
    def secrets(self) -> frozenset[str]:
        """Keys this sender sends: scrubbed from everything the backend returns."""
        return frozenset()

    @property
    def can_write_text(self) -> bool:
        """A language model can write text, so it can split sentences into claims."""
        return True

    def circuit(self) -> CircuitBreaker:
        """The breaker of this judge (a fleet's tracks each deployment); called once."""
        return CircuitBreaker(self.endpoint)

    def refusal(self, error: BaseException) -> str | None:
        """Why ``error`` will not go away by waiting (see :func:`non_transient_reason`), or ``None``."""
        return non_transient_reason(error)

    def is_transient(self, error: BaseException) -> bool:
        """Whether a failed attempt is worth another after a backoff (see :func:`is_transient`)."""
        return is_transient(error)

    def timed_out(self, error: BaseException) -> bool:
        """Whether a failed attempt got no answer in time (see :func:`timed_out`)."""
        return timed_out(error)

    def sent(self, error: BaseException) -> bool:
        """Whether the failed attempt reached a server; ``False`` when the client refused it before
        sending (a router with no deployment to offer): such an attempt is no call."""
        return True

    def per_token_prices(self) -> tuple[float, float] | None:
        """USD per prompt and completion token when the sender knows them (a price table), else ``None``."""
        return None

    def count_prompt_tokens(self, request: JudgeRequest) -> int:
        """Prompt tokens of ``request`` (default: the four-characters-per-token approximation)."""
        return approximate_tokens("".join(m.content for m in request.messages))

    async def send(self, messages: list[dict[str, str]], request: JudgeRequest) -> Reply:
        """One attempt: ``messages`` (the request's, or a re-ask's) with ``request``'s parameters."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release connections."""
        return None


class EndpointSettings(CallSettings):
    """How one model at one endpoint is called: the settings of the litellm and OpenAI-compatible senders."""

    name: str
    """The judge's name, recorded in outputs and cache keys (the server is appended to it)."""
    model: str
    """The model string the sender resolves."""


class EndpointSender(Sender):
    """A sender to one model at one endpoint with at most one key. Its identity is the judge's name at the
    server, whatever the transport, so records and cache keys do not depend on it; credentials in the URL
    (``user:password@``, ``?api_key=``) stay out of it: records, reports, errors."""

    settings: EndpointSettings
    model: str
    api_base: str | None
    _api_key: str | None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, api_base={self.api_base!r})"

    @property
    def name(self) -> str:
        # The server is part of the judge's identity (and so of every cache key): two servers
        # answering to one model name are two judges.
        return f"{self.settings.name}@{redact_url(self.api_base)}" if self.api_base else self.settings.name

    @property
    def secrets(self) -> frozenset[str]:
        return frozenset({self._api_key} if self._api_key else ())


class PolicyBackend:
    """A :class:`Sender` under the transport policy; see the module docstring."""

    def __init__(self, sender: Sender, settings: CallSettings) -> None:
        self.sender = sender
        self.settings = settings
        self.concurrency = settings.concurrency
        # One pacer per event loop: its waiters are futures of the loop they wait in, and a backend
        # may serve several ``asyncio.run`` calls (one per CLI command or evaluation).
        self._pacers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Pacer] = weakref.WeakKeyDictionary()
        self._backoff = wait_exponential_jitter(
            multiplier=settings.backoff_s, max=settings.backoff_max_s, jitter=settings.backoff_s
        )
        self._retrying = AsyncRetrying(stop=self._stop, wait=self._wait, reraise=True)
        """The retry policy as tenacity strategies, consulted after a failed attempt (:meth:`_retry_delay`)."""
        self._secrets = frozenset(secrets_in_environment() | set(sender.secrets))
        self.circuit = sender.circuit()
        """Opens after consecutive non-transient failures; then every call raises."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sender!r})"

    @property
    def name(self) -> str:
        return self.sender.name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(can_write_text=self.sender.can_write_text)

    def _prices(self) -> tuple[float, float]:
        return self.settings.per_token_prices() or self.sender.per_token_prices() or (0.0, 0.0)

    def count_prompt_tokens(self, request: JudgeRequest) -> int:
        return self.sender.count_prompt_tokens(request)

    @property
    def budgeted_by_round(self) -> bool:
        """Whether the budget admits this judge's calls by round (its sender's)."""
        return self.sender.budgeted_by_round

    def max_cost_usd(self, request: JudgeRequest) -> float:
        """The most ``request`` can cost, at the judge's prices, whatever tokenizer the server uses.

        Each attempt that gets a reply is billed: the first, and up to ``max_reasks`` re-asks that
        resend the prompt with the bad reply (at most ``max_tokens``) and the reason appended. A
        prompt is bounded by :func:`~rt4chart.judges.replies.prompt_token_bound`, not by a count
        with a tokenizer that may not be the server's.
        """
        prices = self._prices()
        if not any(prices):
            return 0.0
        request = self._capped(request)
        prompt = max(self.count_prompt_tokens(request), prompt_token_bound(request.messages))
        output = request.params.max_tokens
        reask = attempt_max_cost_usd(prompt + output + REASK_TOKENS, output, prices)
        return attempt_max_cost_usd(prompt, output, prices) + self.settings.max_reasks * reask

    def call_cost_usd(self, request: JudgeRequest, completion_tokens: int) -> float:
        """One call at the judge's prices: the prompt as counted (what ``rt4 estimate`` prints) and a
        reply of ``completion_tokens`` (at most ``max_tokens``), no re-ask."""
        input_price, output_price = self._prices()
        request = self._capped(request)
        output = min(completion_tokens, request.params.max_tokens)
        return self.count_prompt_tokens(request) * input_price + output * output_price

    def _another_endpoint_left(self) -> bool:
        return self.circuit.another_endpoint_left

    def _retryable(self, error: BaseException) -> bool:
        if isinstance(error, InvalidReply):
            return not error.final
        if refused_reply(error) is not None:
            return False
        if self.sender.refusal(error) is not None:
            # A refusing deployment is retried elsewhere while some deployment may still answer;
            # a lone endpoint that refuses gets its one retry only when the failure also looks transient.
            return self._another_endpoint_left() or self.sender.is_transient(error)
        return self.sender.is_transient(error)

    def _retry_delay(self, failure: BaseException, attempts: int) -> float | None:
        """Seconds to wait before the next attempt after ``failure`` ended attempt number ``attempts``,
        or ``None`` when no attempt follows: :meth:`_retryable`, then tenacity's stop and wait
        strategies, asked only after a failure. (Its ``AsyncRetrying`` loop runs on every call,
        successful or not: measured over 842 RAGTruth QA requests to an instant server, 0.80 ms of
        client CPU a call with it and 0.47 ms without, more than the HTTP exchange itself.)"""
        if not self._retryable(failure):
            # Asked before tenacity's state is built: a final failure (a re-ask's last invalid reply,
            # a refusal) costs no retry state.
            return None
        state = RetryCallState(self._retrying, fn=None, args=(), kwargs={})
        state.attempt_number = attempts
        state.set_exception((type(failure), failure, failure.__traceback__))
        if self._retrying.stop(state):
            return None
        return float(self._retrying.wait(state))

    def _stop(self, state: RetryCallState) -> bool:
        error = state.outcome.exception() if state.outcome else None
        if error is not None and self.sender.refusal(error) is not None and not self._another_endpoint_left():
            return state.attempt_number >= min(NON_TRANSIENT_ATTEMPTS, self.settings.max_attempts)
        if error is not None and self.sender.timed_out(error) and not self._another_endpoint_left():
            # A server that accepts and never answers costs a full timeout per attempt: two, not
            # max_attempts, and the request counts toward the circuit (complete).
            return state.attempt_number >= min(TIMEOUT_ATTEMPTS, self.settings.max_attempts)
        return state.attempt_number >= self.settings.max_attempts

    def _wait(self, state: RetryCallState) -> float:
        backoff = float(self._backoff(state))
        error = state.outcome.exception() if state.outcome else None
        if error is not None and self.sender.refusal(error) is not None and not self._another_endpoint_left():
            return min(backoff, NON_TRANSIENT_WAIT_S)
        if self.sender.routes_around_failures:
            # The sender has cooled the endpoint that asked for a pause; the next attempt goes elsewhere.
            return backoff
        asked = retry_after_s(error)
        return min(max(backoff, asked or 0.0), self.settings.backoff_max_s)

    def pacer(self) -> Pacer:
        """The calls in flight of this backend in the running event loop."""
        loop = asyncio.get_running_loop()
        pacer = self._pacers.get(loop)
        if pacer is None:
            pacer = self._pacers[loop] = Pacer(self.concurrency, adaptive=self.settings.adaptive_concurrency)
        return pacer

    async def _attempt(self, messages: list[dict[str, str]], request: JudgeRequest, usage: list[Usage]) -> Reply:
        pacer = self.pacer()
        # A fleet's router cools the deployment that refused or ran out and sends elsewhere: the
        # logical judge's pace is not that deployment's, so only its answers count, not their limits.
        paced = not self.sender.routes_around_failures
        slot = await pacer.acquire()
        try:
            # Another request may have opened the circuit while this one waited for a slot.
            self.circuit.check()
            usage.append(Usage(calls=1))
            try:
                with queued_call(waiting=False):  # holding a slot: in flight
                    reply = await self.sender.send(messages, request)
            except Exception as error:
                if not self.sender.sent(error):
                    usage.pop()
                if paced and (status_code(error) == 429 or self.sender.timed_out(error)):
                    pacer.refused(slot, rate_signal(error_headers(error)))
                raise
            # A server counts a call's tokens at admission with its max_tokens, not the reply's length.
            pacer.answered(slot, reply.rate if paced else RateSignal(), reply.prompt_tokens + request.params.max_tokens)
        finally:
            pacer.release()
        if reply.shared:
            usage[-1] = Usage(cache_hits=1)
            return reply
        input_price, output_price = self._prices()
        cost = reply.cost_usd
        cached = min(reply.cached_prompt_tokens, reply.prompt_tokens)
        written = min(reply.cache_write_prompt_tokens, reply.prompt_tokens - cached)
        if cost is None:
            cached_price, written_price = (
                input_price if price is None else price / 1e6
                for price in (self.settings.cached_input_usd_per_mtok, self.settings.cache_write_usd_per_mtok)
            )
            uncached = reply.prompt_tokens - cached - written
            cost = (uncached * input_price + cached * cached_price + written * written_price
                    + reply.completion_tokens * output_price)
        usage[-1] = Usage(
            calls=1, prompt_tokens=reply.prompt_tokens, cached_prompt_tokens=cached, cache_write_prompt_tokens=written,
            completion_tokens=reply.completion_tokens, cost_usd=cost,
        )
        cap = reply_cap_chars(request.params.max_tokens)
        if len(reply.text) > cap:
            raise InvalidReply(f"a reply of {len(reply.text):,} characters, over the cap of {cap:,}", "", final=True)
        return reply

    def _capped(self, request: JudgeRequest) -> JudgeRequest:
        """``request`` with at most the judge's own ``max_tokens`` (what is sent and what a budget reserves)."""
        cap = self.settings.max_tokens
        if cap is None or request.params.max_tokens <= cap:
            return request
        return request.model_copy(update={"params": request.params.model_copy(update={"max_tokens": cap})})

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        # Queued except while an attempt holds a slot: waiting for one, or for the next attempt.
        with queued_call():
            return await self._complete(request)

    async def _complete(self, request: JudgeRequest) -> JudgeResponse:
        self.circuit.check()
        request = self._capped(request)
        plain_schema = request.output_schema
        if self.settings.bounded_replies and request.build_bounded_schema is not None:
            # The sender puts the schema into the request and the reply is checked against it.
            request = request.model_copy(update={"output_schema": request.build_bounded_schema()})
        started = time.perf_counter()
        messages = [m.model_dump() for m in request.messages]
        schema = request.output_schema
        # The texts a verdict must not be copied from: not the model's own earlier replies, which a
        # re-ask (verification's, for ungrounded evidence) shows it; a model repeating its earlier
        # verdict has answered (a failed answer, if the evidence is still not in the context).
        prompt = [m.content for m in request.messages if m.role != "assistant"]
        usage: list[Usage] = []
        raw = ""
        parsed: BaseModel | None = None
        error: str | None = None
        invalid_replies = 0
        unreachable: str | None = None
        deployment: str | None = None
        attempts = 0
        try:
            while True:
                attempts += 1
                try:
                    reply = await self._attempt(messages, request, usage)
                    deployment, raw = reply.deployment, reply.text
                    if reads_logprobs(schema):
                        parsed, reason = parse_first_token(raw, reply.top_logprobs, schema)
                    else:
                        parsed, reason = parse_reply(raw, schema, prompt)
                    if parsed is None:
                        invalid_replies += 1
                        messages = reask_messages(request.messages, raw, reason or "invalid reply")
                        # A server that sent no log probabilities sends none when asked again.
                        final = invalid_replies > self.settings.max_reasks or reads_logprobs(schema)
                        raise InvalidReply(reason or "invalid reply", raw, final=final)
                    break
                except Exception as failure:
                    delay = self._retry_delay(failure, attempts)
                    if delay is None:
                        raise
                await asyncio.sleep(delay)
        except (JudgeUnavailable, BudgetExhausted):
            raise
        except InvalidReply as invalid:
            error = f"no valid reply after {len(usage)} attempts: {invalid.reason}"
        except Exception as failure:  # any provider, network or client failure becomes data
            # A reply the HTTP contract refused is named for itself, not for the client's wrapper of it.
            error = f"{type(failure).__name__} after {len(usage)} attempts: {refused_reply(failure) or failure}"
            unreachable = self.sender.refusal(failure)
            if unreachable is None and self.sender.timed_out(failure):
                unreachable = f"no answer within the timeout on {len(usage)} attempts"
        if unreachable is None:
            self.circuit.record_success()
        else:
            # Raises once this failure opens the circuit.
            self.circuit.record_failure(scrub(f"{unreachable}; {error}"[:REPLY_LIMIT], self._secrets))
        if parsed is not None and schema is not plain_schema:
            # Callers (the cache, the method) read the step's own reply model, not its bounded form.
            parsed = plain_schema.model_validate(parsed.model_dump())
        return self._response(parsed, raw, error, usage, started, deployment)

    def _response(
        self,
        parsed: BaseModel | None,
        raw: str,
        error: str | None,
        usage: list[Usage],
        started: float,
        deployment: str | None,
    ) -> JudgeResponse:
        secrets = self._secrets
        # A key can come back inside the verdict itself (a server or model echoing it into a
        # rationale or a quote): every string that leaves the backend is scrubbed. The reply and
        # the verdict's JSON are searched once together first; most hold nothing to remove.
        verdict = parsed.model_dump_json() if parsed is not None else ""
        if might_hold_secret(f"{raw}\n{verdict}\n{error or ''}", secrets):
            raw, error = scrub(raw, secrets), scrub(error, secrets) if error else None
            if parsed is not None:
                fields = parsed.model_dump(mode="json")
                scrubbed = scrub_value(fields, secrets)
                if scrubbed != fields:
                    parsed = type(parsed).model_validate(scrubbed)
        return JudgeResponse(
            parsed=parsed,
            raw=raw,
            usage=sum(usage, Usage()),
            latency_s=time.perf_counter() - started,
            judge=self.name,
            deployment=deployment,
            error=error,
        )

    async def aclose(self) -> None:
        await self.sender.aclose()

