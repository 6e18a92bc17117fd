"""``rt4 guard`` reads the input shapes of ``rt4 verify``: documents (prose, JSON, tables) and OpenAI-style
conversations on ``/v1/verify``, tool results in the proxy's chat requests. A real server on a free
127.0.0.1 port, a real HTTP client, a stand-in upstream; a scripted judge over the hand-made agent
conversation of tests/test_conversations.py gives known verdicts, so each claim's label and evidence
source is checked exactly."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from test_conversations import CONVERSATION, RULES
from test_guard import SEEN, serve_upstream, stand_in_upstream

from rt4chart.options import AuditOptions
from rt4chart.records.io import parse_sample
from rt4chart.runs.guard import GuardConfig, RunningGuard, start_guard

ANSWER = CONVERSATION["messages"][-1]["content"]
EXPECTED = [
    ("It will rain in Oslo tomorrow.", "entailed", False, ["call_weather"]),
    ("The South region earned 80.", "entailed", False, ["call_sql"]),
    ("You fly on Friday.", "entailed", False, ["message-1"]),
    ("The airport train runs every 10 minutes.", "baseless", True, []),
    ("The office is next to the harbour.", "entailed", False, ["kb-1"]),
    ("The rainy city had the weaker region in the South.", "entailed", False, ["call_weather", "call_sql"]),
]
"""The verdicts ``rt4 verify`` gives the conversation (tests/test_conversations.py)."""


def claims(record: dict[str, Any]) -> list[tuple[str, str, bool, list[str]]]:
    return [(c["text"], c["label"], c.get("earlier_turn_only", False), [e["source"]["document"] for e in c["evidence"]])
            for c in record["claims"]]


def config(directory: Path, **changes: Any) -> GuardConfig:
    """The guard with the conversation's scripted judge, claims drawn by rules (one a sentence)."""
    rules = directory / "rules.json"
    rules.write_text(json.dumps(RULES), encoding="utf-8")
    return GuardConfig(port=0, judge=f"scripted:{rules}", options=AuditOptions(decomposer="rules"), **changes)


@pytest_asyncio.fixture
async def guard(tmp_path: Path) -> AsyncIterator[RunningGuard]:
    running = await start_guard(config(tmp_path))
    yield running
    await running.stop()


async def post(guard: RunningGuard, body: Any, **headers: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession(guard.url) as http:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **headers}
        async with http.post("/v1/verify", data=data, headers=headers) as response:
            if response.content_type == "application/x-ndjson":
                return response.status, [json.loads(line) for line in (await response.text()).splitlines()]
            return response.status, await response.json()


@pytest.mark.asyncio
async def test_verify_audits_a_conversation_as_rt4_verify_does(guard: RunningGuard) -> None:
    status, reply = await post(guard, {**CONVERSATION, "id": 7})  # an integer id, as rt4 verify takes it
    assert status == 200, reply
    assert reply["record"]["id"] == "7"
    assert claims(reply["record"]) == EXPECTED
    assert (reply["decision"], reply["record"]["label"]) == ("flag", "baseless")
    units = [u["path"] for u in reply["record"]["claims"][1]["evidence"][0]["source"]["units"]]
    assert units == ["$[1].region", "$[1].revenue"]


@pytest.mark.asyncio
async def test_verify_audits_documents_and_streams_their_sources(guard: RunningGuard) -> None:
    documents = [{"id": "weather", "data": {"city": "Oslo", "tomorrow": {"summary": "rain", "high_c": 7}}},
                 {"id": "kb-1", "title": "Office", "text": "The Oslo office is next to the harbour."}]
    body = {"id": "docs", "documents": documents, "answer": "It will rain in Oslo tomorrow. The office is next to "
            "the harbour. The airport train runs every 10 minutes."}
    status, reply = await post(guard, body)
    assert status == 200, reply
    assert claims(reply["record"]) == [(EXPECTED[0][0], "entailed", False, ["weather"]), (*EXPECTED[4][:3], ["kb-1"]),
                                       (EXPECTED[3][0], "baseless", False, [])]
    assert reply["record"]["id"] == "docs"
    assert reply["record"]["claims"][0]["evidence"][0]["source"]["units"] == [{"path": "$.tomorrow.summary"}]
    status, events = await post(guard, {**body, "stream": True})
    assert status == 200
    sentences = [e for e in events if e["event"] == "sentence"]
    assert [(e["label"], [ev["source"]["document"] for c in e["record"]["claims"] for ev in c["evidence"]])
            for e in sentences] == [("entailed", ["weather"]), ("entailed", ["kb-1"]), ("baseless", [])]


@pytest.mark.asyncio
async def test_a_streamed_conversation_keeps_its_earlier_turns_ungrounding(guard: RunningGuard) -> None:
    status, events = await post(guard, {**CONVERSATION, "stream": True})
    assert status == 200
    sentences = [e["record"]["claims"] for e in events if e["event"] == "sentence"]
    assert [claims({"claims": c})[0] for c in sentences] == EXPECTED


BAD_BODIES: list[dict[str, Any]] = [
    {"documents": [{"id": "a", "text": "x", "data": {"k": 1}}], "answer": "x"},
    {"documents": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], "answer": "x"},
    {"documents": [{"id": "t", "table": "a,b\n1,2"}], "answer": "x"},
    {"context": "c", "documents": [{"id": "a", "text": "x"}], "answer": "x"},
    {**CONVERSATION, "answer": "x"},
    {**CONVERSATION, "answer_message": 1},
    {"messages": [{"role": "tool", "tool_call_id": "c9", "content": "x"}, {"role": "assistant", "content": "Hi."}]},
    {"messages": [{"role": "robot", "content": "x"}]},
    {"answer": "x"},
]


@pytest.mark.asyncio
@pytest.mark.parametrize("body", BAD_BODIES)
async def test_a_bad_body_is_a_422_with_rt4_verify_s_message(guard: RunningGuard, body: dict[str, Any]) -> None:
    problem = parse_sample(body, 1).error
    assert problem is not None
    status, reply = await post(guard, body)
    assert status == 422
    assert f"line 1: {reply['error']['message']}" == problem


@pytest.mark.asyncio
async def test_a_conversation_does_not_stream_in_as_deltas(guard: RunningGuard) -> None:
    body = json.dumps(CONVERSATION).encode() + b"\n" + json.dumps({"delta": "More."}).encode() + b"\n"
    status, reply = await post(guard, body, **{"Content-Type": "application/x-ndjson"})
    assert status == 422  # refused on its first line, before the stream opens
    assert "a conversation's answer is its assistant message, it does not stream in" in reply["error"]["message"]


@pytest.mark.asyncio
async def test_the_proxy_audits_a_reply_against_the_request_s_tool_results(tmp_path: Path) -> None:
    upstream_app = stand_in_upstream([ANSWER])
    upstream, upstream_url = await serve_upstream(upstream_app)
    guard = await start_guard(config(tmp_path, upstream=upstream_url))
    request = {"model": "m", "messages": CONVERSATION["messages"][:-1]}
    try:
        async with aiohttp.ClientSession(guard.url) as http:
            async with http.post("/v1/chat/completions", json=request) as response:
                assert response.status == 200
                reply = await response.json()
            async with http.post("/v1/chat/completions", json={**request, "stream": True}) as response:
                assert response.status == 200
                events = [json.loads(line[5:]) for line in (await response.text()).splitlines()
                          if line.startswith("data:") and line.strip() != "data: [DONE]"]
            unanswered = [*request["messages"], {"role": "tool", "tool_call_id": "c9", "content": "x"}]
            async with http.post("/v1/chat/completions", json={**request, "messages": unanswered}) as response:
                refusal = await response.json()
                assert response.status == 422
    finally:
        await guard.stop()
        await upstream.cleanup()
    # Without the retrieved documents of the verify line, the harbour claim has no source.
    expected = [(claim[0], "baseless", False, []) if claim[3] == ["kb-1"] else claim for claim in EXPECTED]
    assert claims(reply["rt4chart"]["record"]) == expected
    sentences = [e["rt4chart"]["record"] for e in events if e.get("rt4chart", {}).get("event") == "sentence"]
    assert [claims(record)[0] for record in sentences] == expected  # streamed: the same verdicts, sentence by sentence
    assert "tool_call_id 'c9' answers no assistant tool call" in refusal["error"]["message"]
    assert len(upstream_app[SEEN]) == 2  # the refused request never went upstream
