"""Rounds of a batch audit (`rt4 verify --batch`) against the Batch API stand-in (tests/batch_server.py):
how many batches N samples take and how many requests each holds, for several --samples-in-flight,
beside the online run's calls and cost on the same judge (a priced profile; the stand-in answers
each line as the online server would, so the records are the same).

    python evals/bench/batch_rounds.py --samples 40 --in-flight 40 10
        (the first N RAGTruth QA dev answers when the data is there, else synthetic two-sentence answers)
    python evals/bench/batch_rounds.py --provider anthropic --samples 40 --in-flight 40 [--cache-minimum 1024]
        (an anthropic/ judge: online through litellm's /v1/messages, batched through Message Batches,
        against tests/anthropic_batch_server.py, whose prompt cache model reports cache reads and writes)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from anthropic_batch_server import anthropic_batch_server  # noqa: E402
from batch_server import batch_server  # noqa: E402
from faults import sentences_as_claims_grounded  # noqa: E402

from rt4chart.analysis.datasets import default_data_dir, load_dataset  # noqa: E402

PROFILE = (
    'name = "priced"\nmodel = "openai/fault"\napi = "openai-compatible"\n'
    "input_usd_per_mtok = 0.15\noutput_usd_per_mtok = 0.60\n"
)
"""gpt-4o-mini's online prices on a judge served by the stand-in."""

ANTHROPIC_PROFILE = (
    'name = "priced"\nmodel = "anthropic/claude-fault"\nresponse_format = "json_schema"\n'
    "input_usd_per_mtok = 3.0\noutput_usd_per_mtok = 15.0\n"
)
"""Claude Sonnet 4.5's online prices (cache reads 0.1x, writes 1.25x by default) on the Anthropic stand-in."""


def write_inputs(path: Path, count: int) -> str:
    """The first ``count`` RAGTruth QA dev answers, else synthetic ones; returns which."""
    dev = default_data_dir() / "ragtruth-qa"
    if (dev / "dev.jsonl").is_file():
        samples = load_dataset("ragtruth-qa", dev, "dev", count)
        path.write_text("".join(s.model_dump_json(exclude={"gold"}) + "\n" for s in samples), encoding="utf-8")
        return f"the first {count} RAGTruth QA dev answers"
    rows = [{"id": f"s{n}", "context": f"Store {n} opens at 9 am. It sells bread.",
             "answer": f"Store {n} opens at 9 am. It also sells cakes."} for n in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return f"{count} synthetic two-sentence answers"


def run(inputs: Path, profile: Path, out: Path, base_url: str, *extra: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "rt4chart", "verify", str(inputs), "--judge", str(profile), "--api-base", base_url,
         "--no-cache", "--fail-on", "never", "--quiet", "--out", str(out), *extra],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return time.perf_counter() - started


def usage(out: Path, field: str) -> float:
    return sum(json.loads(line)["usage"][field] for line in out.read_text(encoding="utf-8").splitlines())


def requests_in(batch: dict[str, Any]) -> int:
    """The requests a batch holds (OpenAI's ``total``, or the sum of Anthropic's counts)."""
    counts = batch["request_counts"]
    return int(counts["total"]) if "total" in counts else sum(int(n) for n in counts.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[40, 10])
    parser.add_argument("--provider", choices=("openai", "anthropic"), default="openai")
    parser.add_argument("--cache-minimum", type=int, default=1024,
                        help="anthropic: the shortest prefix the stand-in caches, in its tokens (Sonnet's 1,024)")
    args = parser.parse_args()
    anthropic = args.provider == "anthropic"
    serve = anthropic_batch_server if anthropic else batch_server
    rows: list[dict[str, Any]] = []
    with TemporaryDirectory() as scratch:
        folder = Path(scratch)
        inputs, profile = folder / "in.jsonl", folder / "priced.toml"
        profile.write_text(ANTHROPIC_PROFILE if anthropic else PROFILE, encoding="utf-8")
        source = write_inputs(inputs, args.samples)
        for in_flight in args.in_flight:
            flight = ("--samples-in-flight", str(in_flight))
            with serve(sentences_as_claims_grounded) as server:
                if anthropic:
                    server.min_cached_tokens = args.cache_minimum
                base_url = server.origin if anthropic else server.base_url
                online_s = run(inputs, profile, folder / "online.jsonl", base_url, *flight)
                if anthropic:
                    server.cached_prefixes.clear()  # the batch run's cache starts empty, as the online run's did
                batch_s = run(inputs, profile, folder / "batch.jsonl", base_url, *flight,
                              "--batch", "--batch-poll", "0.05")
            rows.append({
                "in_flight": in_flight, "online_calls": len(server.online),
                "rounds": len(server.created_batches),
                "requests_per_round": [requests_in(b) for b in server.created_batches],
                "lines": sum(server.submitted.values()), "most_submissions": max(server.submitted.values()),
                "online_usd": usage(folder / "online.jsonl", "cost_usd"),
                "batch_usd": usage(folder / "batch.jsonl", "cost_usd"),
                "cache": [usage(folder / "batch.jsonl", field) for field in
                          ("prompt_tokens", "cached_prompt_tokens", "cache_write_prompt_tokens")],
                "online_s": online_s, "batch_s": batch_s,
            })
    print(f"`{' '.join(['python', 'evals/bench/batch_rounds.py', *sys.argv[1:]])}` on {source}:\n")
    print("| samples in flight | online calls | batch rounds | requests per round | batch lines (most submissions"
          " of one) | online USD | batch USD | online s | batch s (poll 0.05 s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['in_flight']} | {row['online_calls']} | {row['rounds']} | {row['requests_per_round']} | "
              f"{row['lines']} ({row['most_submissions']}) | {row['online_usd']:.6f} | {row['batch_usd']:.6f} | "
              f"{row['online_s']:.1f} | {row['batch_s']:.1f} |")
    if anthropic:
        print("\n| samples in flight | prompt tokens | read from the cache | written to it |\n|---|---|---|---|")
        for row in rows:
            prompt, read, written = row["cache"]
            print(f"| {row['in_flight']} | {prompt:.0f} | {read:.0f} ({read / prompt:.1%}) | "
                  f"{written:.0f} ({written / prompt:.1%}) |")


if __name__ == "__main__":
    main()
