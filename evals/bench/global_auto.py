"""Calls and prompt tokens per sample: the paper's full global stage vs skipping it for one-chunk contexts.

    python evals/bench/global_auto.py [--samples 525]

Runs the pipeline over RAGTruth QA dev against a recording OpenAI-compatible server on 127.0.0.1
(``tests/faults.py``), which answers every decomposition with one claim per sentence and every
verification with ``baseless`` (no evidence, so no re-asks), and records every request it gets.
Calls are the requests the server received; prompt tokens are counted with gpt-4o-mini's tokenizer
(litellm) on the exact messages sent.

Two ways:
- ``full``: the paper's global stage for every sample (rt4chart's default);
- ``skip one-chunk``: ``--global-auto``, no global call when the context fits one window
  (W=25, O=10), the full stage otherwise.

RAGAS Faithfulness (2 calls, about 1,900 prompt tokens per sample on this data) and DeepEval
Faithfulness (4 calls, about 2,200) are reference points quoted from issue 11, not measured here.
Verdict quality is not measured: the server's verdicts are fixed, so only the request counts and
sizes are meaningful.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from results import record
from workload import bench_inputs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from faults import claims_in, fault_server

from rt4chart.judges.registry import judge_stack
from rt4chart.method.text import chunk_sentences, segment_context
from rt4chart.options import AuditOptions
from rt4chart.records.io import InputLine
from rt4chart.runs.engine import Pipeline

TOKENIZER_MODEL = "gpt-4o-mini"
QUOTED = (("RAGAS Faithfulness", 2, 1900), ("DeepEval Faithfulness", 4, 2200))
"""(name, calls, prompt tokens) per sample on RAGTruth QA, as quoted in issue 11."""


def reply(body: dict[str, Any]) -> str:
    """One claim per answer sentence for decomposition; ``baseless`` for every claim otherwise."""
    schema = body.get("response_format", {}).get("json_schema", {}).get("name")
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if schema == "DecomposeOutput":
        listing = user.rsplit("Answer sentences:\n", 1)[-1].splitlines()
        sentences = [line.split("] ", 1) for line in listing if line.startswith("[") and "] " in line]
        entries = [{"sentence": int(number[1:]), "claims": [text]} for number, text in sentences]
        return json.dumps({"sentences": entries})
    judgements = [{"claim": position, "label": "baseless", "evidence": [], "rationale": "recorded", "confidence": 0.5}
                  for position in range(len(claims_in(body)))]
    return json.dumps({"judgements": judgements})


async def audit(url: str, items: list[InputLine], global_auto: bool) -> None:
    stack = judge_stack("openai/recorder", api_base=url)
    try:
        async for _ in Pipeline(stack, AuditOptions(global_auto=global_auto, samples_in_flight=8)).run(items):
            pass
    finally:
        await stack.aclose()


def measure(items: list[InputLine], skip_one_chunk: bool) -> tuple[int, int]:
    """(calls, prompt tokens) the server received for ``items`` (``--global-auto`` or the full stage)."""
    with fault_server(reply) as server:
        asyncio.run(audit(server.base_url, items, skip_one_chunk))
        bodies = list(server.requests)
    tokens = sum(int(litellm.token_counter(model=TOKENIZER_MODEL, messages=b["messages"])) for b in bodies)
    return len(bodies), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=525)
    arguments = parser.parse_args()
    items, source = bench_inputs(arguments.samples)
    n = len(items)
    single = sum(len(chunk_sentences(len(segment_context(i.sample.context)[1]), 25, 10)) <= 1
                 for i in items if i.sample is not None)
    rows = []
    for name, skip in (("full global stage (paper, default)", False), ("skip global for one-chunk contexts", True)):
        calls, tokens = measure(items, skip)
        rows.append(f"| {name} | {calls / n:.2f} | {tokens / n:,.0f} | measured |")
    lines = [
        f"Inputs: {source}; {single} of {n} contexts fit one window (W=25, O=10).",
        "Judge: a recording OpenAI-compatible server on 127.0.0.1 (decomposition: one claim per sentence; "
        "verification: baseless, so no re-asks); tokens by gpt-4o-mini's tokenizer on the exact messages.",
        "The skip row is rt4chart's --global-auto.",
        "",
        "| way | calls / sample | prompt tokens / sample | source |",
        "|---|---:|---:|---|",
        *rows,
        *(f"| {name} | {calls} | ~{tokens:,} | quoted from issue 11, not measured here |"
          for name, calls, tokens in QUOTED),
    ]
    record("Global stage: full vs skipped for one-chunk contexts", lines)


if __name__ == "__main__":
    main()
