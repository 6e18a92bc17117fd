"""Adaptive vs fixed concurrency against a server that enforces a requests- and tokens-per-window limit.

    python evals/bench/rate_limit.py [--samples 100] [--requests 40] [--tokens 60000] [--window 1.0]

``rt4 verify --decomposer rules --no-global --concurrency 32`` of RAGTruth QA dev samples against
the fault server of tests/faults.py with a :class:`faults.RateLimit` (a window of ``--window``
seconds stands in for a provider's minute; each request is charged its prompt, approximated as
characters / 4, plus its ``max_tokens``, as OpenAI counts at admission; 429s carry Retry-After,
retry-after-ms and x-ratelimit-* headers, every answer the x-ratelimit-* headers). Once with the
judge profile's ``adaptive_concurrency = false`` (32 calls in flight, today's behaviour before the
pacer), once with the default adaptive pacer under the same ceiling. Counted at the server:
requests admitted and refused, the most held at once; throughput as a share of the limit is the
admitted requests per window (over the windows from the first request to the last answer) over
the request limit, and the admitted tokens over the token limit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from faults import RateLimit, fault_server, grounded
from results import record
from workload import bench_inputs

CEILING = 32


def prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt's tokens as the server charges them: characters / 4 (no tokenizer of the judge's)."""
    return sum(len(str(message.get("content") or "")) for message in body.get("messages", [])) // 4


def profile(path: Path, base_url: str, *, adaptive: bool) -> Path:
    path.write_text(
        f'name = "limited"\nmodel = "openai/limited"\napi_base = "{base_url}"\nconcurrency = {CEILING}\n'
        f"adaptive_concurrency = {'true' if adaptive else 'false'}\n"
        "max_attempts = 50\nbackoff_s = 0.05\nbackoff_max_s = 10.0\n",
        encoding="utf-8",
    )
    return path


def run(inputs: Path, work: Path, args: argparse.Namespace, *, adaptive: bool) -> dict[str, float]:
    limit = RateLimit(requests=args.requests, tokens=args.tokens, window_s=args.window)
    with fault_server(grounded) as server:
        server.prompt_tokens = prompt_tokens
        server.latency_s = args.latency
        judge = profile(work / f"judge-{adaptive}.toml", server.base_url, adaptive=adaptive)
        out = work / f"out-{adaptive}.jsonl"
        command = [sys.executable, "-m", "rt4chart", "verify", str(inputs), "--out", str(out), "--judge", str(judge),
                   "--decomposer", "rules", "--no-global", "--no-cache", "--concurrency", str(CEILING), "-q"]
        server.rate_limit = limit
        limit.started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        elapsed = time.monotonic() - limit.started
        if done.returncode not in (0, 1):
            raise SystemExit(f"rt4 verify failed ({done.returncode}): {done.stderr[-2000:]}")
        held = server.max_in_flight
    windows = max(limit.admitted_per_window) - min(limit.admitted_per_window) + 1
    return {
        "admitted": limit.admitted,
        "refused": limit.refused,
        "held": held,
        "seconds": elapsed,
        "request_share": limit.admitted / (windows * limit.requests),
        "token_share": limit.tokens_admitted / (windows * limit.tokens),
        "refused_share": limit.refused / max(1, limit.admitted + limit.refused),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--requests", type=int, default=40, help="requests admitted per window")
    parser.add_argument("--tokens", type=int, default=60_000, help="tokens admitted per window")
    parser.add_argument("--window", type=float, default=1.0, help="seconds per window (a provider's minute)")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the server takes per admitted answer")
    args = parser.parse_args()
    items, source = bench_inputs(args.samples)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        inputs = work / "in.jsonl"
        inputs.write_text("".join(item.sample.model_dump_json() + "\n" for item in items if item.sample), "utf-8")
        fixed = run(inputs, work, args, adaptive=False)
        adaptive = run(inputs, work, args, adaptive=True)
    rows = [
        f"| {name} | {r['admitted']:.0f} | {r['refused']:.0f} | {r['refused_share']:.1%} | {r['request_share']:.1%} "
        f"| {r['token_share']:.1%} | {r['held']:.0f} | {r['seconds']:.1f} |"
        for name, r in (("fixed 32", fixed), ("adaptive, ceiling 32", adaptive))
    ]
    record(
        "Concurrency against a rate limit: adaptive vs fixed 32",
        [
            f"Input: {source}; `rt4 verify --decomposer rules --no-global --concurrency {CEILING}` against the "
            f"fault server enforcing {args.requests} requests and {args.tokens:,} tokens (prompt characters / 4 + "
            f"max_tokens) per {args.window:g} s window (a provider's minute, scaled), answering in {args.latency:g} s.",
            "",
            "| concurrency | calls admitted | 429s | share refused | requests / limit | tokens / limit "
            "| most in flight | seconds |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            "Shares of the limit are taken over the windows from the first admitted request to the last; "
            "the token share counts what the server charged at admission. Counted at the server.",
        ],
    )
    print(json.dumps({"fixed": fixed, "adaptive": adaptive}))


if __name__ == "__main__":
    main()
