"""RAG turns read from Langfuse trace exports: its public API's JSON in, one input item per trace out.

A file holds traces as ``GET /api/public/traces/{traceId}`` returns them (a trace with its
``observations`` as objects): one trace, a list of them, a page ``{"data": [traces]}``, or one trace per
line. Every trace becomes one :class:`~rt4chart.records.io.InputLine` (under ``turns = "each"``, one per
turn), in file order: a :class:`~rt4chart.types.Sample` when the trace holds documents and an answer, else
the reason it does not (its record then names the trace). Nothing is dropped.

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

Under ``turns = "each"`` a turn is a generation whose output is text and asks for no tool call, not inside
another generation; its documents are the retriever and tool observations started after the previous turn's
generation ended, its question the trace's input when the trace holds one turn, else the input of the
outermost observation holding this turn alone, else the generation's last user message; its id
``TRACE_ID/OBSERVATION_ID``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rt4chart.conversations import tool_document
from rt4chart.records.io import InputLine
from rt4chart.records.traces import (
    TraceError,
    TurnParts,
    Turns,
    json_documents,
    outermost,
    own_ancestors,
    turn_item,
    turn_windows,
)
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
    turns: Turns = "last"
    """``last``: one audited answer per trace, its last generation's, with every document of the trace.
    ``each``: one per turn (a generation whose output is text and asks for no tool), each with the retriever
    and tool observations started since the previous turn's generation ended
    (:func:`~rt4chart.records.traces.turn_windows`)."""


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

    def generations(self) -> list[Mapping[str, Any]]:
        types = {t.upper() for t in self.mapping.answer_types}
        return sorted((o for o in self.observations if str(o.get("type") or "").upper() in types), key=_end)

    def answer(self) -> tuple[Mapping[str, Any] | None, str | None]:
        generations = self.generations()
        for observation in reversed(generations):
            if answer := message_text(observation.get("output"), "assistant"):
                return observation, answer
        return (generations[-1] if generations else None), None

    def turns(self) -> list[tuple[Mapping[str, Any], str]]:
        """Each turn's generation and answer, in the order they ended: a generation whose output is text and
        asks for no tool call, not inside another generation."""
        generations = self.generations()
        parents = _parents(self.observations)
        outer = set(outermost([str(o.get("id")) for o in generations], parents))
        return [(o, answer) for o in generations if str(o.get("id")) in outer and not _asks_for_tools(o.get("output"))
                and (answer := message_text(o.get("output"), "assistant"))]

    def question(self, generation: Mapping[str, Any] | None, owners: list[Mapping[str, Any]],
                 trace_input: bool) -> tuple[str | None, str | None]:
        """The question and the observation it came from (``None``: the trace's own input): the trace's
        input when ``trace_input``, else that of the first of ``owners`` (observations holding this turn
        alone, outermost first) that gives one, else the generation's last user message."""
        inputs = ([(None, self.trace.get("input"))] if trace_input else []) + \
            [(str(o.get("id")), o.get("input")) for o in owners]
        for origin, given in inputs:
            if isinstance(given, Mapping) and not {"messages", "role", "choices"} & given.keys():
                given = next((given[k] for k in self.mapping.question_keys if _text(given.get(k))), None)
            if question := message_text(given, "user"):
                return origin, question
        if generation is not None and (question := message_text(generation.get("input"), "user")):
            return str(generation.get("id")), question
        return None, None


def _end(observation: Mapping[str, Any]) -> str:
    return str(observation.get("endTime") or observation.get("startTime") or "")


def _start(observation: Mapping[str, Any]) -> str:
    return str(observation.get("startTime") or "")


def _parents(observations: list[Mapping[str, Any]]) -> dict[str, str | None]:
    return {str(o.get("id")): None if o.get("parentObservationId") is None else str(o["parentObservationId"])
            for o in observations}


def _asks_for_tools(output: Any) -> bool:
    """Whether a generation's output asked for tool calls (an agent's step): a message with ``tool_calls``,
    an OpenAI completion whose first choice has them, or a list of messages whose last one has them."""
    if isinstance(output, Mapping):
        if isinstance(output.get("choices"), list) and output["choices"]:
            return _asks_for_tools(output["choices"][0].get("message") if isinstance(output["choices"][0], Mapping)
                                   else None)
        return bool(output.get("tool_calls"))
    if isinstance(output, list) and output:
        return _asks_for_tools(output[-1])
    return False


def langfuse_items(trace: Any, first: int, mapping: LangfuseMapping) -> list[InputLine]:
    """One Langfuse trace as input items numbered from ``first``: under ``turns = "last"`` one, its sample or
    why it has none; under ``"each"`` one per turn, or one saying why it has no turn."""
    if not isinstance(trace, Mapping) or not _text(trace.get("id")):
        return [InputLine(first, None, f"trace {first}: not a Langfuse trace (an object with an id)")]
    trace_id = str(trace["id"])
    if any(not isinstance(o, Mapping) for o in trace.get("observations") or []):
        return [InputLine(first, None, f"trace {trace_id}: its observations are ids, not objects (export each "
                          "trace with GET /api/public/traces/{traceId})", raw_id=trace_id)]
    turn = _Turn(trace, mapping)
    retrievers = turn.retrievers()
    tool_results = turn.tool_results()
    looked_for = TurnParts(
        documents=f"no {'/'.join(mapping.retriever_types)} observation or retriever SPAN with documents in its "
        f"output, no {'/'.join(mapping.tool_types)} observation with an output",
        answer=f"no {'/'.join(mapping.answer_types)} with an output",
    )

    def item(number: int, generation: Mapping[str, Any] | None, answer: str | None, owners: list[Mapping[str, Any]],
             turn_retrievers: list[Mapping[str, Any]], results: list[tuple[Mapping[str, Any], dict[str, Any]]],
             sample_id: str | None, trace_input: bool) -> InputLine:
        question_from, question = turn.question(generation, owners, trace_input)
        source = TraceSource(
            trace_id=trace_id, answer_span_id=None if generation is None else str(generation.get("id")),
            question_span_id=question_from, retriever_span_ids=[str(o.get("id")) for o in turn_retrievers],
            tool_span_ids=[str(o.get("id")) for o, _ in results],
        )
        return turn_item(number, source, turn.documents(turn_retrievers), [document for _, document in results],
                         question, answer, looked_for, sample_id)

    turns = turn.turns() if mapping.turns == "each" else []
    if not turns:  # "last", or a trace with no turn: one item
        generation, answer = turn.answer()
        if mapping.turns == "each":  # its outputs all asked for tools: no answer to the user
            answer = None
        return [item(first, generation, answer, [], retrievers, tool_results, None, trace_input=True)]
    generations = [generation for generation, _ in turns]
    by_id = {str(o.get("id")): o for o in turn.observations}
    owned = own_ancestors([str(g.get("id")) for g in generations], _parents(turn.observations))
    tools = [observation for observation, _ in tool_results]
    documents = {id(observation): document for observation, document in tool_results}
    return [  # the trace's input is the question of its only turn, a session's first at most
        item(first + n, generation, answer, [by_id[i] for i in owners], found, [(o, documents[id(o)]) for o in called],
             f"{trace_id}/{generation.get('id')}", trace_input=len(turns) == 1)
        for n, ((generation, answer), owners, found, called) in enumerate(zip(
            turns, owned, turn_windows(generations, retrievers, _start, _end),
            turn_windows(generations, tools, _start, _end), strict=True))
    ]


def read_langfuse_traces(path: Path, mapping: LangfuseMapping | None = None) -> Iterator[InputLine]:
    """The input items of a Langfuse export's traces, in file order (one per trace, or one per turn under
    ``turns = "each"``; see the module's docstring); :class:`TraceError` when the file is no such export."""
    mapping = mapping or LangfuseMapping()
    items: list[InputLine] = []
    for trace in read_traces_file(path):
        items += langfuse_items(trace, len(items) + 1, mapping)
    yield from items
