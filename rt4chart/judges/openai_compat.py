"""A judge on any server that speaks OpenAI's chat-completions protocol (vLLM, llama.cpp, TGI,
SGLang, OpenAI itself, most gateways), sent with aiohttp and nothing heavier.

A thin sender (:class:`OpenAICompatSender`): one POST of ``/chat/completions``, the reply's text
and token counts. The transport policy (:mod:`rt4chart.judges.policy`) does the rest, as for the
litellm sender: retries and backoff (Retry-After honoured), the circuit breaker, concurrency,
reply parsing and re-asks, key scrubbing, the reply size cap. The reply is read under the HTTP
reply contract (:mod:`rt4chart.judges.bounded_http`), applied here by hand: aiohttp neither
inflates bodies nor follows redirects itself. It never imports litellm (seconds of
start-up, milliseconds of CPU per call): prices are the profile's, prompt tokens the policy's
tokenizer-free bound. The client is aiohttp, not httpx: on the same calls httpx spends about seven
times aiohttp's CPU per request (its pool, anyio and h11 layers; evals/bench/RESULTS.md), which
alone would be over the millisecond a call may cost.

Structured output: a JSON schema (``response_format: json_schema``) unless the profile says
otherwise. A server that refuses it with HTTP 400 is asked again at once with JSON mode, then with
no ``response_format``; the first that it accepts is remembered for that endpoint and model, so the
400 is met once per process. A 400 that every form meets is the request's own fault and is raised.
"""

from __future__ import annotations

import asyncio
import functools
import json
import weakref
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pydantic_core
from pydantic import BaseModel

from rt4chart.judges.bounded_http import ACCEPTED_ENCODINGS, DecodedBody, redirect_target
from rt4chart.judges.pacing import RateSignal, rate_signal
from rt4chart.judges.policy import EndpointSender, EndpointSettings, PolicyBackend, Reply, reply_body_cap_bytes
from rt4chart.judges.replies import FirstTokenChoices, first_token_candidates, reads_logprobs
from rt4chart.protocol import JudgeRequest, output_json_schema

OPENAI_BASE_URL = "https://api.openai.com/v1"
"""Where a profile with ``api = "openai-compatible"`` and no base URL is served."""

PROVIDER_PREFIXES = ("openai/", "hosted_vllm/")
"""Model-string prefixes (litellm's provider names) that are not part of the name the server knows."""

STRUCTURED_OUTPUT_FALLBACKS = ("json_schema", "json_object", "none")
"""Structured-output modes from the strictest down, tried in this order after a 400."""

_ACCEPTED_MODE: dict[tuple[str, str], str] = {}
"""The structured-output mode an endpoint and model accepted after refusing a stricter one."""

_ERROR_MESSAGE_CHARS = 500
"""How much of a server's error message an exception quotes (scrubbed by the policy)."""

MAX_REDIRECTS = 5
"""Same-origin redirects (307/308) followed for one attempt; another origin's are refused."""


@functools.cache
def _response_format_member(schema: type[BaseModel], mode: str) -> bytes:
    """``,"response_format":{...}`` of a body in ``mode`` (empty for ``none``), encoded once per reply
    model: the JSON schema is most of a body's fixed part, and encoding it on every call cost more
    CPU than the rest of the body."""
    if mode == "json_schema":
        form: dict[str, Any] = {"type": "json_schema",
                                "json_schema": {"name": schema.__name__, "schema": output_json_schema(schema)}}
    elif mode == "json_object":
        form = {"type": "json_object"}
    else:
        return b""
    return b',"response_format":' + pydantic_core.to_json(form)


def served_model(model: str) -> str:
    """The model name the server knows: ``model`` without a provider prefix (``openai/``, ``hosted_vllm/``)."""
    for prefix in PROVIDER_PREFIXES:
        if model.startswith(prefix):
            return model.removeprefix(prefix)
    return model


def completion_reply(
    answer: dict[str, Any],
    message: dict[str, Any],
    rate: RateSignal,
    top_logprobs: list[dict[str, object]] | None = None,
) -> Reply:
    """What the policy reads of a chat completion ``answer`` (its first choice's ``message``): the
    content and the token counts, cached prompt tokens apart (online, and a batch's output line), and
    the first token's candidates when the request asked for them."""
    counts = answer.get("usage") or {}
    details = counts.get("prompt_tokens_details")
    return Reply(
        # The content only: a reasoning model's separate reasoning is never read as the verdict.
        text=str(message.get("content") or ""),
        prompt_tokens=int(counts.get("prompt_tokens") or 0),
        completion_tokens=int(counts.get("completion_tokens") or 0),
        cached_prompt_tokens=int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
        rate=rate,
        top_logprobs=top_logprobs,
    )


class OpenAICompatSettings(EndpointSettings):
    """How one model is called on an OpenAI-compatible server. The judge registry
    (:mod:`rt4chart.judges.registry`) builds these from a profile; this backend knows no profile."""

    model: str
    """Model string (``openai/<name>``, ``hosted_vllm/<name>`` or the bare name the server knows)."""


@dataclass(frozen=True)
class ErrorResponse:
    """What the policy reads of a failed answer (:func:`~rt4chart.judges.policy.status_code`,
    :func:`~rt4chart.judges.policy.retry_after_s`)."""

    status_code: int
    """The HTTP status."""
    headers: Mapping[str, str]
    """The response headers (Retry-After)."""


class EndpointError(Exception):
    """The server answered with an HTTP error: its status and its message, never a request header."""

    def __init__(self, message: str, response: ErrorResponse) -> None:
        super().__init__(message)
        self.response = response


class MalformedResponse(Exception):
    """A 2xx answer that is not a chat completion (a proxy's page, a truncated body)."""


class OpenAICompatSender(EndpointSender):
    """One attempt as one aiohttp POST of ``{api_base}/chat/completions``."""

    # One session per event loop: its connections belong to the loop that opened them, and a
    # backend may serve several ``asyncio.run`` calls (one per CLI command or evaluation). Each is
    # held open by an async generator, which the loop closes when it ends (``asyncio.run`` shuts
    # down a loop's async generators), closing the session in that loop and not in another.
    _clients: weakref.WeakKeyDictionary[
        asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, AsyncGenerator[aiohttp.ClientSession, None]]
    ]

    def __init__(self, settings: OpenAICompatSettings, *, api_key: str | None, api_base: str | None) -> None:
        self.settings = settings
        self.model = served_model(settings.model)
        self.api_base = api_base
        self._url = f"{(api_base or OPENAI_BASE_URL).rstrip('/')}/chat/completions"
        self._api_key = api_key
        self._clients = weakref.WeakKeyDictionary()
        mode = "json_schema" if settings.response_format == "auto" else settings.response_format
        self._mode_key = (self._url, self.model)
        self._configured_mode = mode

    @property
    def endpoint(self) -> str:
        return self.name if self.api_base else f"{self.name} (at {OPENAI_BASE_URL})"

    @property
    def structured_output(self) -> str:
        """The ``response_format`` mode sent now: json_schema, json_object or none."""
        return _ACCEPTED_MODE.get(self._mode_key, self._configured_mode)

    def is_transient(self, error: BaseException) -> bool:
        # A dropped connection or a body cut short, in aiohttp's words (not OS errors).
        transient = (MalformedResponse, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
        return isinstance(error, transient) or super().is_transient(error)

    async def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        held = self._clients.get(loop)
        if held is None:
            keeper = self._session_while_the_loop_runs()
            held = self._clients[loop] = (await anext(keeper), keeper)
        return held[0]

    def auth_headers(self) -> dict[str, str]:
        """The headers that carry the key (and the API version, for a provider that asks for one)."""
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    async def _session_while_the_loop_runs(self) -> AsyncGenerator[aiohttp.ClientSession, None]:
        headers = {"Content-Type": "application/json", "Accept-Encoding": ACCEPTED_ENCODINGS, **self.auth_headers()}
        # No pool limit of its own: the policy bounds the calls in flight.
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        # Bodies are inflated by the reply contract (bounded), not by aiohttp.
        session = aiohttp.ClientSession(
            headers=headers, timeout=timeout, connector=connector, auto_decompress=False
        )
        try:
            while True:
                yield session
        finally:
            await session.close()

    def body(self, messages: list[dict[str, str]], request: JudgeRequest, mode: str) -> bytes:
        """The JSON body of one attempt at ``request`` with structured-output ``mode``."""
        fields: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": request.params.temperature,
            "max_tokens": request.params.max_tokens,
        }
        if request.params.seed is not None:
            fields["seed"] = request.params.seed
        if request.template_kwargs is not None:
            fields["chat_template_kwargs"] = request.template_kwargs
        if reads_logprobs(request.output_schema):
            # A one-token reply read from its log probabilities: no structured output to ask for.
            fields["logprobs"] = True
            fields["top_logprobs"] = FirstTokenChoices.TOP_LOGPROBS
            return pydantic_core.to_json(fields)
        # pydantic_core's encoder (Rust) is several times the standard library's speed on prompts;
        # the object is closed after the response_format member, encoded once per reply model.
        return pydantic_core.to_json(fields)[:-1] + _response_format_member(request.output_schema, mode) + b"}"

    async def send(self, messages: list[dict[str, str]], request: JudgeRequest) -> Reply:
        mode = self.structured_output
        try:
            return await self._post(self.body(messages, request, mode), request)
        except EndpointError as refused:
            if refused.response.status_code != 400 or mode == "none":
                raise
            # Maybe the server does not take this response_format: the laxer forms, at once.
            for laxer in STRUCTURED_OUTPUT_FALLBACKS[STRUCTURED_OUTPUT_FALLBACKS.index(mode) + 1 :]:
                try:
                    reply = await self._post(self.body(messages, request, laxer), request)
                except EndpointError as again:
                    if again.response.status_code != 400:
                        raise
                    continue
                _ACCEPTED_MODE[self._mode_key] = laxer
                return reply
            raise

    async def _post(self, body: bytes, request: JudgeRequest) -> Reply:
        """One attempt under the reply contract (:mod:`rt4chart.judges.bounded_http`): the decoded
        body capped, the whole exchange (same-origin redirects included) within ``timeout_s``."""
        limit = reply_body_cap_bytes(request.params.max_tokens)
        client = await self._client()
        url = self._url
        async with asyncio.timeout(self.settings.timeout_s):
            for _ in range(MAX_REDIRECTS + 1):
                # Redirects are followed here, not by aiohttp, so that another origin's is refused
                # before the audited text is sent there; 307/308 keep the method and the body.
                async with client.post(url, data=body, allow_redirects=False) as response:
                    status, headers = response.status, response.headers
                    target = redirect_target(url, status, headers.get("Location"))
                    if target is None or status not in (307, 308):
                        reader = DecodedBody(headers.get("Content-Encoding"), limit)
                        async for chunk in response.content.iter_any():
                            reader.feed(chunk)
                        break
                url = target
            else:
                raise MalformedResponse(f"more than {MAX_REDIRECTS} redirects from {self.endpoint}")
        data = reader.finish()
        if status >= 400:
            raise EndpointError(self._error_message(status, data), ErrorResponse(status, headers))
        try:
            answer = pydantic_core.from_json(data)
            choice = answer["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise MalformedResponse(f"HTTP {status} without a chat completion: {data[:200]!r}") from error
        return completion_reply(
            answer, message, rate_signal(headers), first_token_candidates(choice.get("logprobs"), request.output_schema)
        )

    def _error_message(self, status: int, data: bytes) -> str:
        """``HTTP 429 from <endpoint>: <the server's message>``: the status and what the server
        said, never the request (its headers carry the key; the policy scrubs echoes of it)."""
        try:
            detail = json.loads(data)
            detail = detail.get("error", detail) if isinstance(detail, dict) else detail
            detail = detail.get("message", detail) if isinstance(detail, dict) else detail
        except ValueError:
            detail = data.decode("utf-8", "replace")
        return f"HTTP {status} from {self.endpoint}: {str(detail)[:_ERROR_MESSAGE_CHARS]}"

    async def aclose(self) -> None:
        # This loop's session now; those of other loops close when their loops end.
        held = self._clients.pop(asyncio.get_running_loop(), None)
        if held is not None:
            await held[1].aclose()


class OpenAICompatBackend(PolicyBackend):
    """A judge on an OpenAI-compatible server, sent with aiohttp, under the transport policy."""

    sender: OpenAICompatSender

    def __init__(
        self, settings: OpenAICompatSettings, *, api_key: str | None = None, api_base: str | None = None
    ) -> None:
        super().__init__(OpenAICompatSender(settings, api_key=api_key, api_base=api_base), settings)
