"""The share of prompt tokens that sit in a cacheable prefix, as rt4chart sends its calls.

    python evals/prefix_cache.py [--samples 200] [--input JSONL] [--label NAME]

``rt4 verify --decomposer rules --no-cache --concurrency 1 --samples-in-flight 1`` of RAGTruth QA
dev samples ($RT4_DATA_DIR), or the first samples of ``--input`` (e.g. a long-context set built by
evals/long_context/build.py), against the fault server of tests/faults.py (it records every request;
it answers entailed with a quote where the context holds the claim word for word, else baseless).
Each request's messages are tokenised with o200k_base (gpt-4o-mini's encoding; tiktoken reads the
file litellm ships, no network), role names and message boundaries as one token each (a stand-in
for the chat template). In arrival order, with an ideal cache that keeps every earlier prompt:

- OpenAI's rule: a prompt's longest prefix an earlier prompt shares is cached if at least 1,024
  tokens, counted down to 1,024 + a multiple of 128;
- vLLM's rule (automatic prefix caching): the leading 16-token blocks whose whole prefix an earlier
  prompt holds.

No model is called and the judge-decomposer's calls are not in it (``--decomposer rules``): what
is measured is the local and global verification calls and their re-asks. Run it on another
checkout (``PYTHONPATH=/path/to/checkout``) to measure that checkout's prompts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tiktoken

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))

from faults import fault_server, grounded
from results import record
from workload import bench_inputs

OPENAI_MINIMUM = 1024
OPENAI_STEP = 128
VLLM_BLOCK = 16


def litellm_tiktoken_dir() -> str:
    import litellm

    return str(Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers")


def prompt_tokens(body: dict[str, Any], encoding: tiktoken.Encoding) -> list[int]:
    """A request's messages as one token sequence: per message a role marker, its content, an end marker."""
    markers = {"system": -1, "user": -2, "assistant": -3}
    tokens: list[int] = []
    for message in body["messages"]:
        tokens.append(markers.get(message["role"], -4))
        tokens.extend(encoding.encode(str(message.get("content") or ""), disallowed_special=()))
        tokens.append(-5)
    return tokens


def block_hashes(tokens: list[int]) -> Iterator[int]:
    """The hash of each whole 16-token prefix block chain (vLLM's prefix-cache key: a block's key
    covers every token before it)."""
    chained = 0
    for start in range(0, len(tokens) - VLLM_BLOCK + 1, VLLM_BLOCK):
        chained = hash((chained, tuple(tokens[start : start + VLLM_BLOCK])))
        yield chained


def cacheable(prompts: list[list[int]]) -> tuple[int, int, int]:
    """Total prompt tokens, and those cached under OpenAI's rule and vLLM's, in sending order."""
    seen: set[int] = set()
    total = openai = vllm = 0
    for tokens in prompts:
        hashes = list(block_hashes(tokens))
        shared_blocks = 0
        for key in hashes:
            if key not in seen:
                break
            shared_blocks += 1
        shared = shared_blocks * VLLM_BLOCK  # 1,024 and 128 are whole blocks: OpenAI's count is below it
        total += len(tokens)
        vllm += shared
        if shared >= OPENAI_MINIMUM:
            openai += OPENAI_MINIMUM + (shared - OPENAI_MINIMUM) // OPENAI_STEP * OPENAI_STEP
        seen.update(hashes)
    return total, openai, vllm


def requests_sent(samples: int, given: Path | None, work: Path) -> tuple[list[dict[str, Any]], str]:
    inputs = work / "in.jsonl"
    if given is None:
        items, source = bench_inputs(samples)
        inputs.write_text("".join(item.sample.model_dump_json() + "\n" for item in items if item.sample), "utf-8")
    else:
        lines = given.read_text("utf-8").splitlines(keepends=True)[:samples]
        inputs.write_text("".join(lines), "utf-8")
        source = f"the first {len(lines)} samples of {given.name}"
    with fault_server(grounded) as server:
        command = [sys.executable, "-m", "rt4chart", "verify", str(inputs), "--out", str(work / "out.jsonl"),
                   "--judge", "openai/stand-in", "--api-base", server.base_url, "--decomposer", "rules", "--no-cache",
                   "--concurrency", "1", "--samples-in-flight", "1", "-q"]
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              env={**os.environ, "OPENAI_API_KEY": "no-key"})
        if done.returncode not in (0, 1):
            raise SystemExit(f"rt4 verify failed ({done.returncode}): {done.stderr[-2000:]}")
        return list(server.requests), source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--input", type=Path, help="an rt4chart input JSONL (default: RAGTruth QA dev)")
    parser.add_argument("--label", default="this checkout", help="names the prompts measured (the section title)")
    args = parser.parse_args()
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", litellm_tiktoken_dir())
    encoding = tiktoken.get_encoding("o200k_base")
    with tempfile.TemporaryDirectory() as scratch:
        bodies, source = requests_sent(args.samples, args.input, Path(scratch))
    total, openai, vllm = cacheable([prompt_tokens(body, encoding) for body in bodies])
    record(
        f"Cacheable prompt prefixes: {args.label}",
        [
            f"Input: {source}; {len(bodies):,} verification calls (`--decomposer rules`, global stage on), "
            f"{total:,} prompt tokens (o200k_base), in sending order, every earlier prompt cached.",
            "",
            "| rule | cacheable prompt tokens | share |",
            "|---|---|---|",
            f"| OpenAI (>= 1,024 tokens, 128-token steps) | {openai:,} | {openai / total:.1%} |",
            f"| vLLM (16-token blocks) | {vllm:,} | {vllm / total:.1%} |",
        ],
    )


if __name__ == "__main__":
    main()
