"""Throughput of a judge on a local OpenAI-compatible server that answers after 250 ms, at
concurrency 32, over each transport (the OpenAI-compatible aiohttp one and litellm), vs the ideal
32 / 0.25 s = 128 calls/s and vs a bare aiohttp client posting the same calls (targets: litellm
>= 80% of the ideal; the OpenAI-compatible transport >= 95% of bare aiohttp).

    python evals/bench/litellm_throughput.py [--calls 2048] [--concurrency 32] [--latency-ms 250] [--repeats 3]

Throughput is a steady-state rate: 2048 calls are 64 rounds per slot, so the start (every slot
released at once, their replies arriving in one burst) and the drain (the last calls finishing
while other slots idle) weigh little. Shorter runs report less for that reason (try --calls 512).
Runs on a shared 2-core machine vary by several percent, so the median of --repeats runs counts;
the transports and the bare client take turns within each repeat, so a slower spell of the machine
weighs on all of them alike.

The server is the project's fault-injecting test server (tests/faults.py) answering every call
correctly after the fixed latency; it runs in a child process so its threads do not compete with
the client for the interpreter lock. Requests are real verification requests of the examples.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import aiohttp
from conftest import TRANSPORTS, judge_over
from faults import fault_server, judge_every_claim
from results import record

from rt4chart.judges.registry import resolve_judge
from rt4chart.protocol import JudgeRequest
from rt4chart.records.io import read_jsonl
from rt4chart.runs.engine import Pipeline
from rt4chart.runs.planning import planned_requests

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "answers.jsonl"


def serve(latency_s: float, address: multiprocessing.Queue[str], stop: multiprocessing.Event) -> None:  # type: ignore[type-arg]
    with fault_server(judge_every_claim("baseless")) as server:
        server.latency_s = latency_s
        address.put(server.base_url)
        stop.wait()


def verification_requests(count: int) -> list[JudgeRequest]:
    backend = resolve_judge(f"scripted:{Path(__file__).with_name('empty_rules.json')}")
    pipeline = Pipeline(backend)
    planned = [
        request
        for item in read_jsonl(EXAMPLES)
        if item.sample is not None
        for request in planned_requests(pipeline, item.sample)
        if request.task == "verify"
    ]
    return (planned * (count // len(planned) + 1))[:count]


async def measure(
    judge: str, base_url: str, requests: list[JudgeRequest], concurrency: int
) -> tuple[float, float, int]:
    """Wall seconds, client CPU seconds and schema-valid replies of the calls."""
    backend = resolve_judge(judge, api_base=base_url, concurrency=concurrency)
    # Imports and opening one connection per slot are set-up, not throughput.
    await asyncio.gather(*(backend.complete(request) for request in requests[:concurrency]))
    started, cpu_started = time.perf_counter(), time.process_time()
    responses = await asyncio.gather(*(backend.complete(request) for request in requests))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    await backend.aclose()
    return elapsed, cpu, sum(response.parsed is not None for response in responses)


async def measure_bare(base_url: str, requests: list[JudgeRequest], concurrency: int) -> float:
    """Wall seconds of the same calls posted by a bare aiohttp client: the server's own ceiling."""
    bodies = [
        json.dumps({"model": "bench", "messages": [m.model_dump() for m in request.messages]})
        for request in requests
    ]
    slots = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json"}) as session:

        async def post(body: str) -> None:
            async with slots, session.post(f"{base_url}/chat/completions", data=body) as response:
                await response.read()

        await asyncio.gather(*(post(body) for body in bodies[:concurrency]))
        started = time.perf_counter()
        await asyncio.gather(*(post(body) for body in bodies))
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2048)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency-ms", type=float, default=250.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    address: multiprocessing.Queue[str] = multiprocessing.Queue()
    stop = multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=(args.latency_ms / 1000, address, stop), daemon=True)
    server.start()
    runs: dict[str, list[tuple[float, float, int]]] = {transport: [] for transport in TRANSPORTS}
    bare: list[float] = []
    try:
        base_url = address.get(timeout=60)
        requests = verification_requests(args.calls)
        with tempfile.TemporaryDirectory() as scratch:
            judges = {transport: judge_over(transport, "openai/bench", Path(scratch)) for transport in TRANSPORTS}
            for _ in range(args.repeats):
                for transport, judge in judges.items():
                    runs[transport].append(asyncio.run(measure(judge, base_url, requests, args.concurrency)))
                bare.append(asyncio.run(measure_bare(base_url, requests, args.concurrency)))
    finally:
        stop.set()
        server.join(timeout=10)
    ideal = args.concurrency / (args.latency_ms / 1000)
    bare_rate = statistics.median(args.calls / elapsed for elapsed in bare)
    rows = []
    # Each run's throughput as a share of the bare client's in the same repeat.
    of_bare = {
        transport: statistics.median(seconds / elapsed for (elapsed, _, _), seconds in zip(runs[transport], bare,
                                                                                           strict=True))
        for transport in TRANSPORTS
    }
    for transport in TRANSPORTS:
        rate = statistics.median(args.calls / elapsed for elapsed, _, _ in runs[transport])
        cpu_ms = statistics.median(cpu / args.calls * 1000 for _, cpu, _ in runs[transport])
        rows.append(f"| {transport} | {rate:.1f} | {rate / ideal:.0%} | {of_bare[transport]:.1%} | {cpu_ms:.2f} | "
                    f"{min(valid for _, _, valid in runs[transport])} |")
    lean_share = of_bare["openai-compatible"]
    record(
        "Judge throughput against a local server (both transports, bare aiohttp)",
        [
            f"{args.calls} verification calls through `resolve_judge(\"openai/bench\", api_base=...)` over each "
            f"transport (litellm: the same profile with `api = \"litellm\"`) on a local OpenAI-compatible server "
            f"answering after {args.latency_ms:g} ms, concurrency {args.concurrency}, {args.repeats} repeats, the "
            "transports and a bare aiohttp client taking turns in each. The machine is shared with other work: "
            "the ratios to the bare client of the same repeat are the figures.",
            "",
            "| transport | median calls/s | of the ideal | of bare aiohttp (median of repeats) | client CPU ms/call "
            "| schema-valid replies (min) |",
            "|---|---:|---:|---:|---:|---:|",
            *rows,
            f"| bare aiohttp | {bare_rate:.1f} | {bare_rate / ideal:.0%} | 100% | | |",
            "",
            f"**OpenAI-compatible transport: {lean_share:.1%} of bare aiohttp's throughput** (target >= 95%: "
            f"{'met' if lean_share >= 0.95 else 'NOT met'}).",
            "",
            "Client CPU per call is the benchmark process's CPU over the timed calls, divided by the calls. "
            f"Replies arrive in bursts of up to {args.concurrency}, and each is processed on the one "
            "event loop before its slot sends the next request, so every millisecond of per-call CPU "
            "delays the calls behind it. Over litellm most of that CPU is litellm's own per-call work "
            "(logging object, response cost calculation, the OpenAI SDK's request and response models); "
            "rt4chart's part (arguments, parsing, retries) is small next to it. To see the split: "
            "`py-spy record -f raw -o profile.txt -- python evals/bench/litellm_throughput.py`.",
        ],
    )


if __name__ == "__main__":
    main()
