"""``rt4 guard`` with a cascade: the share of requests its local stage settles within a latency budget.

    python evals/bench/guard_cascade.py --answers 40 --budget-ms 200 --threshold 0.8

Starts a stand-in second-stage judge on 127.0.0.1 (an OpenAI-compatible chat endpoint that answers
only after ``--llm-delay-ms``, as a hosted LLM does; within the budget its reply never arrives) and
``rt4 guard --judge cascade:embedded@T,hosted_vllm/stand-in --api-base URL --latency-budget-ms B`` in
its own process, then sends RAGTruth QA test answers one at a time (after one warm-up). A request
is *settled locally within the budget* when no claim of it was cut by the budget (the embedded stage
was confident about every claim, so no later stage was needed) and its reply came within B ms.
Prints the shares and the latency, with the command, and records them in RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from guard import answers, spawn_guard, stop
from results import record


def slow_judge(delay_s: float) -> web.Application:
    """A chat endpoint that answers after ``delay_s`` (what it answers is never read in time)."""

    async def completions(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(delay_s)
        return web.json_response({"id": "c", "object": "chat.completion", "created": 1, "model": "stand-in",
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "{}"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    return app


async def verify(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    async with http.post(url + "/v1/verify", json=body) as response:
        reply = await response.json()
        assert response.status == 200, (response.status, reply)
    return time.perf_counter() - started, reply


def cut(reply: dict[str, Any]) -> bool:
    """Whether the budget ran out before a later stage settled some claim (the record says so)."""
    return any("latency budget of" in error for error in reply["record"].get("errors", []))


async def main(arguments: argparse.Namespace) -> None:
    runner = web.AppRunner(slow_judge(arguments.llm_delay_ms / 1000))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    api_base = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    judge = f"cascade:embedded@{arguments.threshold},hosted_vllm/stand-in"
    guard, url = spawn_guard(judge, "--api-base", api_base, "--latency-budget-ms", str(arguments.budget_ms))
    loaded = answers(1 + arguments.answers)
    timings: list[tuple[float, bool]] = []
    async with aiohttp.ClientSession() as http:
        await verify(http, url, loaded[0])  # the warm-up: the encoder loads on the first request
        for sample in loaded[1:]:
            seconds, reply = await verify(http, url, sample)
            timings.append((seconds, cut(reply)))
    stop(guard)
    await runner.cleanup()

    budget_s = arguments.budget_ms / 1000
    local = [seconds for seconds, was_cut in timings if not was_cut]
    in_time = sum(seconds <= budget_s for seconds in local)
    n = len(timings)
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())
    record(
        f"Guardrail service with a cascade (judge {judge}, latency budget {arguments.budget_ms} ms)",
        [
            f"Input: answers 2-{n + 1} of RAGTruth QA test, one at a time after one warm-up; "
            f"the second stage a stand-in on 127.0.0.1 answering after {arguments.llm_delay_ms} ms.",
            "",
            "| what | figure |",
            "|---|---|",
            f"| requests settled locally within {arguments.budget_ms} ms | {in_time} of {n} ({in_time / n:.1%}) |",
            f"| requests settled locally, any time | {len(local)} of {n} ({len(local) / n:.1%}) |",
            f"| requests with claims cut by the budget (recorded, decision at least flag) | {n - len(local)} of {n} |",
            f"| latency p50, all requests | {1000 * statistics.median(s for s, _ in timings):.0f} ms |",
            f"| latency p50, settled locally | {1000 * statistics.median(local):.0f} ms |" if local else "| - | - |",
            "",
            "Under a latency budget `rt4 guard` decomposes by rules (`auto` would hand decomposition to the slow "
            "stage, outside the budget), so a request waits for the embedded stage and, when it escalates, for the "
            "budget at most.",
            f"Machine load when done (1/5/15 min): {load}.",
        ],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=40)
    parser.add_argument("--budget-ms", type=int, default=200)
    parser.add_argument("--threshold", type=float, default=0.8, help="the embedded stage's confidence to settle")
    parser.add_argument("--llm-delay-ms", type=int, default=1000)
    asyncio.run(main(parser.parse_args()))
