"""What ``rt4 guard`` reads and writes on the wire: request bodies and their parsing into clear
4xx refusals, the error reply (the OpenAI API's shape), NDJSON lines in and out."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from rt4chart.runs.guard.policy import RequestError
from rt4chart.types import Sample, describe_validation_error

ModelT = TypeVar("ModelT", bound=BaseModel)
NDJSON = "application/x-ndjson"
ABORT_KEY: web.RequestKey[Callable[[int, str], Awaitable[web.StreamResponse]]] = web.RequestKey(
    "rt4chart.abort"
)  # ends a request's stream (status sent already) with an error event


class VerifyRequest(BaseModel):
    """The body of ``POST /v1/verify`` (the first line of a streamed body, without ``answer``): the
    fields of an ``rt4 verify`` input line, read by the same validation (:meth:`sample`), and how to
    answer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    id: str | int | None = None
    """Caller's id, copied to the record as text (default: a fresh one)."""
    context: JsonValue = None
    """The retrieved context: one string or a list of passages (strings or ``{"id", "text"}``)."""
    documents: JsonValue = None
    """Instead of ``context``: documents ``{"id", "text" | "data" | "table", ...}`` (prose, JSON, tables)."""
    messages: JsonValue = None
    """Instead of ``context``, ``question`` and ``answer``: an OpenAI-style conversation to audit."""
    user_statements: JsonValue = None
    """In a conversation: ``evidence`` (default) or ``ignore`` the user's own messages."""
    answer_message: JsonValue = None
    """In a conversation: the 0-based index of the assistant message to audit (default: the last)."""
    question: JsonValue = None
    """The user question, if any."""
    answer: str = ""
    """The answer to audit (required unless the answer streams in or comes from ``messages``)."""
    language: JsonValue = None
    """ISO 639-1 code of the answer (default: detected)."""
    stream: bool = False
    """Stream the verdicts back as NDJSON events."""
    latency_budget_ms: float | None = Field(default=None, gt=0)
    """This request's cascade latency budget (default: the service's ``--latency-budget-ms``)."""

    def sample(self, request_id: str) -> Sample:
        """The request's sample, validated as ``rt4 verify`` validates an input line (a 422 with the same
        message when it is not one)."""
        fields = self.model_dump(exclude={"id", "stream", "latency_budget_ms"}, exclude_unset=True)
        if "messages" not in fields:
            fields.setdefault("answer", "")  # a streamed answer's first line has none yet
        try:
            return Sample.model_validate({**fields, "id": request_id})
        except ValidationError as error:
            raise RequestError(422, describe_validation_error(error)) from None


class Delta(BaseModel):
    """A later line of a streamed body: the next piece of the answer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    delta: str
    """Text appended to the answer."""


def error_response(error: RequestError) -> web.Response:
    """A refused request as JSON, in the OpenAI API's error shape (its SDK shows the message)."""
    body = {"error": {"message": str(error), "type": "rt4chart_guard", "code": error.status}}
    return web.json_response(body, status=error.status, headers=error.headers)


async def answer_deltas(first: str, lines: AsyncIterator[str] | None) -> AsyncIterator[str]:
    """The pieces of a streamed answer: the request's own ``answer``, then each NDJSON delta line."""
    yield first
    if lines is None:
        return
    number = 1
    async for line in lines:
        number += 1
        yield parse_body(Delta, loads_line(line, number)).delta


async def write_event(response: web.StreamResponse, event: dict[str, Any]) -> None:
    await response.write(json.dumps(event, default=str).encode() + b"\n")


async def body_lines(request: web.Request, max_bytes: int) -> AsyncIterator[str]:
    """The non-blank lines of a streamed body as they arrive, refusing a body over ``max_bytes``."""
    read = 0
    async for raw in request.content:
        read += len(raw)
        if read > max_bytes:
            raise RequestError(413, f"request body over {max_bytes} bytes (--max-body-bytes)")
        if raw.strip():
            yield raw.decode("utf-8")


async def read_json(request: web.Request) -> Any:
    try:
        return await request.json()
    except json.JSONDecodeError as error:
        raise RequestError(400, f"the body is not JSON: {error}") from None


def loads_line(line: str, number: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise RequestError(400, f"NDJSON line {number} is not JSON: {error}") from None


def parse_body(model: type[ModelT], data: Any) -> ModelT:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in error.errors())
        raise RequestError(422, problems) from None
