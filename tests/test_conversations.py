"""Conversations as input (rt4chart.conversations): hand-made agent traces in OpenAI's chat format through
the real ``rt4 verify`` with a scripted judge. Each claim's label and each evidence's source (tool call id,
message, JSON path, table cell) are checked exactly, the offsets against the document's own text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.reports.runs import rt4

from rt4chart.types import Sample

EXIT_USAGE = 2


def _call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


WEATHER = {"city": "Oslo", "tomorrow": {"summary": "rain", "high_c": 7}}
SALES_ROWS = [{"region": "North", "revenue": 120}, {"region": "South", "revenue": 80}]
CONVERSATION: dict[str, Any] = {
    "id": "agent-chat",
    "messages": [
        {"role": "system", "content": "You are the company assistant."},
        {"role": "user", "content": "I fly to Oslo on Friday. Will it rain there, and how did sales go?"},
        {"role": "assistant", "content": None,
         "tool_calls": [_call("call_weather", "get_weather"), _call("call_sql", "run_sql")]},
        {"role": "tool", "tool_call_id": "call_weather", "content": json.dumps(WEATHER)},
        {"role": "tool", "tool_call_id": "call_sql", "content": json.dumps(SALES_ROWS)},
        {"role": "assistant", "content": "Rain is expected. The airport train runs every 10 minutes."},
        {"role": "user", "content": [{"type": "text", "text": "Anything else?"}]},
        {"role": "assistant", "content": (
            "It will rain in Oslo tomorrow. The South region earned 80. You fly on Friday. "
            "The airport train runs every 10 minutes. The office is next to the harbour. "
            "The rainy city had the weaker region in the South.")},
    ],
    "documents": [{"id": "kb-1", "text": "The Oslo office is next to the harbour."},
                  {"id": "kb-2", "text": "Visitors sign in at the front desk."}],
}
"""A tool returning JSON, an SQL result table, two retrieved documents, a user statement, a claim only an
earlier assistant turn supports, a claim that mixes two tool outputs."""

RULES: dict[str, Any] = {
    "verify": [
        {"claim": "rain in Oslo", "label": "entailed", "evidence": ["tomorrow.summary: rain"]},
        {"claim": "Rain is expected", "label": "entailed", "evidence": ["tomorrow.summary: rain"]},
        {"claim": "South region earned", "label": "entailed", "evidence": ["region: South | revenue: 80"]},
        {"claim": "fly on Friday", "label": "entailed", "evidence": ["I fly to Oslo on Friday."]},
        {"claim": "airport train", "label": "entailed",
         "evidence": ["The airport train runs every 10 minutes."]},
        {"claim": "harbour", "label": "entailed", "evidence": ["The Oslo office is next to the harbour."]},
        {"claim": "rainy city", "label": "entailed",
         "evidence": ["tomorrow.summary: rain", "row 2: region: South | revenue: 80"]},
    ],
    "default": "baseless",
}


def _verify(directory: Path, lines: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
    answers, rules, out = directory / "answers.jsonl", directory / "rules.json", directory / "out.jsonl"
    answers.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    rules.write_text(json.dumps(RULES), encoding="utf-8")
    done = rt4("verify", str(answers), "--judge", f"scripted:{rules}", "--decomposer", "rules", "--no-cache",
               "--out", str(out), "-q", cwd=directory)
    assert "Traceback" not in done.stderr
    return done.returncode, [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def _claims(record: dict[str, Any], sample: Sample) -> list[tuple[str, str, bool, list[tuple[str, list[Any]]]]]:
    assert isinstance(sample.context, list) and sample.passage_ids is not None
    found = []
    for claim in record["claims"]:
        sources = []
        for evidence in claim["evidence"]:
            source = evidence["source"]
            text = sample.context[sample.passage_ids.index(source["document"])]
            assert text[source["start"]:source["end"]] == evidence["text"]
            sources.append((source["document"], [u["path"] for u in source.get("units", [])]))
        found.append((claim["text"], claim["label"], claim.get("earlier_turn_only", False), sources))
    return found


def test_an_agent_conversation_s_claims_are_traced_to_tool_calls_messages_and_documents(tmp_path: Path) -> None:
    code, [record] = _verify(tmp_path, [CONVERSATION])
    assert code == 1  # the claim only the assistant's earlier turn supports is baseless
    sample = Sample.model_validate(CONVERSATION)
    assert sample.answer == CONVERSATION["messages"][-1]["content"] and sample.question == "Anything else?"
    assert _claims(record, sample) == [
        ("It will rain in Oslo tomorrow.", "entailed", False, [("call_weather", ["$.tomorrow.summary"])]),
        ("The South region earned 80.", "entailed", False, [("call_sql", ["$[1].region", "$[1].revenue"])]),
        ("You fly on Friday.", "entailed", False, [("message-1", [])]),
        ("The airport train runs every 10 minutes.", "baseless", True, []),
        ("The office is next to the harbour.", "entailed", False, [("kb-1", [])]),
        ("The rainy city had the weaker region in the South.", "entailed", False,
         [("call_weather", ["$.tomorrow.summary"]), ("call_sql", ["$[1].region", "$[1].revenue"])]),
    ]
    earlier = record["claims"][3]
    assert earlier["judge_verdict"]["label"] == "entailed"
    assert [e["source"]["document"] for e in earlier["judge_verdict"]["evidence"]] == ["message-5"]
    assert record["label"] == "baseless"


def test_the_user_s_statements_ground_nothing_when_the_line_says_so(tmp_path: Path) -> None:
    code, [record] = _verify(tmp_path, [{**CONVERSATION, "user_statements": "ignore"}])
    assert code == 1
    friday = record["claims"][2]
    assert friday["text"] == "You fly on Friday." and friday["label"] != "entailed"
    sample = Sample.model_validate({**CONVERSATION, "user_statements": "ignore"})
    assert "message-1" not in (sample.passage_ids or [])


def test_an_earlier_assistant_turn_is_audited_on_what_came_before_it(tmp_path: Path) -> None:
    line = {**CONVERSATION, "answer_message": 5}
    sample = Sample.model_validate(line)
    assert sample.answer == "Rain is expected. The airport train runs every 10 minutes."
    assert sample.question == CONVERSATION["messages"][1]["content"] and sample.earlier_turns == []
    assert sample.passage_ids == ["message-0", "message-1", "call_weather", "call_sql", "kb-1", "kb-2"]
    code, [record] = _verify(tmp_path, [line])
    assert code == 1
    assert [(c["text"], c["label"], [e["source"]["document"] for e in c["evidence"]]) for c in record["claims"]] == [
        ("Rain is expected.", "entailed", ["call_weather"]),
        ("The airport train runs every 10 minutes.", "baseless", []),  # nothing before it says so
    ]
    assert Sample.model_validate_json(sample.model_dump_json()) == sample


def test_a_conversation_reads_back_as_it_was_given() -> None:
    sample = Sample.model_validate(CONVERSATION)
    written = json.loads(sample.model_dump_json(exclude_none=True))
    assert set(written) == {"id", "messages", "documents"}
    assert [d["id"] for d in written["documents"]] == ["kb-1", "kb-2"]
    again = Sample.model_validate(written)
    assert (again.context, again.passage_ids, again.answer, again.earlier_turns) == (
        sample.context, sample.passage_ids, sample.answer, sample.earlier_turns)
    assert sample.passage_ids == [
        "message-0", "message-1", "call_weather", "call_sql", "message-5", "message-6", "kb-1", "kb-2"]
    assert sample.earlier_turns == ["message-5"]
    # What a Ray worker receives: the sample's JSON, nulls included.
    assert Sample.model_validate_json(sample.model_dump_json()) == sample


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param({"answer": "x"}, "a conversation's answer, question and context come from its messages",
                     id="answer-too"),
        pytest.param({"messages": "hello"}, "messages: a list of OpenAI-style chat messages", id="not-a-list"),
        pytest.param({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]: role: Input should be",
                     id="bad-role"),
        pytest.param({"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "Hi."}]},
                     "messages[0]: a tool message needs its tool_call_id", id="tool-without-call"),
        pytest.param({"messages": [{"role": "tool", "tool_call_id": "c9", "content": "x"},
                                   {"role": "assistant", "content": "Hi."}]},
                     "messages[0]: tool_call_id 'c9' answers no assistant tool call", id="unknown-call"),
        pytest.param({"messages": [{"role": "user", "content": "Hi?"}]},
                     "messages: no assistant message with text to audit", id="no-answer"),
        pytest.param({"answer_message": 1}, "answer_message: message 1 is not an assistant message with text",
                     id="answer-message-of-the-user"),
        pytest.param({"messages": [{"role": "assistant", "content": "Hi."}]},
                     "messages: nothing to check the answer against", id="nothing-to-check"),
    ],
)
def test_a_bad_conversation_is_one_clear_error_record_and_exit_2(
    tmp_path: Path, change: dict[str, Any], problem: str
) -> None:
    code, records = _verify(tmp_path, [CONVERSATION, {"id": "bad", "messages": CONVERSATION["messages"], **change}])
    assert code == EXIT_USAGE
    assert [r["label"] for r in records] == ["baseless", None]
    assert len(records[1]["errors"]) == 1 and records[1]["errors"][0].startswith(f"line 2: {problem}")
