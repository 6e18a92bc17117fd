"""``rt4 guard``'s choices per service and per request: the decomposer (``--decomposer``), a latency
budget asked by a proxied chat request, the shape of streamed verdict events, and what a call cut at
the budget's deadline costs. Real servers on free 127.0.0.1 ports, real HTTP clients; no assertion on
wall-clock time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from faults import fault_server
from test_guard import (
    EXAMPLES,
    FAITHFUL,
    JUDGE,
    REFUND_CONTEXT,
    SEEN,
    WRONG_FIRST,
    WRONG_SECOND,
    chat,
    read_events,
    serve_upstream,
    stand_in_upstream,
    with_proxy,
)
from test_guard_limits import TRIAL_ANSWER, TRIAL_CONTEXT, contradict_with_the_refund_sentence, first_stage_rules
from typer.testing import CliRunner

from rt4chart.cli.app import app as cli_app
from rt4chart.runs.guard import GuardConfig, GuardLimits, start_guard


def claims_through_the_cli(*flags: str) -> list[str]:
    """The claim texts of TRIAL_ANSWER's record from a real ``rt4 guard`` started with ``flags``."""
    command = [sys.executable, "-m", "rt4chart", "guard", "--port", "0", "--judge", JUDGE, *flags]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "RT4_GUARD_TOKEN": ""})
    try:
        assert process.stderr is not None
        ready = process.stderr.readline()
        assert "serving on http://127.0.0.1:" in ready, ready + process.stderr.read()
        url = ready.split("serving on ")[1].split()[0]
        body = json.dumps({"context": TRIAL_CONTEXT, "answer": TRIAL_ANSWER}).encode()
        request = urllib.request.Request(url + "/v1/verify", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            reply: dict[str, Any] = json.loads(response.read())
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
    return [claim["text"] for claim in reply["record"]["claims"]]


def test_the_decomposer_is_chosen_by_flag() -> None:
    # The example rules decompose each trial sentence into two claims; by rules a sentence is a claim.
    assert len(claims_through_the_cli()) == 4
    by_rules = claims_through_the_cli("--decomposer", "rules")
    assert by_rules == [
        "All users, including existing customers, can start the free trial.",
        "The trial lasts 14 days, and a verified new user can use it for up to 21 days in total.",
    ]


def test_an_unknown_decomposer_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli_app, ["guard", "--decomposer", "magic"])
    assert result.exit_code == 2
    assert "--decomposer must be" in result.output and "'magic'" in result.output


@pytest.mark.asyncio
async def test_a_sentence_event_carries_its_claims_verdicts_not_the_whole_record() -> None:
    guard = await start_guard(GuardConfig(port=0, judge=JUDGE))
    try:
        async with aiohttp.ClientSession(guard.url) as http:
            body = {"context": REFUND_CONTEXT, "answer": WRONG_FIRST + WRONG_SECOND, "stream": True}
            async with http.post("/v1/verify", json=body) as response:
                events = [event async for event in read_events(response)]
    finally:
        await guard.stop()
    first, second, answer = events
    assert set(first) == {
        "event", "index", "start", "end", "text", "label", "decision", "claims", "errors", "incomplete"
    }
    assert (first["label"], first["decision"], second["decision"]) == ("contradicted", "block", "pass")
    (claim,) = first["claims"]
    assert set(claim) == {"text", "label", "confidence", "evidence", "errors"}
    assert claim["label"] == "contradicted" and claim["evidence"]
    joined = "\n".join(REFUND_CONTEXT)
    for quote in claim["evidence"]:
        assert set(quote) == {"start", "end", "text"}
        assert joined[quote["start"] : quote["end"]] == quote["text"]
    # The answer event ends the stream with the answer's record, every claim in full.
    assert answer["event"] == "answer" and len(answer["record"]["claims"]) == 2
    assert answer["record"]["claims"][0]["rationale"]


@pytest.mark.asyncio
async def test_a_proxied_chat_request_brings_its_own_latency_budget(tmp_path: Path) -> None:
    upstream_app = stand_in_upstream([FAITHFUL])
    upstream, upstream_url = await serve_upstream(upstream_app)
    judge = f"cascade:scripted:{first_stage_rules(tmp_path)}@0.9,openai/second"
    with fault_server(contradict_with_the_refund_sentence) as server:
        server.gate.clear()  # the second stage never answers while the request waits: only the budget ends it
        config = GuardConfig(port=0, judge=judge, api_base=server.base_url, upstream=upstream_url,
                             limits=GuardLimits(timeout_s=10))
        guard = await start_guard(config)
        try:
            async with openai.AsyncOpenAI(base_url=guard.url + "/v1", api_key="k", max_retries=0) as client:
                messages, extra = chat("rt4_context")
                reply = await client.chat.completions.create(
                    model="m", messages=messages, extra_body={**extra, "rt4_latency_budget_ms": 200}
                )
                streamed = await client.chat.completions.create(
                    model="m", messages=messages, extra_body={**extra, "rt4_latency_budget_ms": 200}, stream=True
                )
                chunks = [chunk async for chunk in streamed]
                events = [e for chunk in chunks if (e := (chunk.model_extra or {}).get("rt4chart"))]
                with pytest.raises(openai.UnprocessableEntityError, match="rt4_latency_budget_ms"):
                    await client.chat.completions.create(
                        model="m", messages=messages, extra_body={**extra, "rt4_latency_budget_ms": -1}
                    )
        finally:
            server.gate.set()
            await guard.stop()
            await upstream.cleanup()
    verdict = (reply.model_extra or {})["rt4chart"]
    assert verdict["decision"] == "flag"
    assert any("latency budget of 200 ms spent" in error for error in verdict["record"]["errors"])
    decisions = [(e["event"], e["decision"]) for e in events]
    assert decisions == [("sentence", "pass"), ("sentence", "flag"), ("answer", "flag")]
    assert all("rt4_latency_budget_ms" not in body for body in upstream_app[SEEN])


@pytest.mark.asyncio
async def test_a_proxied_latency_budget_needs_a_cascade() -> None:
    async def check(client: openai.AsyncOpenAI, upstream: web.Application) -> None:
        messages, extra = chat("rt4_context")
        with pytest.raises(openai.UnprocessableEntityError, match="no cascade"):
            await client.chat.completions.create(
                model="m", messages=messages, extra_body={**extra, "rt4_latency_budget_ms": 200}
            )
        assert not upstream[SEEN]  # refused before anything went upstream

    await with_proxy([FAITHFUL], check)


@pytest.mark.asyncio
async def test_a_call_cut_at_the_latency_deadline_is_booked_at_its_prompt_cost(tmp_path: Path) -> None:
    rules = json.loads((EXAMPLES / "answers.rules.json").read_text())
    slow = tmp_path / "slow.rules.json"  # a paid second stage that answers long after the budget
    slow.write_text(json.dumps({**rules, "cost_per_call": 0.01, "latency_s": 60}))
    judge = f"cascade:scripted:{first_stage_rules(tmp_path)}@0.9,scripted:{slow}"
    config = GuardConfig(port=0, judge=judge, limits=GuardLimits(latency_budget_ms=200, timeout_s=20))
    guard = await start_guard(config)
    try:
        async with aiohttp.ClientSession(guard.url) as http:
            async with http.post("/v1/verify", json={"context": REFUND_CONTEXT, "answer": FAITHFUL}) as response:
                assert response.status == 200, await response.text()
                record = (await response.json())["record"]
            async with http.get("/metrics") as response:
                metrics = await response.text()
    finally:
        await guard.stop()
    assert any("latency budget of 200 ms spent" in error for error in record["errors"])
    (cut,) = [usage for judge, usage in record["usage_by_judge"].items() if "slow.rules.json" in judge]
    assert cut["calls"] == 1 and cut["cost_usd"] == pytest.approx(0.01) and cut["prompt_tokens"] > 0
    assert record["usage"]["cost_usd"] == pytest.approx(0.01)
    # The shared budget's ledger, which --budget caps, books it too.
    cost = next(line for line in metrics.splitlines() if line.startswith("rt4_guard_judge_cost_usd_total"))
    assert float(cost.split()[1]) == pytest.approx(0.01)
