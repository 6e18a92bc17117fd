"""RAG turns read from OpenTelemetry trace exports: OTLP/JSON (or protobuf) files in, one input item per trace out.

A file holds one ``ExportTraceServiceRequest`` in the OTLP/JSON encoding (``resourceSpans[].scopeSpans[]
.spans[]``), or several, one per line (what the OpenTelemetry Collector's file exporter writes), or the
same in protobuf (:mod:`rt4chart.records.otlp_protobuf`, read into this shape); a page of
Phoenix's ``spans/otlpv1`` REST answer (``{"data": [spans]}``) is read as one such request. Spans are
grouped by ``traceId``; every trace becomes one :class:`~rt4chart.records.io.InputLine` (under the
mapping's ``turns = "each"``, one per turn of a chat session it recorded), in the order its first span
appears in the file, items numbered from 1: a :class:`~rt4chart.types.Sample` when the trace (turn) holds
documents and an answer, else the reason it does not (its record then names the trace). Nothing is
dropped.

Where a trace keeps the turn is a :class:`TraceMapping`; its defaults follow OpenInference
(``openinference.span.kind``: ``RETRIEVER`` spans' ``retrieval.documents.N.document.content`` / ``.id``
are the context, in span start order; the last ``LLM`` span to end holds the answer,
``llm.output_messages.0.message.content``; the question is a ``CHAIN`` / ``AGENT`` root span's
``input.value``, else the LLM span's last user message) and the OpenTelemetry GenAI conventions (a span
with ``gen_ai.operation.name`` ``chat`` / ``text_completion`` / ``generate_content`` is an LLM span; its
answer is ``gen_ai.output.messages``, the older ``gen_ai.completion.0.content`` or a ``gen_ai.choice``
event; its question ``gen_ai.input.messages``, ``gen_ai.prompt.N.*`` or a ``gen_ai.user.message`` event).
A trace of an agent holds tool spans (OpenInference ``TOOL``: ``tool.name``, ``tool_call.id``,
``output.value``; GenAI ``execute_tool``: ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
``gen_ai.tool.call.result``): each result is a document named by its call's id, read as a conversation's
tool result is (:func:`rt4chart.conversations.tool_document`), before the retrieved documents.
A TOML or JSON file of the mapping's fields overrides them for a run (``--trace-mapping``).

Several turns in one trace (``turns = "each"``): a turn is an LLM span with a text output that asked for no
tool call (an agent's tool-calling steps are no turns) and is not inside another LLM span (one call seen by
a framework's and a client's instrumentation); its documents are the retriever and tool spans that started
after the previous turn's answer ended (:func:`turn_windows`), its question the input of the outermost
question-kind span that holds this turn alone, else its LLM span's last user message; its sample id is
``TRACE_ID/SPAN_ID`` of its answer span.
"""

from __future__ import annotations

import base64
import json
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from rt4chart.conversations import tool_document
from rt4chart.records.io import InputLine, line_digest, parse_sample
from rt4chart.types import TraceSource


class TraceError(ValueError):
    """A trace file or mapping file that cannot be read at all (not JSON, not OTLP, a bad mapping)."""


Turns = Literal["last", "each"]
"""How many answers a trace gives: its last one, or each turn of the chat session it recorded."""


class TraceMapping(BaseModel):
    """Which spans and attributes of a trace hold a RAG turn's documents, answer and question."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind_attribute: str = "openinference.span.kind"
    """The span attribute that names a span's kind."""
    retriever_kinds: tuple[str, ...] = ("RETRIEVER",)
    """Span kinds whose documents are the context (every such span of the trace, in start order)."""
    llm_kinds: tuple[str, ...] = ("LLM",)
    """Span kinds whose output may be the answer (the last such span to end is the answer's)."""
    question_kinds: tuple[str, ...] = ("CHAIN", "AGENT")
    """Kinds of a root span whose input is the user's question (before the LLM span's user message)."""
    documents: str = "retrieval.documents"
    """Prefix of the documents' attributes: ``<documents>.<N>.<document_text>``, N from 0."""
    document_text: str = "document.content"
    """A document's text, under ``<documents>.<N>.``."""
    document_id: str = "document.id"
    """A document's id, under ``<documents>.<N>.`` (a document without one is named by its position)."""
    answer_attributes: tuple[str, ...] = ("llm.output_messages.0.message.content", "output.value")
    """Attributes of the LLM span that may hold the answer, first present wins (``output.value`` only
    when its ``output.mime_type`` is not JSON); the GenAI attributes and events are read after them."""
    question_attributes: tuple[str, ...] = ("input.value",)
    """Attributes of a question-kind root span that may hold the question (not when its mime type is JSON)."""
    input_messages: str = "llm.input_messages"
    """Prefix of the LLM span's input messages (``<input_messages>.<N>.message.role`` / ``.content``): the
    last ``user`` message is the question when no root span gives one."""
    tool_kinds: tuple[str, ...] = ("TOOL",)
    """Span kinds of an agent's tool calls: each one's result is a document (with the GenAI conventions, a
    span whose ``gen_ai.operation.name`` is ``execute_tool`` is one too)."""
    tool_result_attributes: tuple[str, ...] = ("output.value", "gen_ai.tool.call.result")
    """Attributes of a tool span that may hold its result, first present wins."""
    tool_call_id_attributes: tuple[str, ...] = ("tool_call.id", "gen_ai.tool.call.id")
    """Attributes of a tool span that may hold its call's id, the result's document id (else the span id)."""
    tool_name_attributes: tuple[str, ...] = ("tool.name", "gen_ai.tool.name")
    """Attributes of a tool span that may hold the tool's name, the result's document title."""
    genai: bool = True
    """Also read the OpenTelemetry GenAI conventions (``gen_ai.*`` attributes and events)."""
    turns: Turns = "last"
    """``last``: one audited answer per trace, its last LLM output, with every document of the trace.
    ``each``: one per turn of a chat session, each with the documents retrieved for it (:func:`turn_windows`)."""
    tool_call_attributes: tuple[str, ...] = ("llm.output_messages.0.message.tool_calls",
                                             "gen_ai.completion.0.tool_calls")
    """Prefixes of an LLM span's attributes that hold the tool calls it asked for: under ``turns = "each"``
    such a span is an agent's step, not a turn (as is a GenAI span whose output has a ``tool_call`` part)."""


MappingModel = TypeVar("MappingModel", bound=BaseModel)
"""A trace mapping's model (:class:`TraceMapping`, or a Langfuse mapping)."""

GENAI_LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
"""``gen_ai.operation.name`` values of a span that calls a model for text."""

GENAI_TOOL_OPERATION = "execute_tool"
"""``gen_ai.operation.name`` of a span that runs a tool."""


def load_mapping(path: Path | None, kind: type[MappingModel]) -> MappingModel:
    """The mapping of a TOML or JSON file of ``kind``'s fields (:class:`TraceMapping`, or a Langfuse
    mapping); ``None``: the defaults."""
    if path is None:
        return kind()
    try:
        text = path.read_text(encoding="utf-8")
        fields = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        return kind.model_validate(fields)
    except (OSError, UnicodeDecodeError, ValueError) as error:  # JSON, TOML and validation errors are ValueErrors
        reason = _described(error) if isinstance(error, ValidationError) else str(error)
        raise TraceError(f"trace mapping {path}: {reason}") from None


def _described(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, item['loc'])) or 'file'}: {item['msg']}" for item in error.errors())


def any_value(value: Any) -> Any:
    """An OTLP/JSON ``AnyValue`` as plain Python: the one field that is set (a field written as ``null`` is not;
    ``intValue`` is a string in OTLP/JSON: made an int; an undecodable value is ``None``)."""
    if not isinstance(value, Mapping):
        return None
    present = [(kind, content) for kind, content in value.items() if content is not None]
    if not present:
        return None
    kind, content = present[0]
    try:
        match kind:
            case "stringValue" | "boolValue" | "doubleValue":
                return content
            case "intValue":
                return int(content)
            case "arrayValue":
                return [any_value(item) for item in content.get("values") or []]
            case "kvlistValue":
                return attributes_of(content.get("values"))
            case "bytesValue":
                return base64.b64decode(content)
    except (AttributeError, TypeError, ValueError):  # binascii.Error is a ValueError
        return None
    return None


def attributes_of(pairs: Any) -> dict[str, Any]:
    """OTLP/JSON ``KeyValue`` pairs as a dict (a pair without a string key is no attribute)."""
    if not isinstance(pairs, list):
        return {}
    return {
        pair["key"]: any_value(pair.get("value"))
        for pair in pairs
        if isinstance(pair, Mapping) and isinstance(pair.get("key"), str)
    }


@dataclass(frozen=True)
class Span:
    """The parts of one OTLP span that a RAG turn is read from."""

    span_id: str
    parent_id: str | None
    name: str
    start: int
    end: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """``(name, attributes)`` of each span event, in order."""

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Span:
        events = [(str(e.get("name", "")), attributes_of(e.get("attributes"))) for e in raw.get("events") or []
                  if isinstance(e, Mapping)]
        return cls(
            span_id=str(raw["spanId"]), parent_id=str(raw.get("parentSpanId") or "") or None,
            name=str(raw.get("name", "")),
            start=_nanos(raw.get("startTimeUnixNano")), end=_nanos(raw.get("endTimeUnixNano")),
            attributes=attributes_of(raw.get("attributes")), events=events,
        )


def _nanos(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def json_documents(path: Path) -> list[Any]:
    """The JSON documents of a trace export file: one document, or one per line (the OTLP export
    requests of a Collector's file, a Langfuse export's pages); :class:`TraceError` naming the line
    that is not JSON."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(f"cannot read the trace file {path}: {error}") from None
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    except RecursionError:
        raise TraceError(f"{path}: nested too deeply to be a trace export") from None
    requests = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                requests.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise TraceError(f"{path}: line {number} is not valid JSON ({error.msg})") from None
            except RecursionError:
                raise TraceError(f"{path}: line {number} is nested too deeply to be a trace export") from None
    return requests


def _camel_keys(value: Any) -> Any:
    """Field names as OTLP/JSON spells them: protobuf's JSON mapping also accepts the proto's own names
    (``trace_id``, ``string_value``), which some exporters write (Phoenix's ``spans/otlpv1``, protobuf's
    ``preserving_proto_field_name``). Attribute keys are values (``{"key": ...}``), never renamed."""
    if isinstance(value, dict):
        return {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): _camel_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel_keys(item) for item in value]
    return value


def _phoenix_page(request: Any) -> Any:
    """A page of Phoenix's ``GET /v1/projects/{project}/spans/otlpv1`` (``{"data": [spans], "next_cursor"}``)
    as the one export request it stands for; anything else as it is."""
    if isinstance(request, Mapping) and "resourceSpans" not in request and isinstance(request.get("data"), list):
        return {"resourceSpans": [{"scopeSpans": [{"spans": request["data"]}]}]}
    return request


def _objects(parent: Mapping[str, Any], key: str, where: str, problems: list[str]) -> list[Mapping[str, Any]]:
    """The objects of ``parent[key]`` (absent: none); anything else there is a problem, never skipped."""
    children = parent.get(key) or []
    if not isinstance(children, list):
        problems.append(f"{where}: {key} is not a list")
        return []
    for position, child in enumerate(children, start=1):
        if not isinstance(child, Mapping):
            problems.append(f"{where}: {key} {position} is not an object")
    return [child for child in children if isinstance(child, Mapping)]


def export_requests(path: Path) -> list[Any]:
    """The export requests of an OTLP file as OTLP/JSON objects: a protobuf export decoded
    (:mod:`rt4chart.records.otlp_protobuf`), else its JSON documents; :class:`TraceError` when it is neither."""
    from rt4chart.records.otlp_protobuf import ProtobufUnavailable, is_protobuf, protobuf_requests

    try:
        data = path.read_bytes()
    except OSError as error:
        raise TraceError(f"cannot read the trace file {path}: {error}") from None
    if not is_protobuf(path, data):
        return json_documents(path)
    try:
        return protobuf_requests(data, str(path))
    except (ValueError, ProtobufUnavailable) as error:
        raise TraceError(str(error)) from None


def read_spans(path: Path) -> tuple[dict[str, list[Span]], list[str]]:
    """The file's spans by trace id (in order of appearance), and the problems of what holds no usable
    span (a span that names no trace or no span id, an entry that is not an object): each becomes an error
    item, never dropped."""
    return spans_of_requests(export_requests(path), str(path))


def spans_of_requests(requests: list[Any], source: str) -> tuple[dict[str, list[Span]], list[str]]:
    """:func:`read_spans` of export requests already parsed (``source`` names them in the refusal)."""
    traces: dict[str, list[Span]] = {}
    problems: list[str] = []
    try:
        requests = [_phoenix_page(_camel_keys(request)) for request in requests]
    except RecursionError:
        raise TraceError(f"{source}: nested too deeply to be a trace export") from None
    if not requests or not all(isinstance(r, Mapping) and isinstance(r.get("resourceSpans"), list) for r in requests):
        raise TraceError(f"{source} is not an OTLP/JSON trace export (an object with resourceSpans)")
    for request_number, request in enumerate(requests, start=1):
        where = f"export {request_number}"
        for resource in _objects(request, "resourceSpans", where, problems):
            for scope in _objects(resource, "scopeSpans", where, problems):
                for raw in _objects(scope, "spans", where, problems):
                    trace_id, span_id = raw.get("traceId"), raw.get("spanId")
                    if not (isinstance(trace_id, str) and trace_id and isinstance(span_id, str) and span_id):
                        problems.append(f"{where}: span {raw.get('name')!r} has no traceId or no spanId")
                        continue
                    traces.setdefault(trace_id, []).append(Span.of(raw))
    return traces, problems


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _plain(span: Span, key: str) -> str | None:
    """A text attribute, unless its OpenInference mime type says it is JSON (a request body, not a text)."""
    mime = span.attributes.get(key.removesuffix(".value") + ".mime_type") if key.endswith(".value") else None
    return None if mime == "application/json" else _text(span.attributes.get(key))


def _indexed(attributes: Mapping[str, Any], prefix: str) -> dict[int, dict[str, Any]]:
    """``<prefix>.<N>.<rest>`` attributes as ``{N: {rest: value}}`` (flattened OpenInference lists)."""
    items: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        index, _, rest = key.removeprefix(prefix + ".").partition(".") if key.startswith(prefix + ".") else ("", "", "")
        if index.isdigit() and rest:
            items.setdefault(int(index), {})[rest] = value
    return dict(sorted(items.items()))


def _genai_messages(value: Any) -> list[dict[str, Any]]:
    """``gen_ai.input.messages`` / ``gen_ai.output.messages``: structured, or a JSON string on spans."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return []
    return [m for m in value if isinstance(m, dict)] if isinstance(value, list) else []


def _genai_text(message: Mapping[str, Any]) -> str | None:
    parts = message.get("parts")
    if isinstance(parts, list):
        return _text("".join(p["content"] for p in parts
                             if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("content"), str)))
    return _text(message.get("content"))


class _Turn:
    """One trace read under a mapping."""

    def __init__(self, spans: list[Span], mapping: TraceMapping) -> None:
        self.spans = sorted(spans, key=lambda s: s.start)
        self.mapping = mapping
        ids = {s.span_id for s in spans}
        roots = [s for s in self.spans if s.parent_id is None or s.parent_id not in ids]
        self.root = roots[0] if len(roots) == 1 else None

    def kind(self, span: Span) -> str | None:
        kind = span.attributes.get(self.mapping.kind_attribute)
        return kind.upper() if isinstance(kind, str) else None

    def retrievers(self) -> list[Span]:
        kinds = {k.upper() for k in self.mapping.retriever_kinds}
        return [s for s in self.spans if self.kind(s) in kinds]

    def documents(self, retrievers: list[Span]) -> list[dict[str, Any]]:
        documents = []
        for span in retrievers:
            for fields in _indexed(span.attributes, self.mapping.documents).values():
                text = fields.get(self.mapping.document_text)
                if isinstance(text, str) and text.strip():
                    document_id = fields.get(self.mapping.document_id)
                    documents.append({"id": None if document_id is None else str(document_id), "text": text})
        return documents

    def tools(self) -> list[Span]:
        kinds = {k.upper() for k in self.mapping.tool_kinds}
        return [s for s in self.spans if self.kind(s) in kinds or (
            self.mapping.genai and s.attributes.get("gen_ai.operation.name") == GENAI_TOOL_OPERATION)]

    def tool_results(self, tools: list[Span]) -> list[tuple[Span, dict[str, Any]]]:
        """Each tool span that has a result, with its result as a document (as a conversation's tool
        message is one: JSON results become structured documents, so evidence names the JSON path or cell)."""
        results = []
        for span in tools:
            result = next((text for key in self.mapping.tool_result_attributes
                           if (text := _text(span.attributes.get(key)))), None)
            if result is None:
                continue
            call = next((str(value) for key in self.mapping.tool_call_id_attributes
                         if (value := span.attributes.get(key)) is not None), span.span_id)
            name = next((value for key in self.mapping.tool_name_attributes
                         if isinstance(value := span.attributes.get(key), str)), None)
            results.append((span, tool_document(call, name, result)))
        return results

    def is_llm(self, span: Span) -> bool:
        if self.kind(span) in {k.upper() for k in self.mapping.llm_kinds}:
            return True
        return self.mapping.genai and span.attributes.get("gen_ai.operation.name") in GENAI_LLM_OPERATIONS

    def answer_of(self, span: Span) -> str | None:
        for key in self.mapping.answer_attributes:
            if answer := _plain(span, key):
                return answer
        if not self.mapping.genai:
            return None
        for message in _genai_messages(span.attributes.get("gen_ai.output.messages"))[:1]:
            if answer := _genai_text(message):
                return answer
        if answer := _text(span.attributes.get("gen_ai.completion.0.content")):
            return answer
        for name, attributes in span.events:
            if name == "gen_ai.choice" and (answer := _choice_text(attributes)):
                return answer
        return None

    def answer(self) -> tuple[Span | None, str | None]:
        """The last LLM span to end with an answer; else the last LLM span (to name it in the error)."""
        llms = sorted((s for s in self.spans if self.is_llm(s)), key=lambda s: s.end)
        for span in reversed(llms):
            if answer := self.answer_of(span):
                return span, answer
        return (llms[-1] if llms else None), None

    def question(self, llm: Span | None, owners: list[Span]) -> tuple[Span | None, str | None]:
        """The input of the first of ``owners`` (spans holding this turn alone, outermost first) that is
        of a question kind, else the LLM span's last user message."""
        for owner in owners:
            if self.kind(owner) in {k.upper() for k in self.mapping.question_kinds}:
                for key in self.mapping.question_attributes:
                    if question := _plain(owner, key):
                        return owner, question
        if llm is None:
            return None, None
        messages = _indexed(llm.attributes, self.mapping.input_messages).values()
        users = [m.get("message.content") for m in messages if m.get("message.role") == "user"]
        if self.mapping.genai:
            users += [_genai_text(m) for m in _genai_messages(llm.attributes.get("gen_ai.input.messages"))
                      if m.get("role") == "user"]
            prompts = _indexed(llm.attributes, "gen_ai.prompt").values()
            users += [m.get("content") for m in prompts if m.get("role") == "user"]
            users += [a.get("content") for name, a in llm.events if name == "gen_ai.user.message"]
        questions = [q for q in users if _text(q)]
        return (llm, questions[-1]) if questions else (None, None)

    def asks_for_tools(self, span: Span) -> bool:
        """Whether an LLM span's output asked for tool calls (an agent's step, not an answer to the user)."""
        prefixes = tuple(prefix + "." for prefix in self.mapping.tool_call_attributes)
        if any(key.startswith(prefixes) for key in span.attributes):
            return True
        return self.mapping.genai and any(
            isinstance(part, dict) and part.get("type") == "tool_call"
            for message in _genai_messages(span.attributes.get("gen_ai.output.messages"))
            for part in message.get("parts") or [])

    def turns(self) -> list[tuple[Span, str]]:
        """Each turn's answer span and answer, in the order they ended: an LLM span with an output that asked
        for no tool, not inside another LLM span (one call seen by a framework's and a client's instrumentation)."""
        llms = [s for s in self.spans if self.is_llm(s)]
        parents = {s.span_id: s.parent_id for s in self.spans}
        outer = set(outermost([s.span_id for s in llms], parents))
        answered = [(span, answer) for span in llms if span.span_id in outer and not self.asks_for_tools(span)
                    and (answer := self.answer_of(span))]
        return sorted(answered, key=lambda pair: pair[0].end)


def _choice_text(attributes: Mapping[str, Any]) -> str | None:
    message = attributes.get("message")
    if isinstance(message, Mapping):
        return _text(message.get("content"))
    return _text(attributes.get("message.content"))


def trace_items(trace_id: str, spans: list[Span], first: int, mapping: TraceMapping) -> list[InputLine]:
    """One trace as input items numbered from ``first``: under ``turns = "last"`` one, its sample or why it
    has none; under ``"each"`` one per turn (:func:`turn_windows`), or one saying why it has no turn."""
    turn = _Turn(spans, mapping)
    retrievers, tools = turn.retrievers(), turn.tools()
    looked_for = TurnParts(
        documents=f"no {'/'.join(mapping.retriever_kinds)} span with {mapping.documents}.N.{mapping.document_text}, "
        f"no {'/'.join(mapping.tool_kinds)} span with a result",
        answer=f"no {'/'.join(mapping.llm_kinds)} span with an output",
    )

    def item(number: int, answer_span: Span | None, answer: str | None, owners: list[Span],
             turn_retrievers: list[Span], turn_tools: list[Span], sample_id: str | None) -> InputLine:
        question_span, question = turn.question(answer_span, owners)
        tool_results = turn.tool_results(turn_tools)
        source = TraceSource(
            trace_id=trace_id, root_span_id=turn.root.span_id if turn.root else None,
            answer_span_id=answer_span.span_id if answer_span else None,
            question_span_id=question_span.span_id if question_span else None,
            retriever_span_ids=[s.span_id for s in turn_retrievers],
            tool_span_ids=[span.span_id for span, _ in tool_results],
        )
        tool_documents = [document for _, document in tool_results]
        return turn_item(number, source, turn.documents(turn_retrievers), tool_documents, question, answer, looked_for,
                         sample_id)

    turns = turn.turns() if mapping.turns == "each" else []
    if not turns:  # "last", or a trace with no turn: one item
        answer_span, answer = turn.answer()
        if mapping.turns == "each":  # its outputs all asked for tools: no answer to the user
            answer = None
        return [item(first, answer_span, answer, [turn.root] if turn.root else [], retrievers, tools, None)]
    parents = {s.span_id: s.parent_id for s in turn.spans}
    by_id = {s.span_id: s for s in turn.spans}
    answer_spans = [span for span, _ in turns]
    owned = own_ancestors([span.span_id for span in answer_spans], parents)
    start, end = (lambda s: s.start), (lambda s: s.end)
    return [
        item(first + n, span, answer, [by_id[i] for i in owners], found, called, f"{trace_id}/{span.span_id}")
        for n, ((span, answer), owners, found, called) in enumerate(zip(
            turns, owned, turn_windows(answer_spans, retrievers, start, end),
            turn_windows(answer_spans, tools, start, end), strict=True))
    ]


Step = TypeVar("Step")
"""A span of an OTLP trace, or an observation of a Langfuse trace."""

Part = TypeVar("Part")
"""A retriever or tool span (observation)."""

Instant = TypeVar("Instant", int, str)
"""When a span starts or ends: Unix nanoseconds (OTLP), an ISO 8601 time (Langfuse)."""


def turn_windows(answers: list[Step], parts: list[Part], start: Callable[[Step | Part], Instant],
                 end: Callable[[Step], Instant]) -> list[list[Part]]:
    """Each turn's share of ``parts`` (``answers``: the turns' answer spans in the order they ended): the
    retriever or tool spans that started after the previous turn's answer ended and no later than this
    turn's answer started. Time, not nesting: OpenInference's LangChain and LlamaIndex instrumentations
    nest a turn's retriever under a different chain than its LLM call, but run them in this order."""
    windows = []
    previous_end: Instant | None = None
    for answer in answers:
        ceiling = start(answer)
        windows.append([part for part in parts
                        if (previous_end is None or start(part) >= previous_end) and start(part) <= ceiling])
        previous_end = end(answer)
    return windows


def ancestors(span_id: str, parents: Mapping[str, str | None]) -> list[str]:
    """The ids of a span's ancestors in its trace, nearest first (a parent not in the trace ends the chain)."""
    chain: list[str] = []
    parent = parents.get(span_id)
    while parent is not None and parent in parents and parent not in chain and parent != span_id:
        chain.append(parent)
        parent = parents.get(parent)
    return chain


def outermost(span_ids: list[str], parents: Mapping[str, str | None]) -> list[str]:
    """Those of ``span_ids`` that have none of them as an ancestor."""
    chosen = set(span_ids)
    return [span_id for span_id in span_ids if not chosen.intersection(ancestors(span_id, parents))]


def own_ancestors(answer_ids: list[str], parents: Mapping[str, str | None]) -> list[list[str]]:
    """For each turn's answer span, its ancestors that hold no other turn's answer, outermost first: the
    turn's own chain or agent span, whose input is that turn's question (a session's root holds them all)."""
    chains = [ancestors(answer_id, parents) for answer_id in answer_ids]
    owned = []
    for position, chain in enumerate(chains):
        shared = {span_id for other, c in enumerate(chains) if other != position for span_id in c}
        owned.append([span_id for span_id in reversed(chain) if span_id not in shared])
    return owned


class TurnParts(NamedTuple):
    """What a trace reader looked for, said when a turn lacks it: its documents, its answer."""

    documents: str
    answer: str


def turn_item(number: int, source: TraceSource, retrieved: list[dict[str, Any]], tool_results: list[dict[str, Any]],
              question: str | None, answer: str | None, looked_for: TurnParts,
              sample_id: str | None = None) -> InputLine:
    """A trace's turn as one input item (``number``: its position), its sample checked as an input line's:
    the retrieved documents (``{"id" | None, "text"}``) are the context's named passages; a trace of an
    agent has its tool results (documents) first, then the retrieved documents, one without an id named
    by its position among them (as a named passage is). A turn without documents (retrieved or from
    tools) or without an answer is an error item saying what was ``looked_for``. The sample's id is
    ``sample_id`` (a turn of several: trace id / answer span id), else the trace's id."""
    trace_id = source.trace_id
    sample_id = sample_id or trace_id
    named = f"trace {trace_id}" if sample_id == trace_id else f"trace {trace_id}, answer span {source.answer_span_id}"
    missing = [f"no {what} ({hint})" for what, hint, absent in (
        ("retrieved documents", looked_for.documents, not retrieved and not tool_results),
        ("answer", looked_for.answer, answer is None),
    ) if absent]
    if missing or answer is None:
        return InputLine(number, None, f"{named}: {'; '.join(missing)}", raw_id=sample_id, trace=source)
    context: dict[str, Any] = {"context": retrieved}
    if tool_results:
        named_documents = [{"id": d["id"] or str(position), "text": d["text"]}
                           for position, d in enumerate(retrieved, 1)]
        context = {"documents": [*tool_results, *named_documents]}
    record = {"id": sample_id, **context, "question": question, "answer": answer,
              "trace": source.model_dump(mode="json")}
    item = parse_sample(record, number)
    if item.sample is None:  # e.g. two documents with one id: the sample's own checks, named by trace
        problem = (item.error or "invalid sample").removeprefix(f"line {number}: ")
        return InputLine(number, None, f"{named}: {problem}", raw_id=sample_id, trace=source)
    return InputLine(number, item.sample, digest=line_digest(json.dumps(record, sort_keys=True)), raw_id=sample_id)


def numbered(traces: Iterable[tuple[str, list[Span]]], problems: list[str], mapping: TraceMapping) -> list[InputLine]:
    """The items of ``traces`` (each trace's turns consecutive), then one error item per problem, numbered
    from 1 in that order: a record's ``line`` is its item's position."""
    items: list[InputLine] = []
    for trace_id, spans in traces:
        items += trace_items(trace_id, spans, len(items) + 1, mapping)
    return items + [InputLine(number, None, problem) for number, problem in enumerate(problems, start=len(items) + 1)]


def read_otlp_traces(path: Path, mapping: TraceMapping | None = None) -> Iterator[InputLine]:
    """The input items of an OTLP/JSON file's traces, in order of appearance (one per trace, or one per
    turn under ``turns = "each"``), then one error item per span that names no trace (see the module's
    docstring); :class:`TraceError` when the file is not an OTLP/JSON trace export at all."""
    traces, problems = read_spans(path)
    yield from numbered(traces.items(), problems, mapping or TraceMapping())
