"""The published JSON Schema of an input line (schemas/input-line.schema.json): generated from the model
(rt4chart/records/schema.py) and kept in step with it, valid draft 2020-12, accepting every input-line
example of the README's Input shapes and the shipped examples, refusing lines ``rt4 verify`` refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from test_conversations import CONVERSATION

from rt4chart.records.io import parse_sample
from rt4chart.records.schema import input_line_schema

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "schemas" / "input-line.schema.json"


def validator() -> Draft202012Validator:
    schema = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def readme_examples() -> list[dict[str, Any]]:
    """The JSON blocks of the README's Input shapes section."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Input shapes"):]
    section = section[:section.index("\n## ")]
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, flags=re.DOTALL)]


def test_the_published_schema_is_the_generated_one() -> None:
    assert json.loads(PUBLISHED.read_text(encoding="utf-8")) == input_line_schema()


def test_the_readme_s_and_the_shipped_examples_are_valid_input_lines() -> None:
    examples = readme_examples()
    assert len(examples) >= 3  # documents, structured documents, a conversation
    shipped = [json.loads(line) for line in (ROOT / "examples" / "answers.jsonl").read_text().splitlines()]
    for line in [*examples, *shipped, CONVERSATION, {"context": [{"id": 7, "text": "x"}], "answer": "y"}]:
        assert parse_sample(line, 1).sample is not None
        assert not list(validator().iter_errors(line)), line


@pytest.mark.parametrize("line", [
    pytest.param({"context": "c", "documents": [{"id": "a", "text": "x"}], "answer": "y"}, id="context-and-documents"),
    pytest.param({**CONVERSATION, "answer": "y"}, id="messages-and-answer"),
    pytest.param({"documents": [{"id": "a", "text": "x", "data": {"k": 1}}], "answer": "y"}, id="two-bodies"),
    pytest.param({"documents": [{"text": "x"}], "answer": "y"}, id="document-without-id"),
    pytest.param({"context": "c"}, id="no-answer"),
    pytest.param({"messages": [{"role": "robot", "content": "x"}]}, id="unknown-role"),
])
def test_lines_rt4_verify_refuses_are_refused_by_the_schema(line: dict[str, Any]) -> None:
    assert parse_sample(line, 1).sample is None
    assert list(validator().iter_errors(line))
