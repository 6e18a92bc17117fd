"""Rounds of a batch audit (`rt4 verify --batch`) against the Batch API stand-in (tests/batch_server.py):
how many batches N samples take and how many requests each holds, for several --samples-in-flight,
beside the online run's calls and cost on the same judge (a priced profile; the stand-in answers
each line as the online server would, so the records are the same).

    python evals/bench/batch_rounds.py --samples 40 --in-flight 40 10
        (the first N RAGTruth QA dev answers when the data is there, else synthetic two-sentence answers)
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

from batch_server import batch_server  # noqa: E402
from faults import sentences_as_claims_grounded  # noqa: E402

from rt4chart.analysis.datasets import default_data_dir, load_dataset  # noqa: E402

PROFILE = (
    'name = "priced"\nmodel = "openai/fault"\napi = "openai-compatible"\n'
    "input_usd_per_mtok = 0.15\noutput_usd_per_mtok = 0.60\n"
)
"""gpt-4o-mini's online prices on a judge served by the stand-in."""


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


def cost(out: Path) -> float:
    return sum(json.loads(line)["usage"]["cost_usd"] for line in out.read_text(encoding="utf-8").splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[40, 10])
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with TemporaryDirectory() as scratch:
        folder = Path(scratch)
        inputs, profile = folder / "in.jsonl", folder / "priced.toml"
        profile.write_text(PROFILE, encoding="utf-8")
        source = write_inputs(inputs, args.samples)
        for in_flight in args.in_flight:
            flight = ("--samples-in-flight", str(in_flight))
            with batch_server(sentences_as_claims_grounded) as server:
                online_s = run(inputs, profile, folder / "online.jsonl", server.base_url, *flight)
                batch_s = run(inputs, profile, folder / "batch.jsonl", server.base_url, *flight,
                              "--batch", "--batch-poll", "0.05")
            rows.append({
                "in_flight": in_flight, "online_calls": len(server.online),
                "rounds": len(server.created_batches),
                "requests_per_round": [b["request_counts"]["total"] for b in server.created_batches],
                "lines": sum(server.submitted.values()), "most_submissions": max(server.submitted.values()),
                "online_usd": cost(folder / "online.jsonl"), "batch_usd": cost(folder / "batch.jsonl"),
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


if __name__ == "__main__":
    main()
