"""The JSON Schema of an ``rt4 verify`` input line (published as schemas/input-line.schema.json).

Generated from :class:`~rt4chart.types.Sample` and corrected where the model's own schema does not say what
an input line is: the model requires ``context`` and ``answer``, which a line may give as ``documents`` or
``messages`` instead (exactly one of the three shapes); its ``earlier_turns`` is derived, never given; a
passage or a document may be named by an integer id; a document has exactly one of ``text``, ``data``,
``table``. Checks the schema cannot express (unique ids, a Markdown table's rows, a tool result that
answers a tool call) stay with the model's validation, whose messages ``rt4 verify`` writes.
"""

from __future__ import annotations

from typing import Any

from rt4chart.types import Sample

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_ID: dict[str, Any] = {"anyOf": [{"type": "string"}, {"type": "integer"}]}


def _only(shape: list[str], excluded: list[str]) -> dict[str, Any]:
    return {"required": shape, "not": {"anyOf": [{"required": [key]} for key in excluded]}}


def input_line_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one input line."""
    schema = Sample.model_json_schema()
    properties = schema["properties"]
    del properties["earlier_turns"]
    properties["id"] = {**_ID, "title": "Id"}
    named_passage = {"type": "object", "properties": {"id": _ID, "text": {"type": "string"}}, "required": ["text"]}
    properties["context"]["anyOf"][1]["items"] = {"anyOf": [{"type": "string"}, named_passage]}
    document = schema["$defs"]["Document"]
    document["properties"]["id"] = {**_ID, "title": "Id"}
    document["oneOf"] = [{"required": [body]} for body in ("text", "data", "table")]
    schema["required"] = []
    schema["oneOf"] = [
        _only(["context", "answer"], ["documents", "messages"]),
        _only(["documents", "answer"], ["context", "messages"]),
        _only(["messages"], ["context", "answer", "question"]),
    ]
    return {"$schema": SCHEMA_DIALECT, **schema, "title": "rt4chart input line"}
