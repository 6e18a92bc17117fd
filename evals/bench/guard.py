"""``rt4 guard``: answer latency and throughput with the embedded judge, and the proxy's added latency.

    python evals/bench/guard.py --answers 40 --concurrency 4 --streams 30

Starts ``rt4 guard`` as its own process on a free 127.0.0.1 port (default judge: the embedded one;
a service in the client's own event loop would charge its CPU work to the client's clock) and
sends it RAGTruth QA test answers over HTTP: one at a time, then ``--concurrency`` clients at once
(latency p50/p99 per answer, and answers per second). An answer whose context the service has not
seen is timed cold, the others warm (the judge keeps context sentence embeddings): both are shown.
One warm-up request, timed apart, comes first (what the judge loads lazily is in it; the start-up
before the service listens is not).
Then the proxy: a stand-in upstream (aiohttp, answers at once) streams a reply of
RAGTruth answer text in 8-character chunks; the first-token and last-token latency through the
proxy (``--upstream``) are compared with calling the upstream directly and through a bare aiohttp
relay (evals/bench/relay.py: the floor of one more hop on this machine; p50 over ``--streams``).
Prints the measured figures and the command; records them in RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import record

RAGTRUTH_TEST = Path("/work/shared/data/ragtruth-qa/test.jsonl")


def answers(limit: int) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in RAGTRUTH_TEST.read_text(encoding="utf-8").splitlines()[:limit]]
    return [{"id": r["id"], "context": r["d1"], "question": r["query"], "answer": r["d2"]} for r in rows]


def latency_rows(how: str, timings: list[tuple[float, bool]]) -> list[str]:
    """Table rows of verdict latency per answer (seconds, whether the context was new): p50 and p99 of
    all, then p50 of the cold and of the warm ones apart."""
    every = [seconds for seconds, _ in timings]
    rows = [
        f"| verdict latency per answer, {how}: p50 / p99 ({len(every)} answers) | "
        f"{1000 * statistics.median(every):.0f} / {1000 * percentile(every, 0.99):.0f} ms |"
    ]
    for name, cold in (("context new to the service (cold)", True), ("context seen before (warm)", False)):
        part = [seconds for seconds, was_cold in timings if was_cold == cold]
        if part:
            rows.append(f"| ... {name}: p50 ({len(part)} answers) | {1000 * statistics.median(part):.0f} ms |")
    return rows


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def verify(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    async with http.post(url + "/v1/verify", json=body) as response:
        await response.read()
        assert response.status == 200, response.status
    return time.perf_counter() - started


def stand_in(pieces: list[str]) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces:
            chunk = {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    return app


async def stream_timings(http: aiohttp.ClientSession, base: str, context: str) -> tuple[float, float]:
    """Seconds to the first and to the last upstream content chunk of one streamed completion."""
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "q"}], "rt4_context": context}
    started = time.perf_counter()
    first = last = 0.0
    async with http.post(base + "/chat/completions", json=body) as response:
        async for line in response.content:
            if line.startswith(b"data: {") and b'"content"' in line:
                last = time.perf_counter() - started
                first = first or last
    return first, last


def spawn_guard(judge: str | None, *flags: str) -> tuple[subprocess.Popen[str], str]:
    """``rt4 guard`` in its own process, and the URL it serves on."""
    judging = ["--judge", judge] if judge else []
    return spawn([sys.executable, "-m", "rt4chart", "guard", "--port", "0", *judging, *flags])


def spawn(command: list[str]) -> tuple[subprocess.Popen[str], str]:
    """A server in its own process that says ``serving on URL`` on stderr, and that URL."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "RT4_GUARD_TOKEN": ""})
    assert process.stderr is not None
    ready = process.stderr.readline()
    if "serving on " not in ready:
        process.kill()
        raise SystemExit(f"{command[1:3]} did not start: {ready}{process.stderr.read()}")
    return process, ready.split("serving on ")[1].split()[0]


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    process.wait(timeout=120)


async def main(arguments: argparse.Namespace) -> None:
    # Three disjoint sets: the warm-up, the sequential run, the concurrent run (the embedded judge
    # memoises context embeddings: an answer seen before would be timed warm).
    loaded = answers(1 + 2 * arguments.answers)
    warm_up, samples, parallel = loaded[0], loaded[1 : 1 + arguments.answers], loaded[1 + arguments.answers :]
    guard, url = spawn_guard(arguments.judge)
    # RAGTruth QA has several answers per context: an answer whose context the service embedded before
    # is timed warm (its context sentences come from the encoder's cache), the first of a context cold.
    seen = {warm_up["context"]}

    async def timed(sample: dict[str, Any]) -> tuple[float, bool]:
        cold = sample["context"] not in seen
        seen.add(sample["context"])
        return await verify(http, url, sample), cold

    async with aiohttp.ClientSession() as http:
        load_s = await verify(http, url, warm_up)
        sequential = [await timed(sample) for sample in samples]
        queue = list(parallel)
        concurrent: list[tuple[float, bool]] = []

        async def client() -> None:
            while queue:
                concurrent.append(await timed(queue.pop()))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(arguments.concurrency)))
        per_second = len(parallel) / (time.perf_counter() - started)
    stop(guard)

    text = warm_up["answer"]
    pieces = [text[i : i + 8] for i in range(0, len(text), 8)]
    runner = web.AppRunner(stand_in(pieces))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    upstream = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    proxy, proxy_url = spawn_guard(arguments.judge, "--upstream", upstream)
    relay, relay_url = spawn([sys.executable, str(Path(__file__).with_name("relay.py")), upstream])
    direct: list[tuple[float, float]] = []
    relayed: list[tuple[float, float]] = []
    proxied: list[tuple[float, float]] = []
    async with aiohttp.ClientSession() as http:
        await stream_timings(http, proxy_url + "/v1", warm_up["context"])  # warm-ups
        await stream_timings(http, relay_url + "/v1", warm_up["context"])
        for _ in range(arguments.streams):  # alternate, so drift in machine load hits all alike
            direct.append(await stream_timings(http, upstream, warm_up["context"]))
            relayed.append(await stream_timings(http, relay_url + "/v1", warm_up["context"]))
            proxied.append(await stream_timings(http, proxy_url + "/v1", warm_up["context"]))
    stop(proxy)
    stop(relay)
    await runner.cleanup()

    def p50_ms(values: list[float]) -> str:
        return f"{1000 * statistics.median(values):.1f}"

    firsts, lasts = [d[0] for d in direct], [d[1] for d in direct]
    first_relayed, last_relayed = [r[0] for r in relayed], [r[1] for r in relayed]
    first_proxied, last_proxied = [p[0] for p in proxied], [p[1] for p in proxied]
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    record(
        f"Guardrail service (rt4 guard, judge {arguments.judge or 'embedded'})",
        [
            f"Input: the first {len(loaded)} answers of RAGTruth QA test (1 warm-up, {len(samples)} one at a time, "
            f"{len(parallel)} others at once); judge: {arguments.judge or 'embedded (default)'}; HTTP over 127.0.0.1, "
            "the service in its own process, the stand-in upstream in the benchmark's.",
            "",
            "| what | figure |",
            "|---|---|",
            f"| first request after start-up (warm-up) | {load_s:.2f} s |",
            *latency_rows("one at a time", sequential),
            *latency_rows(f"{arguments.concurrency} clients at once", concurrent),
            f"| answers per second, {arguments.concurrency} clients at once | {per_second:.2f} |",
            "| streamed reply, first token (p50): direct / bare relay / proxy | "
            f"{p50_ms(firsts)} / {p50_ms(first_relayed)} / {p50_ms(first_proxied)} ms |",
            "| streamed reply, last token (p50): direct / bare relay / proxy | "
            f"{p50_ms(lasts)} / {p50_ms(last_relayed)} / {p50_ms(last_proxied)} ms |",
            "",
            f"Stream: {len(pieces)} chunks of 8 characters from a stand-in upstream that answers at once, "
            f"{arguments.streams} streams each way, alternating; the bare relay (evals/bench/relay.py) is one more "
            f"aiohttp hop that does nothing else. Machine load when done (1/5/15 min): {load}. "
            "Targets of issue 43: embedded verdict p50 <= 100 ms "
            "per answer; proxy p50 added in pass-through <= 5 ms; first token unchanged within noise.",
        ],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answers", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--judge", default=None, help="judge spec (default: the embedded judge)")
    asyncio.run(main(parser.parse_args()))
