"""Any model litellm can call (OpenAI, GLM via zai, vLLM, any OpenAI-compatible server) as a judge.

The verdict comes only from a reply object that validates against the request's pydantic schema:
the last such object of the reply that is not copied from the prompt. Text around it (prose, code
fences, ``<think>`` blocks) is stripped, and ``reasoning_content`` is never read, so a
verdict-shaped string that a model merely thinks about, or quotes from the answer or context under
audit, is never taken as the verdict.

Retries (tenacity, exponential backoff with jitter): 429 (Retry-After honoured), 5xx, timeouts,
dropped connections, and replies that do not validate (re-asked with the validation error, at most
``max_reasks`` times). Every attempt that reached the server is counted in the usage. A request
that still fails returns a response with ``error``. Failures that waiting will not cure (connection
refused, a host name that does not resolve, 401/403, 404) get at most one retry and feed the
backend's circuit breaker (:mod:`rt4chart.backends.circuit`): once it opens, ``complete`` raises
:class:`~rt4chart.backends.circuit.JudgeUnavailable`, the one exception that stops a run. API keys
never appear in errors.
Configured API keys (and key-shaped tokens) are scrubbed from every string that leaves the backend:
the parsed verdict, ``raw`` and ``error``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
import weakref
from collections.abc import Iterable
from email.utils import parsedate_to_datetime
from typing import Any, Literal

# litellm fetches its model price list from the network on import unless told to use the copy it
# ships; a user's explicit setting wins.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from litellm.exceptions import APIConnectionError, Timeout
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    wait_exponential_jitter,
)

from rt4chart.backends.base import JudgeRequest, JudgeResponse, Message, output_json_schema
from rt4chart.backends.circuit import (
    NON_TRANSIENT_ATTEMPTS,
    NON_TRANSIENT_WAIT_S,
    CircuitBreaker,
    JudgeUnavailable,
)
from rt4chart.types import Usage

litellm.suppress_debug_info = True

_SCHEMA_PROVIDERS = frozenset({"hosted_vllm"})
"""Providers whose servers enforce a JSON schema (vLLM guided decoding) although litellm's
capability table, keyed by model name, cannot know the served model."""

_MODELS_PRICED_HERE: set[str] = set()
"""Models litellm had no price for, registered in its price table with a judge profile's prices."""

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_SECRET_PATTERNS = (
    re.compile(r"(Bearer\s+)[^\s'\"]+", re.IGNORECASE),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"),
    re.compile(r"((?:api[_-]?key|x-api-key)[\"']?\s*[:=]\s*[\"']?)[^\s'\",}]+", re.IGNORECASE),
)
_SECRET_ENV_SUFFIXES = ("_API_KEY", "_KEY", "_TOKEN", "_SECRET")
_REPLY_LIMIT = 500


def litellm_provider(model: str) -> str | None:
    """The provider litellm routes ``model`` to, or ``None`` when it cannot route it."""
    try:
        provider: str = litellm.get_llm_provider(model=model)[1]
    except Exception:  # litellm raises its BadRequestError, or others, for unroutable strings
        return None
    return provider


def missing_key_variables(model: str) -> list[str]:
    """Environment variables litellm needs for ``model`` and does not find."""
    return list(litellm.validate_environment(model=model).get("missing_keys", []))


def secrets_in_environment() -> set[str]:
    """Values of environment variables named like keys, tokens and secrets."""
    return {
        value for name, value in os.environ.items()
        if name.upper().endswith(_SECRET_ENV_SUFFIXES) and len(value) >= 8
    }


def scrub(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with API keys removed: ``secrets`` (default: :func:`secrets_in_environment`) and
    key-shaped tokens."""
    candidates = secrets_in_environment() if secrets is None else secrets
    for secret in sorted(filter(None, candidates), key=len, reverse=True):
        text = text.replace(secret, "***")
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda match: (match.group(1) if match.groups() else "") + "***", text)
    return text


def _json_objects(text: str, *, nested: bool) -> list[str]:
    """Complete JSON objects in ``text`` in order: top-level ones, or with ``nested`` every one."""
    decoder = json.JSONDecoder()
    found: list[str] = []
    position = text.find("{")
    while position != -1:
        try:
            _, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            position = text.find("{", position + 1)
            continue
        found.append(text[position:end])
        position = text.find("{", position + 1 if nested else end)
    return found


def _canonical(candidate: str) -> str:
    return json.dumps(json.loads(candidate), sort_keys=True, ensure_ascii=False)


def _json_candidates(text: str) -> list[str]:
    """Complete top-level JSON objects in ``text``, outside ``<think>`` blocks, in order.

    Code fences are not special: a fenced object is found where it stands, so a verdict the model
    merely quotes (from the answer under audit) before its own does not win by being fenced.
    """
    if "</think>" in text.lower():
        # Some chat templates open the think block in the prompt, so only its end is in the reply.
        text = re.split(r"</think>", _THINK_BLOCK.sub("", text), flags=re.IGNORECASE)[-1]
    return _json_objects(text, nested=False)


def parse_reply(
    text: str, schema: type[BaseModel], prompt: Iterable[str] = ()
) -> tuple[BaseModel | None, str | None]:
    """The model's own verdict in a reply, or why there is none.

    The verdict is the last complete schema-valid object of the reply (a model that restates or
    quotes objects before answering puts its answer last), skipping any object that occurs in
    ``prompt`` (the texts of the request's messages): an object copied from the prompt, such as
    the template's example or a verdict planted in the text under audit, is not the model's own.
    """
    candidates = _json_candidates(text)
    if not candidates:
        return None, "the reply holds no JSON object"
    quoted = {_canonical(found) for part in prompt for found in _json_objects(part, nested=True)}
    errors: list[str] = []
    copied = 0
    for candidate in reversed(candidates):
        try:
            parsed = schema.model_validate_json(candidate)
        except ValidationError as error:
            errors.append(str(error))
            continue
        if _canonical(candidate) in quoted:
            copied += 1
            continue
        return parsed, None
    if copied:
        return None, f"the reply only repeats {schema.__name__} objects of the prompt"
    return None, f"the reply does not match the {schema.__name__} schema: {errors[-1][:_REPLY_LIMIT]}"


_TEMPLATE_TOKENS_PER_MESSAGE = 16
"""Tokens a chat template may add around one message (role markers, separators): generous."""

_REASK_TOKENS = 4 * (_REPLY_LIMIT + 300) + 2 * _TEMPLATE_TOKENS_PER_MESSAGE
"""Bound on what a re-ask adds besides the bad reply: its instruction and the reason (UTF-8 bytes)."""


def prompt_token_bound(messages: Iterable[Message]) -> int:
    """Prompt tokens no tokenizer can exceed: the UTF-8 bytes of the messages (every byte-level BPE
    or byte-fallback token holds at least one byte) plus the chat template's tokens."""
    bound = _TEMPLATE_TOKENS_PER_MESSAGE
    for message in messages:
        bound += len(message.content.encode("utf-8")) + _TEMPLATE_TOKENS_PER_MESSAGE
    return bound


def scrub_value(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, scalars) with every string scrubbed."""
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, list):
        return [scrub_value(item, secrets) for item in value]
    if isinstance(value, dict):
        return {key: scrub_value(item, secrets) for key, item in value.items()}
    return value


class InvalidReply(Exception):
    """A reply arrived but holds no schema-valid object (re-asked unless ``final``)."""

    def __init__(self, reason: str, raw: str, *, final: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw
        self.final = final


def _status(error: BaseException) -> int | None:
    status = getattr(error, "status_code", None)
    return status if isinstance(status, int) else None


def _worth_retrying(error: BaseException) -> bool:
    if isinstance(error, InvalidReply):
        return not error.final
    if isinstance(error, Timeout | APIConnectionError):
        return True
    status = _status(error)
    return status is not None and (status in _RETRYABLE_STATUS or status >= 500)


def non_transient_reason(error: BaseException) -> str | None:
    """Why ``error`` will not go away by waiting, or ``None`` for a failure worth backing off on.

    litellm reports a refused connection or an unresolvable host as a 500 "Connection error", so
    the cause is read from the exception chain (aiohttp or httpx underneath, then the OS error).
    """
    status = _status(error)
    if status in (401, 403):
        return f"the server refused the credentials (HTTP {status})"
    if status == 404:
        return "the server knows no such model or endpoint (HTTP 404)"
    cause: BaseException | None = error
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, socket.gaierror):
            return f"the host name does not resolve ({cause})"
        if isinstance(cause, ConnectionRefusedError):
            return f"connection refused ({cause})"
        cause = cause.__cause__ or cause.__context__
    return None


def retry_after_s(error: BaseException | None) -> float | None:
    """Seconds the server asked the client to wait (Retry-After as seconds or an HTTP date)."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    value = headers.get("retry-after") if headers is not None else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class LiteLLMSettings(BaseModel):
    """How one model is called: transport, pacing and prices. The judge registry
    (:mod:`rt4chart.judges`) builds these from a profile; this backend knows no profile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """The judge's name, recorded in outputs and cache keys (the server is appended to it)."""
    model: str
    """litellm model string (``gpt-4o-mini``, ``zai/glm-4.7``, ``hosted_vllm/<model>``)."""
    input_usd_per_mtok: float | None = Field(default=None, ge=0.0)
    """Price per million prompt tokens; ``None`` means litellm's price list (or 0 if it has none)."""
    output_usd_per_mtok: float | None = Field(default=None, ge=0.0)
    """Price per million completion tokens; ``None`` as for input."""
    concurrency: int = Field(default=8, ge=1)
    """Calls in flight at once."""
    response_format: Literal["auto", "json_schema", "json_object", "none"] = "auto"
    """Structured-output mode; ``auto`` asks litellm's capability helpers."""
    timeout_s: float = Field(default=120.0, gt=0.0)
    """Seconds one HTTP attempt may take."""
    max_attempts: int = Field(default=5, ge=1)
    """Attempts per request, the first included (rate limits, 5xx, timeouts, invalid replies)."""
    max_reasks: int = Field(default=1, ge=0)
    """Re-asks after replies that hold no schema-valid object, within ``max_attempts``."""
    backoff_s: float = Field(default=1.0, ge=0.0)
    """First retry delay; it doubles per attempt, plus up to as much random jitter."""
    backoff_max_s: float = Field(default=60.0, ge=0.0)
    """Longest retry delay, Retry-After included."""


class LiteLLMBackend:
    """A judge called through ``litellm.acompletion``."""

    def __init__(
        self,
        settings: LiteLLMSettings,
        *,
        api_key: str | None = None,
        api_base: str | None = None,
    ) -> None:
        self.settings = settings
        self.model: str = settings.model
        self.api_base = api_base
        self._api_key = api_key
        self.concurrency = settings.concurrency
        # One semaphore per event loop: a semaphore is bound to the loop it first waited in, and a
        # backend may serve several ``asyncio.run`` calls (one per CLI command or evaluation).
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._backoff = wait_exponential_jitter(
            multiplier=settings.backoff_s, max=settings.backoff_max_s, jitter=settings.backoff_s
        )
        self.provider = litellm_provider(self.model)
        self._supported = set(litellm.get_supported_openai_params(model=self.model) or [])
        self.structured_output = self._structured_output()
        """The ``response_format`` mode used: json_schema, json_object or none."""
        self._prices, self._priced_by_litellm = self._per_token_prices()
        self._secrets = secrets_in_environment() | ({api_key} if api_key else set())
        self.circuit = CircuitBreaker(
            self.name if api_base else f"{self.name} (the default endpoint of provider {self.provider})"
        )
        """Opens after consecutive non-transient failures; then every call raises."""

    def __repr__(self) -> str:
        return f"LiteLLMBackend(model={self.model!r}, api_base={self.api_base!r})"

    @property
    def name(self) -> str:
        # The server is part of the judge's identity (and so of every cache key): two servers
        # answering to one model name are two judges.
        return f"{self.settings.name}@{self.api_base}" if self.api_base else self.settings.name

    @property
    def supports_decompose(self) -> bool:
        return True

    def _structured_output(self) -> str:
        mode = self.settings.response_format
        if mode != "auto":
            return mode
        if (
            litellm.supports_response_schema(model=self.model)
            or self.provider in _SCHEMA_PROVIDERS
            # An OpenAI-compatible server of the user's own (vLLM, llama.cpp, SGLang, LM Studio):
            # they all enforce JSON schemas; litellm knows only the models of public APIs.
            or (self.provider == "openai" and self.api_base is not None)
        ):
            return "json_schema"
        if "response_format" in self._supported:
            return "json_object"
        return "none"

    def _per_token_prices(self) -> tuple[tuple[float, float], bool]:
        """USD per prompt and per completion token (the settings', else litellm's price table), and
        whether litellm had a price of its own for the model."""
        settings = self.settings
        info: dict[str, Any] | None = None
        if self.model not in _MODELS_PRICED_HERE:
            try:
                info = dict(litellm.get_model_info(model=self.model))
            except Exception:  # litellm raises for a model it has no price for, such as a self-hosted one
                info = None
        if settings.input_usd_per_mtok is not None or settings.output_usd_per_mtok is not None:
            prices = (settings.input_usd_per_mtok or 0.0) / 1e6, (settings.output_usd_per_mtok or 0.0) / 1e6
        elif info is not None:
            prices = float(info.get("input_cost_per_token") or 0.0), float(info.get("output_cost_per_token") or 0.0)
        else:
            prices = 0.0, 0.0
        if info is None and self.provider is not None and self.model not in _MODELS_PRICED_HERE:
            # litellm prices every reply itself. For a model missing from its table it searches the
            # whole table on every call (a large share of a local server's per-call CPU), so it is
            # given this judge's prices once (it caches what it looked up, so they are never
            # changed; replies of such models are priced here); the cache-token prices silence
            # its warning about them.
            litellm.register_model({
                self.model: {
                    "litellm_provider": self.provider,
                    "mode": "chat",
                    "input_cost_per_token": prices[0],
                    "output_cost_per_token": prices[1],
                    "cache_creation_input_token_cost": prices[0],
                    "cache_read_input_token_cost": prices[0],
                }
            })
            _MODELS_PRICED_HERE.add(self.model)
        return prices, info is not None

    def max_cost_usd(self, request: JudgeRequest) -> float:
        """The most ``request`` can cost, at the judge's prices, whatever tokenizer the server uses.

        Each attempt that gets a reply is billed: the first, and up to ``max_reasks`` re-asks that
        resend the prompt with the bad reply (at most ``max_tokens``) and the reason appended. A
        prompt is bounded by :func:`prompt_token_bound`, not by a count with a tokenizer that may
        not be the server's.
        """
        input_price, output_price = self._prices
        if not input_price and not output_price:
            return 0.0
        prompt = max(self.count_prompt_tokens(request), prompt_token_bound(request.messages))
        output = request.params.max_tokens
        reask_prompt = prompt + output + _REASK_TOKENS
        first = prompt * input_price + output * output_price
        return first + self.settings.max_reasks * (reask_prompt * input_price + output * output_price)

    def count_prompt_tokens(self, request: JudgeRequest) -> int:
        """Prompt tokens of ``request`` with the model's tokenizer (litellm's default when unknown)."""
        return int(litellm.token_counter(model=self.model, messages=[m.model_dump() for m in request.messages]))

    def _call_arguments(self, request: JudgeRequest) -> dict[str, Any]:
        arguments: dict[str, Any] = {
            "model": self.model,
            "temperature": request.params.temperature,
            "max_tokens": request.params.max_tokens,
            "timeout": self.settings.timeout_s,
            # Retries are ours, so that each one is counted and paced; litellm and the OpenAI
            # client would otherwise retry silently.
            "num_retries": 0,
            "max_retries": 0,
        }
        if request.params.seed is not None and (not self._supported or "seed" in self._supported):
            arguments["seed"] = request.params.seed
        if self.api_base:
            arguments["api_base"] = self.api_base
        if self._api_key:
            arguments["api_key"] = self._api_key
        schema = request.output_schema
        mode = self.structured_output
        if mode == "json_schema":
            arguments["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema.__name__, "schema": output_json_schema(schema)},
            }
        elif mode == "json_object":
            arguments["response_format"] = {"type": "json_object"}
        return arguments

    def _refusal(self, error: BaseException) -> str | None:
        """Why ``error`` will not go away by waiting (see :func:`non_transient_reason`), or ``None``."""
        return non_transient_reason(error)

    def _retryable(self, error: BaseException) -> bool:
        """Whether a failed attempt is worth another: transient failures and re-asks."""
        return _worth_retrying(error)

    def _wait(self, state: RetryCallState) -> float:
        backoff = self._backoff(state)
        error = state.outcome.exception() if state.outcome else None
        if error is not None and self._refusal(error) is not None:
            return min(backoff, NON_TRANSIENT_WAIT_S)
        asked = retry_after_s(error)
        return min(max(backoff, asked or 0.0), self.settings.backoff_max_s)

    def _stop(self, state: RetryCallState) -> bool:
        error = state.outcome.exception() if state.outcome else None
        if error is not None and self._refusal(error) is not None:
            return state.attempt_number >= min(NON_TRANSIENT_ATTEMPTS, self.settings.max_attempts)
        return state.attempt_number >= self.settings.max_attempts

    def _cost(self, response: Any, prompt_tokens: int, completion_tokens: int) -> float:
        # litellm's own price (it knows cached-token discounts) unless the prices it used are ours.
        reported = getattr(response, "_hidden_params", {}).get("response_cost") if self._priced_by_litellm else None
        if isinstance(reported, int | float):
            return float(reported)
        input_price, output_price = self._prices
        return prompt_tokens * input_price + completion_tokens * output_price

    async def _send(self, messages: list[dict[str, str]], arguments: dict[str, Any]) -> Any:
        """One HTTP attempt (a judge fleet sends it through its router instead)."""
        return await litellm.acompletion(messages=messages, **arguments)

    def _deployment(self, response: Any) -> str | None:
        """Which deployment answered ``response``: ``None`` for a judge with one endpoint."""
        return None

    async def _attempt(self, arguments: dict[str, Any], messages: list[dict[str, str]], usage: list[Usage]) -> Any:
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = asyncio.Semaphore(self.concurrency)
        async with slots:
            # Another request may have opened the circuit while this one waited for a slot.
            self.circuit.check()
            usage.append(Usage(calls=1))
            response = await self._send(messages, arguments)
        counts = getattr(response, "usage", None)
        prompt_tokens = int(getattr(counts, "prompt_tokens", 0) or 0)
        completion_tokens = int(getattr(counts, "completion_tokens", 0) or 0)
        usage[-1] = Usage(
            calls=1,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_usd=self._cost(response, prompt_tokens, completion_tokens),
        )
        return response

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        self.circuit.check()
        started = time.perf_counter()
        arguments = self._call_arguments(request)
        messages = [m.model_dump() for m in request.messages]
        schema = request.output_schema
        prompt = [m.content for m in request.messages]
        usage: list[Usage] = []
        raw = ""
        parsed: BaseModel | None = None
        error: str | None = None
        invalid_replies = 0
        unreachable: str | None = None
        deployment: str | None = None
        retrying = AsyncRetrying(
            stop=self._stop,
            wait=self._wait,
            retry=retry_if_exception(self._retryable),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    response = await self._attempt(arguments, messages, usage)
                    deployment = self._deployment(response)
                    raw = str(response.choices[0].message.content or "")
                    parsed, reason = parse_reply(raw, schema, prompt)
                    if parsed is None:
                        invalid_replies += 1
                        messages = self._reask(request.messages, raw, reason or "invalid reply")
                        final = invalid_replies > self.settings.max_reasks
                        raise InvalidReply(reason or "invalid reply", raw, final=final)
        except JudgeUnavailable:
            raise
        except InvalidReply as invalid:
            error = f"no valid reply after {len(usage)} attempts: {invalid.reason}"
        except Exception as failure:  # any provider, network or litellm failure becomes data
            error = f"{type(failure).__name__} after {len(usage)} attempts: {failure}"
            unreachable = self._refusal(failure)
        if unreachable is None:
            self.circuit.record_success()
        else:
            # Raises once this failure opens the circuit.
            self.circuit.record_failure(scrub(f"{unreachable}; {error}"[:_REPLY_LIMIT], self._secrets))
        secrets = self._secrets
        total = sum(usage, Usage())
        if parsed is not None:
            # A key can come back inside the verdict itself (a server or model echoing it into a
            # rationale or a quote); every string that leaves the backend is scrubbed.
            parsed = type(parsed).model_validate(scrub_value(parsed.model_dump(mode="json"), secrets))
        return JudgeResponse(
            parsed=parsed,
            raw=scrub(raw, secrets),
            usage=total,
            latency_s=time.perf_counter() - started,
            judge=self.name,
            deployment=deployment,
            error=scrub(error, secrets) if error else None,
        )

    @staticmethod
    def _reask(original: list[Message], raw: str, reason: str) -> list[dict[str, str]]:
        """The original prompt, the bad reply, and what was wrong with it."""
        return [m.model_dump() for m in original] + [
            {"role": "assistant", "content": raw[:4000]},
            {
                "role": "user",
                "content": (
                    f"Your reply could not be used: {reason[:_REPLY_LIMIT]}. Reply again with only "
                    "the JSON object of the requested shape, nothing before or after it."
                ),
            },
        ]

    async def aclose(self) -> None:
        # litellm keeps its HTTP clients in a process-wide cache shared by every backend.
        return None
