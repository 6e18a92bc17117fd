"""A judge on Anthropic's Message Batches (``/v1/messages/batches``, half the online price): the
rounds, journal and resubmission rules of :mod:`rt4chart.judges.batch`, in Anthropic's shapes.

Each request becomes ``{"custom_id", "params"}``, ``params`` the Messages API body of the same
request (:meth:`AnthropicBatchSender.body`): the system prompt as the top-level ``system``,
``max_tokens`` (required by Anthropic), the prompt split into content blocks with ``cache_control``
on the shared head (:mod:`rt4chart.judges.prompt_cache`), and the reply's JSON schema as the one
tool the model must call (``json_tool_call``, forced with ``tool_choice``): what litellm sends for
a JSON-schema ``response_format`` on the online path (litellm 1.110) to models it does not know to
take Anthropic's native ``output_format``, and what every Claude model takes in a batch without a
beta header (JSON mode without a schema sends no tool, as litellm sends none). The tool's
``input`` is the reply's text, as litellm makes it online, so parsing, re-asks, the cache under
the online key and the records are the online path's. Usage: ``input_tokens``,
``cache_read_input_tokens`` and ``cache_creation_input_tokens`` together are the prompt tokens
(litellm counts them so), the reads and writes priced at their own rates.

A batch ends (``processing_status`` ``ended``) with one result line per request at ``results_url``:
``succeeded`` (the message), ``errored``, ``canceled`` or ``expired``; a request without a reply is
submitted once more, then fails as online. Anthropic's batches carry no metadata, so a batch whose
creation the journal missed (a kill between the two) is found again by what it holds: the listed
batches created after the journaled intent, not named by the journal, with as many requests, are
followed to their end and the one whose result lines carry exactly the intent's custom ids is its
batch (a lost batch is known once it has ended; nothing is submitted again meanwhile).

The key (``x-api-key``) goes to the profile's host only; results are read only from that origin.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

from rt4chart.judges.batch import BatchResults, BatchSender, Submission
from rt4chart.judges.openai_compat import MalformedResponse
from rt4chart.judges.policy import Reply
from rt4chart.judges.prompt_cache import cache_marked_messages
from rt4chart.judges.replies import reads_logprobs
from rt4chart.protocol import JudgeRequest, output_json_schema

ANTHROPIC_BASE_URL = "https://api.anthropic.com"
"""Where an Anthropic judge without a base URL is served."""

ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` header sent with every request."""

MAX_ANTHROPIC_BATCH_REQUESTS = 100_000
"""Requests one Message Batch may hold."""

MAX_ANTHROPIC_BATCH_BYTES = 256_000_000
"""Bytes one Message Batch's creation request may hold (Anthropic's 256 MB)."""

JSON_TOOL = "json_tool_call"
"""The tool whose input is the reply (litellm's name for the tool it makes of a ``response_format``)."""

LOST_BATCH_CLOCK_SKEW_S = 600.0
"""How much older than the journaled intent a lost batch may look (the provider's clock is not ours)."""

UNANSWERED_RESULTS = ("errored", "canceled", "expired")
"""Result types of a request that got no reply."""


def anthropic_base(api_base: str | None) -> str:
    """The Message Batches endpoint at ``api_base`` (an origin, ``.../v1`` or ``.../v1/messages``)."""
    base = (api_base or ANTHROPIC_BASE_URL).rstrip("/").removesuffix("/messages").removesuffix("/v1")
    return f"{base}/v1/messages"


def message_reply(message: dict[str, Any]) -> Reply:
    """What the policy reads of an Anthropic message: the forced tool's input as JSON text (else
    the text blocks), and the token counts with the cache reads and writes apart."""
    blocks = [block for block in message.get("content") or [] if isinstance(block, dict)]
    tool = next((b for b in blocks if b.get("type") == "tool_use" and b.get("name") == JSON_TOOL), None)
    text = json.dumps(tool.get("input")) if tool is not None else "".join(
        str(b.get("text") or "") for b in blocks if b.get("type") == "text"
    )
    counts = message.get("usage") or {}
    read, written = (int(counts.get(k) or 0) for k in ("cache_read_input_tokens", "cache_creation_input_tokens"))
    return Reply(
        text=text,
        prompt_tokens=int(counts.get("input_tokens") or 0) + read + written,
        cached_prompt_tokens=read,
        cache_write_prompt_tokens=written,
        completion_tokens=int(counts.get("output_tokens") or 0),
    )


def _created_at(batch: dict[str, Any]) -> float:
    """A listed batch's ``created_at`` (RFC 3339) in Unix seconds; 0 when it has none."""
    try:
        return datetime.fromisoformat(str(batch.get("created_at"))).timestamp()
    except ValueError:
        return 0.0


class AnthropicBatchSender(BatchSender):
    """The batch sender in Anthropic's shapes (see the module docstring)."""

    max_batch_requests = MAX_ANTHROPIC_BATCH_REQUESTS
    max_batch_bytes = MAX_ANTHROPIC_BATCH_BYTES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model = self.settings.model.removeprefix("anthropic/")
        self._base = anthropic_base(self.api_base)

    @property
    def endpoint(self) -> str:
        return self.name if self.api_base else f"{self.name} (at {ANTHROPIC_BASE_URL})"

    def auth_headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def body(self, messages: list[dict[str, str]], request: JudgeRequest, mode: str) -> bytes:
        """The Messages API ``params`` of one attempt at ``request``."""
        marked = cache_marked_messages(messages)
        fields: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.params.max_tokens,
            "temperature": request.params.temperature,
        }
        system = [block for message in marked if message["role"] == "system" for block in message["content"]]
        if system:
            fields["system"] = system
        fields["messages"] = [message for message in marked if message["role"] != "system"]
        if mode == "json_schema" and not reads_logprobs(request.output_schema):
            # JSON mode without a schema gets no tool, as from litellm: the prompt asks for the JSON.
            schema = {"type": "object", **output_json_schema(request.output_schema)}
            fields["tools"] = [{"name": JSON_TOOL, "input_schema": schema}]
            fields["tool_choice"] = {"type": "tool", "name": JSON_TOOL}
        return json.dumps(fields, separators=(",", ":")).encode()

    async def send(self, messages: list[dict[str, str]], request: JudgeRequest) -> Reply:
        body = self.body(messages, request, self.structured_output)
        delivery = await self.rounds.ask(body, self.line_max_cost_usd(messages, request))
        message = delivery.body
        if message.get("type") != "message":
            raise MalformedResponse(f"a batch result without a message: {str(message)[:200]}")
        reply = message_reply(message)
        return dataclasses.replace(reply, shared=True) if delivery.shared else reply

    async def create_batch(self, requests: list[tuple[str, bytes]], submission: str) -> str:
        body = b'{"requests":[%s]}' % b",".join(
            b'{"custom_id":"%s","params":%s}' % (custom_id.encode(), params) for custom_id, params in requests
        )
        created = await self._json("POST", "/batches", data=body)
        return str(created["id"])

    def batch_path(self, batch_id: str) -> str:
        return f"/batches/{batch_id}"

    def has_ended(self, batch: dict[str, Any]) -> bool:
        return batch.get("processing_status") == "ended"

    async def results(self, batch: dict[str, Any]) -> BatchResults:
        replies: dict[str, dict[str, Any]] = {}
        reasons: dict[str, str] = {}
        for line in await self._result_lines(batch):
            custom_id, result = str(line.get("custom_id")), line.get("result") or {}
            kind = str(result.get("type"))
            if kind == "succeeded" and isinstance(result.get("message"), dict):
                replies[custom_id] = result["message"]
            else:
                error = (result.get("error") or {}).get("error") or result.get("error") or {}
                detail = f": {error.get('type')}: {error.get('message')}" if isinstance(error, dict) and error else ""
                reasons[custom_id] = f"{kind}{detail}"
        how = "canceled" if batch.get("cancel_initiated_at") else "processed"
        return BatchResults(how, replies, reasons)

    async def _result_lines(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """The result lines of an ended batch, read from ``results_url`` on the profile's origin only
        (the key goes nowhere else)."""
        url = batch.get("results_url")
        if not isinstance(url, str):
            return []
        if not url.startswith(f"{self._base}/"):
            raise MalformedResponse(f"the batch's results are at another origin than {self.endpoint}: refused")
        content = await self._call("GET", url.removeprefix(self._base))
        return [json.loads(line) for line in content.splitlines() if line.strip()]

    async def find_lost(self, missing: dict[str, Submission], known: set[str]) -> dict[str, str]:
        listed = await self._json("GET", "/batches?limit=100")
        batches = sorted(
            (b for b in listed.get("data") or [] if isinstance(b, dict) and str(b.get("id")) not in known),
            key=_created_at,
        )
        found: dict[str, str] = {}
        for name, submission in sorted(missing.items(), key=lambda item: item[1].intended_at or 0.0):
            since = (submission.intended_at or 0.0) - LOST_BATCH_CLOCK_SKEW_S
            for batch in batches:
                batch_id = str(batch.get("id"))
                counts = batch.get("request_counts") or {}
                if (batch_id in found.values() or _created_at(batch) < since
                        or sum(int(v or 0) for v in counts.values()) != len(submission.custom_ids)):
                    continue
                ended = await self.wait_for(batch_id, "a batch the journal lost", len(submission.custom_ids))
                held = {str(line.get("custom_id")) for line in await self._result_lines(ended)}
                if held == set(submission.custom_ids):
                    found[name] = batch_id
                    break
        return found
