"""``POST /v1/chat/completions``: an OpenAI-compatible proxy that forwards a request to the upstream
model and audits its reply (whole, or sentence by sentence as it streams through unchanged)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from rt4chart.runs.guard.messages import ABORT_KEY, read_json
from rt4chart.runs.guard.policy import RequestError
from rt4chart.runs.guard.streaming import Auditor, SentenceVerdict, StreamingAudit, with_answer
from rt4chart.types import Sample, describe_validation_error

LATENCY_BUDGET_FIELD = "rt4_latency_budget_ms"
EXTENSION_FIELDS = frozenset({"rt4_context", LATENCY_BUDGET_FIELD})
"""Fields of a chat request the proxy reads and never forwards upstream."""


class ChatProxy:
    """The proxy of one service: its client session to the upstream, the service's audit and policy."""

    def __init__(self, guard: Auditor) -> None:
        self.guard = guard
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.guard.config.limits.timeout_s))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise RequestError(422, "messages: a chat completion request needs a list of messages")
        reply_id = uuid.uuid4().hex
        # Checked before the request goes upstream: a body rt4chart cannot audit is refused at once.
        pending = chat_sample(body, reply_id)
        budget_ms = chat_latency_budget(body)
        self.guard.config.check_request_budget(LATENCY_BUDGET_FIELD, budget_ms)
        forwarded = {key: value for key, value in body.items() if key not in EXTENSION_FIELDS}
        headers = {"Content-Type": "application/json"}
        key = self.guard.config.upstream_key
        if key is None and self.guard.config.token is None and "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        elif key is not None:
            headers["Authorization"] = f"Bearer {key}"
        assert self._http is not None and self.guard.config.upstream is not None
        url = self.guard.config.upstream.rstrip("/") + "/chat/completions"
        try:
            upstream = await self._http.post(url, json=forwarded, headers=headers)
        except aiohttp.ClientError as error:
            raise RequestError(502, f"the upstream {self.guard.config.upstream} did not answer: {error}") from None
        try:
            if upstream.status != 200:
                return web.Response(
                    status=upstream.status, body=await upstream.read(), content_type=upstream.content_type
                )
            if forwarded.get("stream"):
                return await self._proxy_stream(request, upstream, pending, budget_ms, started)
            reply = await upstream.json()
        finally:
            upstream.release()
        answer = reply["choices"][0]["message"].get("content") or ""
        sample = with_answer(pending, str(reply.get("id") or reply_id), answer)
        record = await self.guard.audit(sample, latency_budget_ms=budget_ms)
        decision = await self.guard.conclude(record, started)
        if decision == "block":
            reply["choices"][0]["message"]["content"] = self.guard.config.policy.block_message
            reply["choices"][0]["finish_reason"] = "content_filter"
        reply["rt4chart"] = {"decision": decision, "label": record.label, "record": record.model_dump(mode="json")}
        return web.json_response(
            reply, headers={"X-Rt4chart-Decision": decision, "X-Rt4chart-Label": str(record.label)}
        )

    async def _proxy_stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        pending: Sample,
        budget_ms: float | None,
        started: float,
    ) -> web.StreamResponse:
        """Pass the upstream's events through byte for byte; a verdict event follows each sentence as
        soon as it is judged; a blocked sentence ends the reply (finish_reason content_filter)."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        envelope: dict[str, Any] = {"object": "chat.completion.chunk", "choices": []}
        writing = asyncio.Lock()  # an upstream event and a verdict event never interleave

        async def emit(verdict: SentenceVerdict) -> None:
            async with writing:
                await response.write(_sse({**envelope, "rt4chart": verdict.event()}))

        audit = StreamingAudit(self.guard, pending, emit, stop_on_block=True, latency_budget_ms=budget_ms)

        async def abort(status: int, message: str) -> web.StreamResponse:
            audit.cancel()
            await response.write(_sse({**envelope, "rt4chart": {"event": "error", "status": status, "error": message}}))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response

        request[ABORT_KEY] = abort

        async def pass_through() -> None:
            async for event in _sse_events(upstream.content):
                data = _sse_data(event)
                if data == "[DONE]":
                    break
                async with writing:
                    await response.write(event)  # the upstream's bytes, unchanged
                if data is not None:
                    chunk = json.loads(data)
                    envelope.update({key: chunk[key] for key in ("id", "created", "model") if key in chunk})
                    for choice in chunk.get("choices") or []:
                        audit.feed((choice.get("delta") or {}).get("content") or "")
            audit.finish()

        passing = asyncio.create_task(pass_through())
        blocking = asyncio.create_task(audit.blocked.wait())
        try:
            # A blocked sentence stops the pass-through at once, even while the upstream is silent.
            await asyncio.wait({passing, blocking}, return_when=asyncio.FIRST_COMPLETED)
            if passing.done():
                passing.result()  # a RequestError (too many sentences) ends the stream below
                await audit.drain()
        except RequestError as error:
            return await abort(error.status, str(error))
        finally:
            passing.cancel()
            blocking.cancel()
        if audit.blocked.is_set():
            upstream.close()  # the rest of the reply is not wanted
            audit.cancel()
            stop = {**envelope, "choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}
            async with writing:
                await response.write(_sse(stop))
        answer = await audit.answer_event(started)
        await response.write(_sse({**envelope, "rt4chart": answer}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


PENDING_ANSWER = "(the upstream's reply)"
"""Stands for the reply before it is known: a conversation makes a sample only with an answer to audit."""


def chat_sample(body: dict[str, Any], sample_id: str) -> Sample:
    """The sample of a chat request, its answer a placeholder that the reply replaces
    (:func:`~rt4chart.runs.guard.streaming.with_answer`). Its context: the request's
    ``rt4_context`` (a string or a list of passages) when it has one; else, when its messages carry tool
    results, the conversation with the reply as its last assistant message (:mod:`rt4chart.conversations`:
    evidence names the tool call, JSON path or table cell; the user's statements may ground a claim, the
    assistant's earlier turns never do); else the content of its system messages, one passage each."""
    messages = body["messages"]
    question = last_user_message(messages)
    explicit = body.get("rt4_context")
    if explicit is not None:
        if isinstance(explicit, str) and explicit.strip():
            return Sample(id=sample_id, context=[explicit], question=question, answer=PENDING_ANSWER)
        if isinstance(explicit, list) and explicit and all(isinstance(p, str) for p in explicit):
            return Sample(id=sample_id, context=list(explicit), question=question, answer=PENDING_ANSWER)
        raise RequestError(422, "rt4_context: a non-empty string or list of strings")
    if any(isinstance(m, dict) and m.get("role") == "tool" for m in messages):
        conversation = [*messages, {"role": "assistant", "content": PENDING_ANSWER}]
        try:
            return Sample.model_validate({"id": sample_id, "messages": conversation})
        except ValidationError as error:
            raise RequestError(422, describe_validation_error(error)) from None
    passages = [_text(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "system"]
    passages = [p for p in passages if p.strip()]
    if not passages:
        raise RequestError(422, "no context to audit against: give rt4_context, tool results or system messages")
    return Sample(id=sample_id, context=passages, question=question, answer=PENDING_ANSWER)


def chat_latency_budget(body: dict[str, Any]) -> float | None:
    """The cascade latency budget a chat request asks for in milliseconds (its ``rt4_latency_budget_ms``),
    ``None`` when it asks for none (the service's ``--latency-budget-ms`` then applies)."""
    asked = body.get(LATENCY_BUDGET_FIELD)
    if asked is None:
        return None
    if isinstance(asked, bool) or not isinstance(asked, int | float) or not asked > 0:
        raise RequestError(422, f"{LATENCY_BUDGET_FIELD}: a number of milliseconds above 0 (got {asked!r})")
    return float(asked)


def last_user_message(messages: list[Any]) -> str | None:
    users = [_text(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users else None


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


async def _sse_events(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """An event stream's events as they arrive, each with its lines and the blank line ending it."""
    event = b""
    async for line in content:
        event += line
        if not line.strip():
            if event.strip():
                yield event
            event = b""
    if event.strip():
        yield event


def _sse_data(event: bytes) -> str | None:
    """The data of an event (its ``data:`` lines joined), ``None`` without any."""
    lines = [line[5:].strip() for line in event.decode("utf-8").splitlines() if line.startswith("data:")]
    return "\n".join(lines) if lines else None


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()
