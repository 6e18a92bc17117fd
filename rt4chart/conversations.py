"""Conversations as input: an agent's OpenAI-style ``messages`` turned into the answer to audit and the
documents it may be checked against.

- The audited answer is the last assistant message (its text; an assistant message that only calls
  tools is not an answer), or the one ``answer_message`` names (0-based; one line per assistant turn
  audits every turn); the question is the last user message before it. Later messages play no part.
- Every tool result is a document named by its ``tool_call_id`` (titled with the function the
  assistant called); a result that is a JSON list of flat objects (an SQL query's rows) is a table,
  any other JSON object or list a structured value, so evidence names the cell or the JSON path
  (:mod:`rt4chart.documents`).
- System messages and, by default, the user's messages are documents named ``message-N`` (N the
  message's 0-based index): what the operator and the user stated may ground a claim (a user's order
  number, a date they gave). With ``"user_statements": "ignore"`` the user's messages are left out.
- The assistant's earlier turns are documents named ``message-N`` too, so a judge can find a claim
  there, but such support never grounds it: a verdict whose evidence lies only in earlier assistant
  turns is settled as baseless and marked (:func:`rt4chart.method.settlement.settle_earlier_turns`).
- Retrieved ``documents`` given beside the messages follow the conversation's documents.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

Role = Literal["system", "user", "assistant", "tool", "developer"]
"""The message roles of OpenAI's chat format (``developer`` is its newer name for ``system``)."""

UserStatements = Literal["evidence", "ignore"]
"""Whether the user's own messages may ground a claim."""


class ToolCall(BaseModel):
    """One tool call of an assistant message, as far as rt4chart reads it."""

    id: str
    """The call's id, which its tool result names as ``tool_call_id``."""
    function: dict[str, JsonValue] = Field(default_factory=dict)
    """``{"name", "arguments"}``: the name titles the result's document."""


class ChatMessage(BaseModel):
    """One message of an OpenAI-style conversation."""

    model_config = ConfigDict(extra="allow")

    role: Role
    """Who speaks."""
    content: str | list[dict[str, JsonValue]] | None = None
    """The text, or a list of content parts (their ``text`` parts are read, joined by line breaks)."""
    tool_calls: list[ToolCall] = Field(default_factory=list, exclude_if=lambda value: not value)
    """The tools an assistant message calls."""
    tool_call_id: str | None = Field(default=None, exclude_if=lambda value: value is None)
    """The call a tool message answers."""

    @model_validator(mode="after")
    def _tool_results_name_their_call(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs its tool_call_id")
        return self

    @property
    def text(self) -> str:
        """The message's text (empty when it has none)."""
        if isinstance(self.content, str):
            return self.content
        parts = [part.get("text") for part in self.content or [] if part.get("type", "text") == "text"]
        return "\n".join(part for part in parts if isinstance(part, str))


def message_document_id(index: int) -> str:
    """The document id of the message at ``index`` (0-based)."""
    return f"message-{index}"


def assistant_turns(messages: list[ChatMessage]) -> list[int]:
    """The 0-based indexes of the assistant messages with text: the answers a conversation can audit (a
    message that only calls tools is none)."""
    return [index for index, message in enumerate(messages) if message.role == "assistant" and message.text.strip()]


def conversation_fields(
    messages: list[ChatMessage], user_statements: UserStatements, answer_message: int | None = None
) -> dict[str, Any]:
    """What a conversation gives a sample: ``answer``, ``question``, its ``documents`` (as input
    dicts, in message order) and the ids of the earlier assistant turns among them. ``answer_message``
    (0-based) picks the assistant message to audit, ``None`` the last one with text; the messages after
    it play no part."""
    answered = assistant_turns(messages)
    if answer_message is not None and answer_message not in answered:
        raise ValueError(f"answer_message: message {answer_message} is not an assistant message with text")
    if not answered:
        raise ValueError("messages: no assistant message with text to audit")
    last = answered[-1] if answer_message is None else answer_message
    tool_names = {call.id: call.function.get("name") for message in messages for call in message.tool_calls}
    documents: list[dict[str, Any]] = []
    earlier_turns: list[str] = []
    for index, message in enumerate(messages[:last]):
        if message.role == "tool":
            call = message.tool_call_id or ""
            if call not in tool_names:
                raise ValueError(f"messages[{index}]: tool_call_id {call!r} answers no assistant tool call")
            documents.append(tool_document(call, tool_names[call], message.text))
        elif message.text.strip() and (message.role != "user" or user_statements == "evidence"):
            documents.append({"id": message_document_id(index), "text": message.text})
            if message.role == "assistant":
                earlier_turns.append(message_document_id(index))
    question = next((m.text for m in reversed(messages[:last]) if m.role == "user" and m.text.strip()), None)
    return {"answer": messages[last].text, "question": question, "documents": documents,
            "earlier_turns": earlier_turns}


def tool_document(call: str, name: JsonValue, content: str) -> dict[str, Any]:
    """A tool's result as a document (an input dict) named ``call`` and titled with the tool's name: a
    JSON list of flat objects is a table, any other JSON object or list a structured value, else text."""
    title = {"title": name} if isinstance(name, str) else {}
    try:
        value = json.loads(content)
    except ValueError:
        value = None
    if isinstance(value, list) and value and all(_flat_record(row) for row in value):
        return {"id": call, "table": value, **title}  # rows of a query: evidence names row and column
    if isinstance(value, (dict, list)) and value:
        return {"id": call, "data": value, **title}
    return {"id": call, "text": content, **title}


def _flat_record(row: Any) -> bool:
    return isinstance(row, dict) and bool(row) and not any(isinstance(value, (dict, list)) for value in row.values())
