"""RAG turns read from Langfuse trace exports: its public API's JSON in, one input item per trace out.

A file holds traces as ``GET /api/public/traces/{traceId}`` returns them (a trace with its
``observations`` as objects): one trace, a list of them, a page ``{"data": [traces]}``, or one trace per
line. Every trace becomes exactly one :class:`~rt4chart.records.io.InputLine`, in file order: a
:class:`~rt4chart.types.Sample` when the trace holds documents and an answer, else the reason it does not
(its record then names the trace). Nothing is dropped.

Where a trace keeps the turn is a :class:`LangfuseMapping`; by default the context is the output of every
retriever observation (type ``RETRIEVER``, or a ``SPAN`` whose name contains ``retriev``), in start order:
a list of documents (strings, or objects with ``page_content`` / ``content`` / ``text`` and an ``id``,
also under ``metadata``), or an object holding that list under ``documents``; the answer is the output of
the last ``GENERATION`` to end (a string, a message's ``content``, an OpenAI completion's first choice);
the question is the trace's ``input`` (a string, an object's ``question`` / ``query`` / ``input``, or the
last user message of a list of messages), else the generation's last user message; an agent's ``TOOL``
observations with an output are tool results, documents named by their call's id, before the retrieved
ones (:func:`rt4chart.records.traces.turn_item`). A TOML or JSON file of the mapping's fields overrides
them for a run (``--trace-mapping``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rt4chart.conversations import tool_document
from rt4chart.records.io import InputLine
from rt4chart.records.traces import TraceError, TurnParts, json_documents, turn_item
from rt4chart.types import TraceSource


class LangfuseMapping(BaseModel):
    """Which observations and fields of a Langfuse trace hold a RAG turn's documents, answer and question."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    retriever_types: tuple[str, ...] = ("RETRIEVER",)
    """Observation types whose output is the context (every such observation, in start order)."""
    retriever_name_contains: tuple[str, ...] = ("retriev",)
    """A ``SPAN`` whose name contains one of these (case-insensitive) is a retriever too."""
    answer_types: tuple[str, ...] = ("GENERATION",)
    """Observation types whose output may be the answer (the last one to end with an output wins)."""
    documents_keys: tuple[str, ...] = ("documents",)
    """Keys under which a retriever's output object holds its list of documents."""
    document_text_keys: tuple[str, ...] = ("page_content", "content", "text")
    """Keys of a document object holding its text, first present wins."""
    document_id_keys: tuple[str, ...] = ("id", "metadata.id", "metadata.source")
    """Keys (dotted: nested) of a document object holding its id (a document without one is named by its
    position)."""
    question_keys: tuple[str, ...] = ("question", "query", "input")
    """Keys of the trace's input object that may hold the question, first present wins."""
    tool_types: tuple[str, ...] = ("TOOL",)
    """Observation types of an agent's tool calls: each one's output is a tool result, a document named by
    its call's id (read as a conversation's tool result is: JSON gives JSON paths and table cells)."""
    tool_call_id_keys: tuple[str, ...] = ("metadata.tool_call_id", "metadata.tool_call.id", "input.tool_call_id")
    """Keys (dotted: nested) of a tool observation holding its call's id, first present wins (else the
    observation's id)."""


def read_traces_file(path: Path) -> list[Any]:
    """The traces of a Langfuse export file (see the module's docstring); :class:`TraceError` when it is
    none."""
    traces: list[Any] = []
    for document in json_documents(path):
        if isinstance(document, Mapping) and isinstance(document.get("data"), list):
            traces.extend(document["data"])
        elif isinstance(document, list):
            traces.extend(document)
        else:
            traces.append(document)
    if not traces or not any(isinstance(t, Mapping) and "observations" in t for t in traces):
        raise TraceError(f"{path} is not a Langfuse trace export (traces with their observations, as "
                         "GET /api/public/traces/{traceId} returns them)")
    return traces


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _dotted(value: Any, key: str) -> Any:
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def message_text(value: Any, role: str) -> str | None:
    """The text a model-call payload holds for ``role``: a string, a message (``{"role", "content"}``), an
    OpenAI completion (``choices[0].message``), or the last ``role`` message of a list (or of ``messages``)."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, Mapping):
        if isinstance(value.get("choices"), list) and value["choices"]:
            return message_text(value["choices"][0].get("message") if isinstance(value["choices"][0], Mapping)
                                else None, role)
        if isinstance(value.get("messages"), list):
            return message_text(value["messages"], role)
        if value.get("role", role) == role:
            content = value.get("content")
            if isinstance(content, list):  # content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
            return _text(content)
        return None
    if isinstance(value, list):
        texts = [message_text(m, role) for m in value if isinstance(m, Mapping) and m.get("role") == role]
        return next((t for t in reversed(texts) if t), None)
    return None


class _Turn:
    """One Langfuse trace read under a mapping."""

    def __init__(self, trace: Mapping[str, Any], mapping: LangfuseMapping) -> None:
        self.trace = trace
        self.mapping = mapping
        observations = [o for o in trace.get("observations") or [] if isinstance(o, Mapping)]
        self.observations = sorted(observations, key=lambda o: str(o.get("startTime") or ""))

    def is_retriever(self, observation: Mapping[str, Any]) -> bool:
        kind = str(observation.get("type") or "").upper()
        if kind in {t.upper() for t in self.mapping.retriever_types}:
            return True
        name = str(observation.get("name") or "").lower()
        return kind == "SPAN" and any(part.lower() in name for part in self.mapping.retriever_name_contains)

    def retrievers(self) -> list[Mapping[str, Any]]:
        return [o for o in self.observations if self.is_retriever(o)]

    def documents(self, retrievers: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        documents = []
        for observation in retrievers:
            output = observation.get("output")
            if isinstance(output, Mapping):
                output = next((output[k] for k in self.mapping.documents_keys if isinstance(output.get(k), list)), None)
            for document in output if isinstance(output, list) else []:
                if text := _text(document):
                    documents.append({"id": None, "text": text})
                elif isinstance(document, Mapping):
                    text = next((t for k in self.mapping.document_text_keys if (t := _text(document.get(k)))), None)
                    ids = (_dotted(document, key) for key in self.mapping.document_id_keys)
                    document_id = next((i for i in ids if i is not None), None)
                    if text:
                        documents.append({"id": None if document_id is None else str(document_id), "text": text})
        return documents

    def tool_results(self) -> list[tuple[Mapping[str, Any], dict[str, Any]]]:
        """Each tool observation with an output, with its output as a document."""
        types = {t.upper() for t in self.mapping.tool_types}
        results = []
        for observation in self.observations:
            output = observation.get("output")
            if str(observation.get("type") or "").upper() not in types or output in (None, "", [], {}):
                continue
            ids = (_dotted(observation, key) for key in self.mapping.tool_call_id_keys)
            call = next((str(i) for i in ids if i is not None), str(observation.get("id")))
            result = output if isinstance(output, str) else json.dumps(output)
            results.append((observation, tool_document(call, _text(observation.get("name")), result)))
        return results

    def answer(self) -> tuple[Mapping[str, Any] | None, str | None]:
        types = {t.upper() for t in self.mapping.answer_types}
        generations = sorted((o for o in self.observations if str(o.get("type") or "").upper() in types),
                             key=lambda o: str(o.get("endTime") or o.get("startTime") or ""))
        for observation in reversed(generations):
            if answer := message_text(observation.get("output"), "assistant"):
                return observation, answer
        return (generations[-1] if generations else None), None

    def question(self, generation: Mapping[str, Any] | None) -> tuple[str | None, str | None]:
        """The question and the observation it came from (``None``: the trace's own input)."""
        given = self.trace.get("input")
        if isinstance(given, Mapping) and not {"messages", "role", "choices"} & given.keys():
            given = next((given[k] for k in self.mapping.question_keys if _text(given.get(k))), None)
        if question := message_text(given, "user"):
            return None, question
        if generation is not None and (question := message_text(generation.get("input"), "user")):
            return str(generation.get("id")), question
        return None, None


def langfuse_item(trace: Any, number: int, mapping: LangfuseMapping) -> InputLine:
    """One Langfuse trace as one input item: its sample, or why it has none (``line`` is its position)."""
    if not isinstance(trace, Mapping) or not _text(trace.get("id")):
        return InputLine(number, None, f"trace {number}: not a Langfuse trace (an object with an id)")
    trace_id = str(trace["id"])
    if any(not isinstance(o, Mapping) for o in trace.get("observations") or []):
        return InputLine(number, None, f"trace {trace_id}: its observations are ids, not objects (export each "
                         "trace with GET /api/public/traces/{traceId})", raw_id=trace_id)
    turn = _Turn(trace, mapping)
    retrievers = turn.retrievers()
    generation, answer = turn.answer()
    question_from, question = turn.question(generation)
    tool_results = turn.tool_results()
    source = TraceSource(
        trace_id=trace_id, answer_span_id=None if generation is None else str(generation.get("id")),
        question_span_id=question_from, retriever_span_ids=[str(o.get("id")) for o in retrievers],
        tool_span_ids=[str(o.get("id")) for o, _ in tool_results],
    )
    looked_for = TurnParts(
        documents=f"no {'/'.join(mapping.retriever_types)} observation or retriever SPAN with documents in its "
        f"output, no {'/'.join(mapping.tool_types)} observation with an output",
        answer=f"no {'/'.join(mapping.answer_types)} with an output",
    )
    tool_documents = [document for _, document in tool_results]
    return turn_item(number, source, turn.documents(retrievers), tool_documents, question, answer, looked_for)


def read_langfuse_traces(path: Path, mapping: LangfuseMapping | None = None) -> Iterator[InputLine]:
    """One input item per trace of a Langfuse export, in file order (see the module's docstring);
    :class:`TraceError` when the file is no such export."""
    mapping = mapping or LangfuseMapping()
    for number, trace in enumerate(read_traces_file(path), start=1):
        yield langfuse_item(trace, number, mapping)
