"""Any model litellm can call (OpenAI, GLM via zai, vLLM, any OpenAI-compatible server) as a judge.

A thin sender (:class:`LiteLLMSender`): the call arguments (structured output, seed, the key for
this endpoint), ``litellm.acompletion``, the reply's text and tokens, and litellm's price. The
transport policy (:mod:`rt4chart.judges.policy`) does the rest: retries and backoff, the circuit
breaker, concurrency, reply parsing and key scrubbing. Every reply is read under the HTTP reply
contract (:mod:`rt4chart.judges.bounded_http`): litellm's clients get a transport that enforces
it. ``reasoning_content`` is never read, so a verdict a model merely thinks about is never taken as
the verdict.
"""

from __future__ import annotations

import os
from typing import Any

# litellm fetches its model price list (on import) and its Anthropic beta-header table (at an
# Anthropic call) from the network unless told to use the copies it ships; a user's setting wins.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")

import litellm
from litellm.exceptions import APIConnectionError, Timeout

from rt4chart.judges.bounded_http import ReplyLimits, reply_limits
from rt4chart.judges.bounded_httpx import bound_litellm_transports
from rt4chart.judges.pacing import rate_signal
from rt4chart.judges.policy import EndpointSender, EndpointSettings, PolicyBackend, Reply, reply_body_cap_bytes
from rt4chart.judges.prompt_cache import cache_marked_messages
from rt4chart.judges.replies import FirstTokenChoices, first_token_candidates, parse_reply, reads_logprobs
from rt4chart.protocol import JudgeRequest, output_json_schema
from rt4chart.scrubbing import scrub, scrub_value, secrets_in_environment

__all__ = [
    "LiteLLMBackend",
    "LiteLLMSender",
    "LiteLLMSettings",
    "litellm_provider",
    "missing_key_variables",
    # Moved to rt4chart.judges.replies / .scrubbing; importable from here for one release.
    "parse_reply",
    "scrub",
    "scrub_value",
    "secrets_in_environment",
]

litellm.suppress_debug_info = True
# litellm reads a whole reply before handing it over, with per-read timeouts only: every client it
# builds reads under the reply contract instead (size cap, deadline, no cross-origin redirect).
bound_litellm_transports()

_SCHEMA_PROVIDERS = frozenset({"hosted_vllm"})
"""Providers whose servers enforce a JSON schema (vLLM guided decoding) although litellm's
capability table, keyed by model name, cannot know the served model."""

_MODELS_PRICED_HERE: set[str] = set()
"""Models litellm had no price for, registered in its price table with a judge profile's prices."""


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


class LiteLLMSettings(EndpointSettings):
    """How one model is called through litellm. The judge registry (:mod:`rt4chart.judges.registry`) builds
    these from a profile; this backend knows no profile."""

    model: str
    """litellm model string (``gpt-4o-mini``, ``zai/glm-4.7``, ``hosted_vllm/<model>``)."""


class LiteLLMSender(EndpointSender):
    """One attempt through ``litellm.acompletion``."""

    def __init__(self, settings: LiteLLMSettings, *, api_key: str | None = None, api_base: str | None = None) -> None:
        self.settings = settings
        self.model: str = settings.model
        self.api_base = api_base
        self._api_key = api_key
        self.provider = litellm_provider(self.model)
        self._supported = set(litellm.get_supported_openai_params(model=self.model) or [])
        self.structured_output = self._structured_output()
        """The ``response_format`` mode used: json_schema, json_object or none."""
        self._table_prices = self._litellm_prices()

    @property
    def endpoint(self) -> str:
        return self.name if self.api_base else f"{self.name} (the default endpoint of provider {self.provider})"

    def is_transient(self, error: BaseException) -> bool:
        return isinstance(error, Timeout | APIConnectionError) or super().is_transient(error)

    def timed_out(self, error: BaseException) -> bool:
        return isinstance(error, Timeout) or super().timed_out(error)

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

    def _litellm_prices(self) -> tuple[float, float] | None:
        """USD per prompt and per completion token from litellm's price table, ``None`` when it has none."""
        info: dict[str, Any] | None = None
        if self.model not in _MODELS_PRICED_HERE:
            try:
                info = dict(litellm.get_model_info(model=self.model))
            except Exception:  # litellm raises for a model it has no price for, such as a self-hosted one
                info = None
        if info is None and self.provider is not None and self.model not in _MODELS_PRICED_HERE:
            # litellm prices every reply itself. For a model missing from its table it searches the
            # whole table on every call (a large share of a local server's per-call CPU), so it is
            # given this judge's prices once (it caches what it looked up, so they are never
            # changed; replies of such models are priced by the policy); the cache-token prices
            # silence its warning about them.
            prices = self.settings.per_token_prices() or (0.0, 0.0)
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
        if info is None:
            return None
        return float(info.get("input_cost_per_token") or 0.0), float(info.get("output_cost_per_token") or 0.0)

    def per_token_prices(self) -> tuple[float, float] | None:
        return self._table_prices

    def count_prompt_tokens(self, request: JudgeRequest) -> int:
        """Prompt tokens of ``request`` with the model's tokenizer (litellm's default when unknown)."""
        return int(litellm.token_counter(model=self.model, messages=[m.model_dump() for m in request.messages]))

    def call_arguments(self, request: JudgeRequest) -> dict[str, Any]:
        """litellm's keyword arguments for one attempt at ``request`` (everything but the messages)."""
        arguments: dict[str, Any] = {
            "model": self.model,
            "temperature": request.params.temperature,
            "max_tokens": request.params.max_tokens,
            "timeout": self.settings.timeout_s,
            # Retries are the policy's, so that each one is counted and paced; litellm and the
            # OpenAI client would otherwise retry silently.
            "num_retries": 0,
            "max_retries": 0,
        }
        if request.params.seed is not None and (not self._supported or "seed" in self._supported):
            arguments["seed"] = request.params.seed
        if self.api_base:
            arguments["api_base"] = self.api_base
        if self._api_key:
            arguments["api_key"] = self._api_key
        if request.template_kwargs is not None:
            # Sent as they are in the body (vLLM's chat_template_kwargs); litellm knows no such argument.
            arguments["extra_body"] = {"chat_template_kwargs": request.template_kwargs}
        schema = request.output_schema
        mode = self.structured_output
        if reads_logprobs(schema):
            # A one-token reply read from its log probabilities: no structured output to ask for.
            arguments["logprobs"] = True
            arguments["top_logprobs"] = FirstTokenChoices.TOP_LOGPROBS
        elif mode == "json_schema":
            arguments["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema.__name__, "schema": output_json_schema(schema)},
            }
        elif mode == "json_object":
            arguments["response_format"] = {"type": "json_object"}
        return arguments

    async def call(self, messages: list[dict[str, Any]], arguments: dict[str, Any]) -> Any:
        """The HTTP attempt itself (a judge fleet sends it through its router instead)."""
        return await litellm.acompletion(messages=messages, **arguments)

    def deployment(self, response: Any) -> str | None:
        """Which deployment answered ``response``: ``None`` for a judge with one endpoint."""
        return None

    async def send(self, messages: list[dict[str, str]], request: JudgeRequest) -> Reply:
        cap = reply_body_cap_bytes(request.params.max_tokens)
        limits = ReplyLimits(max_bytes=cap, deadline_s=self.settings.timeout_s)
        with reply_limits(limits):
            # Anthropic caches only up to a marked block: the shared head marked, the claims after it
            # (litellm passes content blocks and their cache_control to Anthropic unchanged).
            sent = cache_marked_messages(messages) if self.provider == "anthropic" else messages
            response = await self.call(sent, self.call_arguments(request))
        counts = getattr(response, "usage", None)
        # litellm's own price (it knows cached-token discounts) when its price table has the model.
        priced_by_litellm = self._table_prices is not None
        hidden = getattr(response, "_hidden_params", None) or {}
        reported = hidden.get("response_cost") if priced_by_litellm else None
        return Reply(
            text=str(response.choices[0].message.content or ""),
            prompt_tokens=int(getattr(counts, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(counts, "completion_tokens", 0) or 0),
            cached_prompt_tokens=int(getattr(getattr(counts, "prompt_tokens_details", None), "cached_tokens", 0) or 0),
            # litellm counts Anthropic's cache reads and writes in prompt_tokens, the writes apart here.
            cache_write_prompt_tokens=int(getattr(counts, "cache_creation_input_tokens", 0) or 0),
            cost_usd=float(reported) if isinstance(reported, int | float) else None,
            deployment=self.deployment(response),
            rate=rate_signal(hidden.get("additional_headers")),
            top_logprobs=first_token_candidates(getattr(response.choices[0], "logprobs", None), request.output_schema),
        )

    # litellm keeps its HTTP clients in a process-wide cache shared by every backend: nothing to close.


class LiteLLMBackend(PolicyBackend):
    """A judge called through ``litellm.acompletion``, under the transport policy."""

    sender: LiteLLMSender

    def __init__(self, settings: LiteLLMSettings, *, api_key: str | None = None, api_base: str | None = None) -> None:
        super().__init__(LiteLLMSender(settings, api_key=api_key, api_base=api_base), settings)
