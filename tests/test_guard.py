"""``rt4 guard``: a real server on a free 127.0.0.1 port, real HTTP clients (aiohttp, the openai SDK)
and a stand-in upstream model served by aiohttp. The scripted judge (examples/answers.rules.json)
gives known verdicts: the refund answer with "60 days" is contradicted, the wireless-charging
sentence baseless."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from typer.testing import CliRunner

from rt4chart.cli.app import app as cli_app
from rt4chart.records.io import read_records
from rt4chart.runs.guard import GuardConfig, GuardConfigError, GuardLimits, RunningGuard, start_guard

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
JUDGE = f"scripted:{EXAMPLES / 'answers.rules.json'}"
REFUND_CONTEXT = [
    "Laptops bought from our online store can be returned within 30 days of delivery. "
    "The laptop must be in its original packaging.",
    "Refunds are issued to the original payment method within 5 business days after we receive the item.",
]
FAITHFUL = (
    "You can return a laptop within 30 days of delivery, in its original packaging. "
    "The refund goes back to your original payment method."
)
WRONG_FIRST = "You can return a laptop within 60 days of delivery. "
WRONG_SECOND = "Refunds arrive within 5 business days after the item is received."
QUESTION = "How long do I have to return a laptop?"
SEEN = web.AppKey("seen", list[dict[str, Any]])  # the requests the stand-in upstream received
EVENT_WAIT_S = 120  # a hang guard only: the tests assert on event order, never on time


def examples() -> dict[str, dict[str, Any]]:
    lines = (EXAMPLES / "answers.jsonl").read_text().splitlines()
    return {sample["id"]: sample for sample in map(json.loads, lines)}


async def started(**changes: Any) -> RunningGuard:
    return await start_guard(GuardConfig(port=0, judge=JUDGE, **changes))


def ndjson(*objects: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(o).encode() + b"\n" for o in objects)


async def read_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    async for line in response.content:
        if line.strip():
            yield json.loads(line)


@pytest.mark.asyncio
async def test_verify_returns_the_record_and_a_decision_by_policy(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    guard = await started(audit_log=log)
    try:
        async with aiohttp.ClientSession(guard.url) as http:
            decisions = {}
            for name, sample in examples().items():
                body = {k: sample[k] for k in ("id", "context", "question", "answer") if k in sample}
                async with http.post("/v1/verify", json=body) as response:
                    assert response.status == 200
                    reply = await response.json()
                decisions[name] = (reply["decision"], reply["record"]["label"])
            async with http.get("/metrics") as response:
                metrics = await response.text()
            async with http.get("/health") as response:
                assert (await response.json())["status"] == "ok"
    finally:
        await guard.stop()
    assert decisions == {
        "refund-faithful": ("pass", "entailed"),
        "refund-wrong-number": ("block", "contradicted"),
        "battery-unsupported": ("flag", "baseless"),
        "paper-running-example": ("block", "contradicted"),
    }
    assert 'rt4_guard_decisions_total{decision="block"} 2' in metrics
    assert 'rt4_guard_decisions_total{decision="pass"} 1' in metrics
    assert "rt4_guard_audit_seconds_count 4" in metrics
    calls = next(line for line in metrics.splitlines() if line.startswith("rt4_guard_judge_calls_total"))
    assert int(calls.split()[1]) > 0
    # The audit log is a file of rt4 verify records, as rt4 report and rt4 diff read them.
    records = [line.report for line in read_records(log)]
    assert [record.id for record in records if record is not None] == list(examples())
    result = CliRunner().invoke(cli_app, ["report", str(log), "--html", str(tmp_path / "report.html")])
    assert result.exit_code == 1, result.output  # hallucinated answers: rt4 verify's exit 1


@pytest.mark.asyncio
async def test_bad_requests_get_a_clear_4xx() -> None:
    guard = await started(limits=GuardLimits(max_body_bytes=4000, max_sentences=3))
    try:
        async with aiohttp.ClientSession(guard.url) as http:
            cases: list[tuple[Any, int, str]] = [
                (b"{not json", 400, "not JSON"),
                ({"answer": "x"}, 422, "context"),
                ({"context": "c", "answer": "  "}, 422, "answer"),
                ({"context": "c", "answer": "x", "colour": 1}, 422, "colour"),
                ({"context": "c", "answer": "One. Two. Three. Four. Five."}, 413, "--max-sentences"),
                ({"context": "c" * 5000, "answer": "x"}, 413, "--max-body-bytes"),
            ]
            for body, status, words in cases:
                kwargs = {"data": body} if isinstance(body, bytes) else {"json": body}
                async with http.post("/v1/verify", **kwargs) as response:
                    reply = await response.json()
                assert response.status == status, reply
                assert words in reply["error"]["message"]
    finally:
        await guard.stop()


@pytest.mark.asyncio
async def test_a_token_is_required_beyond_loopback_and_checked() -> None:
    with pytest.raises(GuardConfigError, match="needs a token"):
        await start_guard(GuardConfig(host="0.0.0.0", port=0, judge=JUDGE))
    guard = await started(token="s3cret")
    try:
        async with aiohttp.ClientSession(guard.url) as http:
            body = {"context": REFUND_CONTEXT, "answer": FAITHFUL}
            async with http.post("/v1/verify", json=body) as response:
                assert response.status == 401
                assert response.headers["WWW-Authenticate"] == "Bearer"
            async with http.get("/metrics", headers={"Authorization": "Bearer wrong"}) as response:
                assert response.status == 401
            async with http.post("/v1/verify", json=body, headers={"Authorization": "Bearer s3cret"}) as response:
                assert response.status == 200
            async with http.get("/health") as response:
                assert response.status == 200
    finally:
        await guard.stop()


class HeldStream:
    """A streamed /v1/verify request whose answer is sent only when the test says so: it holds an
    admission slot for as long as the test wants."""

    def __init__(self, http: aiohttp.ClientSession) -> None:
        self.http = http
        self.chunks: asyncio.Queue[str | None] = asyncio.Queue()

    async def body(self) -> AsyncIterator[bytes]:
        yield ndjson({"context": REFUND_CONTEXT, "question": QUESTION})
        while (chunk := await self.chunks.get()) is not None:
            yield ndjson({"delta": chunk})

    def open(self) -> Awaitable[aiohttp.ClientResponse]:
        headers = {"Content-Type": "application/x-ndjson"}
        return self.http.post("/v1/verify", data=self.body(), headers=headers)


async def until_in_flight(guard: RunningGuard, count: int) -> None:
    while guard.guard.metrics.in_flight != count:
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_streamed_answer_gets_each_sentence_verdict_before_the_answer_ends() -> None:
    guard = await started()
    try:
        async with aiohttp.ClientSession(guard.url) as http:
            held = HeldStream(http)
            await held.chunks.put(WRONG_FIRST + "Refunds")  # sentence 1 complete, sentence 2 begun
            response = await asyncio.wait_for(held.open(), EVENT_WAIT_S)
            events = read_events(response)
            first = await asyncio.wait_for(anext(events), EVENT_WAIT_S)
            # The first verdict came while the answer's second sentence was still unsent.
            assert first["event"] == "sentence" and first["index"] == 0
            assert first["text"] == WRONG_FIRST.strip() and first["decision"] == "block"
            await held.chunks.put(WRONG_SECOND.removeprefix("Refunds"))
            await held.chunks.put(None)
            rest = [event async for event in events]
    finally:
        await guard.stop()
    assert [(e["event"], e.get("index")) for e in rest] == [("sentence", 1), ("answer", None)]
    assert rest[0]["decision"] == "pass" and rest[0]["start"] == len(WRONG_FIRST)
    answer = rest[1]
    assert (answer["label"], answer["decision"]) == ("contradicted", "block")
    assert [c["sentence_index"] for c in answer["record"]["claims"]] == [0, 1]
    assert answer["record"]["claims"][1]["answer_span"]["start"] == len(WRONG_FIRST)


@pytest.mark.asyncio
async def test_whole_answer_with_stream_true_streams_the_verdicts() -> None:
    guard = await started()
    try:
        async with aiohttp.ClientSession(guard.url) as http:
            body = {"context": REFUND_CONTEXT, "answer": FAITHFUL, "stream": True}
            async with http.post("/v1/verify", json=body) as response:
                assert response.headers["Content-Type"].startswith("application/x-ndjson")
                events = [event async for event in read_events(response)]
    finally:
        await guard.stop()
    assert [e["event"] for e in events] == ["sentence", "sentence", "answer"]
    assert events[-1]["decision"] == "pass"


@pytest.mark.asyncio
async def test_a_full_queue_answers_429_with_retry_after() -> None:
    guard = await started(limits=GuardLimits(max_in_flight=1, max_queued=0, retry_after_s=7))
    try:
        async with aiohttp.ClientSession(guard.url) as http:
            held = HeldStream(http)
            opening = asyncio.ensure_future(held.open())
            await asyncio.wait_for(until_in_flight(guard, 1), EVENT_WAIT_S)
            async with http.post("/v1/verify", json={"context": REFUND_CONTEXT, "answer": FAITHFUL}) as response:
                assert response.status == 429
                assert response.headers["Retry-After"] == "7"
                assert "--max-in-flight 1" in (await response.json())["error"]["message"]
            await held.chunks.put(FAITHFUL)
            await held.chunks.put(None)
            response = await asyncio.wait_for(opening, EVENT_WAIT_S)
            events = [event async for event in read_events(response)]
            assert events[-1]["decision"] == "pass"
            # The slot is free again.
            async with http.post("/v1/verify", json={"context": REFUND_CONTEXT, "answer": FAITHFUL}) as response:
                assert response.status == 200
    finally:
        await guard.stop()


@pytest.mark.asyncio
async def test_shutdown_refuses_new_requests_and_finishes_the_ones_in_flight() -> None:
    guard = await started()
    async with aiohttp.ClientSession(guard.url) as http, aiohttp.ClientSession(guard.url) as kept_alive:
        async with kept_alive.get("/health") as response:
            assert response.status == 200
        held = HeldStream(http)
        opening = asyncio.ensure_future(held.open())
        await asyncio.wait_for(until_in_flight(guard, 1), EVENT_WAIT_S)
        stopping = asyncio.ensure_future(guard.stop())
        await asyncio.sleep(0.2)  # let the listener close (no assertion on time)
        assert not stopping.done()  # waits for the request in flight
        async with aiohttp.ClientSession(guard.url) as fresh:
            with pytest.raises(aiohttp.ClientConnectorError):
                await fresh.get("/health")
        async with kept_alive.get("/health") as response:  # a connection opened before is told
            assert response.status == 503 and (await response.json())["status"] == "draining"
        await held.chunks.put(FAITHFUL)
        await held.chunks.put(None)
        response = await asyncio.wait_for(opening, EVENT_WAIT_S)
        events = [event async for event in read_events(response)]
        assert events[-1]["event"] == "answer" and events[-1]["decision"] == "pass", events[-1]
        await asyncio.wait_for(stopping, EVENT_WAIT_S)


# --- the OpenAI-compatible proxy ----------------------------------------------------------------


def stand_in_upstream(
    answer_pieces: list[str], release: asyncio.Event | None = None, hold_at: int = 0
) -> web.Application:
    """A chat completions server: the answer whole, or streamed piece by piece (waiting for
    ``release`` before piece ``hold_at`` when given one)."""
    seen: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        base = {"id": "chatcmpl-standin", "created": 1, "model": body["model"]}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(answer_pieces)}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({**base, "object": "chat.completion", "choices": [choice]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for position, piece in enumerate(answer_pieces):
            if release is not None and position == hold_at:
                await release.wait()
            delta = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
            chunk = {**base, "object": "chat.completion.chunk", "choices": [delta]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        last = {
            **base,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        await response.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app[SEEN] = seen
    return app


async def serve_upstream(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


Messages = list[Any]


def chat(context_in: str) -> tuple[Messages, dict[str, Any]]:
    """A chat request with the refund context given either way the proxy reads it."""
    if context_in == "system":
        system = {"role": "system", "content": " ".join(REFUND_CONTEXT)}
        return [system, {"role": "user", "content": QUESTION}], {}
    return [{"role": "user", "content": QUESTION}], {"rt4_context": REFUND_CONTEXT}


async def with_proxy(
    pieces: list[str],
    test: Callable[[openai.AsyncOpenAI, web.Application], Awaitable[None]],
    release: asyncio.Event | None = None,
    hold_at: int = 0,
) -> None:
    upstream_app = stand_in_upstream(pieces, release, hold_at)
    upstream, upstream_url = await serve_upstream(upstream_app)
    guard = await started(upstream=upstream_url)
    try:
        async with openai.AsyncOpenAI(base_url=guard.url + "/v1", api_key="client-key", max_retries=0) as client:
            await test(client, upstream_app)
    finally:
        await guard.stop()
        await upstream.cleanup()


@pytest.mark.asyncio
async def test_proxy_audits_a_reply_through_the_openai_sdk() -> None:
    async def check(client: openai.AsyncOpenAI, upstream: web.Application) -> None:
        messages, extra = chat("system")
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages, extra_body=extra)
        reply = raw.parse()
        assert reply.choices[0].message.content == FAITHFUL
        assert raw.headers["X-Rt4chart-Decision"] == "pass"
        assert (reply.model_extra or {})["rt4chart"]["record"]["label"] == "entailed"
        assert "rt4_context" not in upstream[SEEN][0]

    await with_proxy([FAITHFUL], check)


@pytest.mark.asyncio
async def test_proxy_replaces_a_blocked_reply() -> None:
    async def check(client: openai.AsyncOpenAI, upstream: web.Application) -> None:
        messages, extra = chat("rt4_context")
        reply = await client.chat.completions.create(model="m", messages=messages, extra_body=extra)
        assert reply.choices[0].finish_reason == "content_filter"
        assert reply.choices[0].message.content == "This answer was withheld: it contradicts its sources."
        verdict = (reply.model_extra or {})["rt4chart"]
        assert (verdict["decision"], verdict["label"]) == ("block", "contradicted")
        assert "rt4_context" not in upstream[SEEN][0]  # the extension field never goes upstream

    await with_proxy([WRONG_FIRST + WRONG_SECOND], check)


@pytest.mark.asyncio
async def test_proxy_without_context_is_a_422() -> None:
    async def check(client: openai.AsyncOpenAI, _upstream: web.Application) -> None:
        with pytest.raises(openai.UnprocessableEntityError, match="no context"):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": QUESTION}])

    await with_proxy([FAITHFUL], check)


@pytest.mark.asyncio
async def test_streamed_proxy_passes_tokens_unchanged_and_a_verdict_follows_each_sentence() -> None:
    pieces = [
        "You can return a laptop ",
        "within 30 days of delivery, ",
        "in its original packaging. ",
        "The refund goes back ",
        "to your original ",
        "payment method.",
    ]
    # The first sentence is complete once the second begins (piece 3); the upstream holds piece 4
    # until the client has the first sentence's verdict.
    release = asyncio.Event()

    async def check(client: openai.AsyncOpenAI, _upstream: web.Application) -> None:
        messages, extra = chat("rt4_context")
        stream = await client.chat.completions.create(model="m", messages=messages, extra_body=extra, stream=True)
        order: list[str] = []
        tokens: list[str] = []
        async for chunk in stream:
            verdict = (chunk.model_extra or {}).get("rt4chart")
            if verdict is not None:
                order.append(f"{verdict['event']}:{verdict.get('index', '')}:{verdict['decision']}")
                release.set()
            elif chunk.choices and chunk.choices[0].delta.content:
                tokens.append(chunk.choices[0].delta.content)
                order.append("token")
        assert tokens == pieces
        assert order == ["token"] * 4 + ["sentence:0:pass"] + ["token"] * 2 + ["sentence:1:pass", "answer::pass"]

    await asyncio.wait_for(with_proxy(pieces, check, release, hold_at=4), EVENT_WAIT_S)


@pytest.mark.asyncio
async def test_streamed_proxy_stops_a_blocked_reply() -> None:
    pieces = ["You can return a laptop ", "within 60 days of delivery. ", "Refunds arrive ", "within 5 business days."]
    release = asyncio.Event()

    async def check(client: openai.AsyncOpenAI, _upstream: web.Application) -> None:
        messages, extra = chat("rt4_context")
        stream = await client.chat.completions.create(model="m", messages=messages, extra_body=extra, stream=True)
        chunks = [chunk async for chunk in stream]
        release.set()
        tokens = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert tokens == pieces[:3]  # the piece that completed the blocked sentence, nothing after
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["content_filter"]
        answer = (chunks[-1].model_extra or {})["rt4chart"]
        assert (answer["event"], answer["decision"]) == ("answer", "block")

    await asyncio.wait_for(with_proxy(pieces, check, release, hold_at=3), EVENT_WAIT_S)


def test_guard_cli_refuses_bad_flags_with_exit_2() -> None:
    runner = CliRunner()
    public = runner.invoke(cli_app, ["guard", "--host", "0.0.0.0", "--judge", JUDGE], env={"RT4_GUARD_TOKEN": ""})
    assert public.exit_code == 2 and "needs a token" in public.output
    bad_port = runner.invoke(cli_app, ["guard", "--port", "99999"])
    assert bad_port.exit_code == 2
    bad_label = runner.invoke(cli_app, ["guard", "--block-on", "wrong"])
    assert bad_label.exit_code == 2


def test_rt4_guard_serves_the_embedded_judge_and_stops_on_sigterm(tmp_path: Path) -> None:
    """The real command with its default judge: serves, audits, drains and exits 0 on SIGTERM."""
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    log = tmp_path / "audit.jsonl"
    command = [sys.executable, "-m", "rt4chart", "guard", "--port", "0", "--audit-log", str(log)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "RT4_GUARD_TOKEN": ""})
    try:
        assert process.stderr is not None
        ready = process.stderr.readline()
        assert "serving on http://127.0.0.1:" in ready, ready + process.stderr.read()
        url = ready.split("serving on ")[1].split()[0]
        sample = examples()["refund-wrong-number"]
        body = json.dumps({k: sample[k] for k in ("id", "context", "question", "answer")}).encode()
        request = urllib.request.Request(url + "/v1/verify", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            reply = json.loads(response.read())
        assert reply["record"]["judge"].startswith("embedded#")
        assert (reply["decision"], reply["record"]["label"]) == ("block", "contradicted")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert [json.loads(line)["id"] for line in log.read_text().splitlines()] == ["refund-wrong-number"]


@pytest.mark.asyncio
async def test_time_and_sentence_limits_end_a_request_with_a_clear_error() -> None:
    guard = await started(limits=GuardLimits(timeout_s=0.5, max_sentences=2))
    never = asyncio.Event()  # the client never finishes its body: the time limit ends the request

    async def stalled_json() -> AsyncIterator[bytes]:
        yield b'{"context": "c", '
        await never.wait()

    try:
        async with aiohttp.ClientSession(guard.url) as http:
            headers = {"Content-Type": "application/json"}
            async with http.post("/v1/verify", data=stalled_json(), headers=headers) as response:
                assert response.status == 408
                assert "--timeout" in (await response.json())["error"]["message"]
            # A streamed answer: the status is sent, so the limit is the stream's last event.
            held = HeldStream(http)
            await held.chunks.put("First sentence. ")
            response = await asyncio.wait_for(held.open(), EVENT_WAIT_S)
            events = [event async for event in read_events(response)]
            assert events[-1]["event"] == "error" and events[-1]["status"] == 408
            three = {"context": REFUND_CONTEXT, "answer": "One. Two. Three.", "stream": True}
            async with http.post("/v1/verify", json=three) as response:
                events = [event async for event in read_events(response)]
            assert (events[-1]["event"], events[-1]["status"]) == ("error", 413)
            assert "--max-sentences" in events[-1]["error"]
            assert all(event["event"] != "answer" for event in events)
    finally:
        never.set()
        await guard.stop()


@pytest.mark.asyncio
async def test_an_unreachable_upstream_is_a_502() -> None:
    guard = await started(upstream="http://127.0.0.1:9/v1")  # nothing listens on port 9
    try:
        async with aiohttp.ClientSession(guard.url) as http:
            body = {"model": "m", "messages": [{"role": "user", "content": QUESTION}], "rt4_context": "c"}
            async with http.post("/v1/chat/completions", json=body) as response:
                assert response.status == 502
                assert "did not answer" in (await response.json())["error"]["message"]
    finally:
        await guard.stop()
