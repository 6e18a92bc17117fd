"""Cost side by side: rt4chart, RAGAS faithfulness and DeepEval faithfulness on the same answers.

    python evals/bench/cost_side_by_side.py [--samples 100] [--peers-python /work/venv-peers/bin/python]

Audits the first ``--samples`` RAGTruth QA dev answers ($RT4_DATA_DIR) with each tool against one
recording OpenAI-compatible stand-in on 127.0.0.1 (the fault server of tests/faults.py, faults off)
and reports, per tool: calls, prompt tokens, completion tokens, the prompt tokens that sit in a
cacheable prefix under OpenAI's rule (evals/prefix_cache.py: an ideal cache of every earlier prompt
of the same tool, >= 1,024 shared tokens in 128-token steps) and their share under vLLM's block
rule, and the price at gpt-4o-mini's rates from litellm's price list, as sent and with the
cacheable tokens at the cached-input rate.

- rt4chart: ``rt4 verify`` with its defaults (judge decomposer, global stage) and with
  ``--decomposer rules``, ``--no-cache --concurrency 1 --samples-in-flight 1`` so calls arrive in
  one order every run;
- rt4chart ``--batch`` (default decomposer, every sample in flight) through the Batch API stand-in
  of tests/batch_server.py, which answers each line as the online server would; its lines are
  counted in submission order and priced at half of each rate (the Batch API's discount);
- RAGAS ``Faithfulness`` and DeepEval ``FaithfulnessMetric`` by evals/bench/peer_faithfulness.py
  in the peers' own virtual environment (``--peers-python``; RAGAS and DeepEval are no rt4chart
  dependency), samples one after another. That environment, once:
  ``python -m venv /work/venv-peers && /work/venv-peers/bin/pip install ragas==0.4.3 deepeval==4.3.1
  'langchain-community<0.4'`` (ragas 0.4.3 imports a module langchain-community 0.4 removed).

The stand-in answers each tool's prompts with JSON of that tool's own shape, sized by the sample as
a model would size it, not written by a model: rt4chart's decomposition one claim per answer
sentence, its verification entailed-with-a-quote where the claim stands word for word in the
context, else baseless, so no re-asks (tests/faults.py's ``sentences_as_claims_grounded``); RAGAS
one statement per answer sentence and a verdict with a reason per statement; DeepEval one truth
per context sentence, one claim per answer sentence, a verdict per claim (a reason where not
``yes``) and a one-sentence score reason. Prompt tokens are the exact messages sent, tokenised
with o200k_base (gpt-4o-mini's encoding, the file litellm ships) with one token per role marker
and message end; completion tokens are the replies' contents so tokenised. Completion figures are
therefore of the stand-in's wording: a model writes more (the reasons) or less; the calls and
prompt tokens are the tools' own.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import tiktoken

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batch_server import BatchServer, batch_server
from faults import fault_server
from faults import sentences_as_claims_grounded as rt4chart_reply
from prefix_cache import OPENAI_MINIMUM, OPENAI_STEP, cacheable, litellm_tiktoken_dir
from results import record
from workload import bench_inputs

PRICED_MODEL = "gpt-4o-mini"
PEER_SCRIPT = Path(__file__).with_name("peer_faithfulness.py")
ROLE_MARKERS = {"system": -1, "user": -2, "assistant": -3}
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    """``text`` split after sentence-ending punctuation (the stand-in's sizing, not the method's segmentation)."""
    return [part for part in (piece.strip() for piece in SENTENCE_END.split(text)) if part]


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of content parts."""
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return str(content or "")


def prompt_token_ids(body: dict[str, Any], encoding: tiktoken.Encoding) -> list[int]:
    """A request's messages as one token sequence: per message a role marker, its text, an end marker."""
    tokens: list[int] = []
    for message in body["messages"]:
        tokens.append(ROLE_MARKERS.get(message["role"], -4))
        tokens.extend(encoding.encode(message_text(message.get("content")), disallowed_special=()))
        tokens.append(-5)
    return tokens


def stated_in(claim: str, context: str) -> bool:
    """Whether ``context`` holds ``claim`` word for word (its closing full stop aside)."""
    return claim.rstrip(".").strip().lower() in context.lower()


def last_user_text(body: dict[str, Any]) -> str:
    return message_text(next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user"))


def between(text: str, start: str, end: str) -> str:
    """The text after the last ``start`` and before the next ``end`` (or the text's end)."""
    return text.rsplit(start, 1)[-1].split(end, 1)[0].strip()


def ragas_reply(body: dict[str, Any]) -> str:
    """RAGAS's prompts end with ``input: {json}`` then ``Output:``: statements, or verdicts on them."""
    given = json.loads(between(last_user_text(body), "input: ", "\nOutput:"))
    if "statements" not in given:
        return json.dumps({"statements": sentences(given["answer"])})
    verdicts = [
        {"statement": statement, "reason": "The context states this word for word.", "verdict": 1}
        if stated_in(statement, given["context"])
        else {"statement": statement, "reason": "The context does not state this.", "verdict": 0}
        for statement in given["statements"]
    ]
    return json.dumps({"statements": verdicts})


def deepeval_reply(body: dict[str, Any]) -> str:
    """DeepEval names each structured output's schema: Truths, Claims, Verdicts, FaithfulnessScoreReason."""
    schema = body["response_format"]["json_schema"]["name"]
    prompt = last_user_text(body)
    if schema == "Truths":
        return json.dumps({"truths": sentences(between(prompt, "Text:\n", "\n\nJSON:"))})
    if schema == "Claims":
        return json.dumps({"claims": sentences(between(prompt, "AI Output:\n", "\n\nJSON:"))})
    if schema == "Verdicts":
        context = between(prompt, "Retrieval Contexts:\n", "\n\nClaims:")
        claims = ast.literal_eval(between(prompt, "Claims:\n", "\n\nJSON:"))
        verdicts = [
            {"verdict": "yes", "reason": None}
            if stated_in(claim, context)
            else {"verdict": "borderline", "reason": "The retrieval context does not state this."}
            for claim in claims
        ]
        return json.dumps({"verdicts": verdicts})
    score = between(prompt, "Faithfulness Score:\n", "\n")
    return json.dumps({"reason": f"The score is {score} because the context backs only some of the claims."})


@dataclass(frozen=True)
class Tool:
    """One row of the table: how to run an audit and how the stand-in answers its prompts."""

    name: str
    """The row's name."""
    reply: Callable[[dict[str, Any]], str]
    """The stand-in's reply content to one of this tool's requests."""
    command: Callable[[Path, str], list[str]]
    """The audit's command line, given the input JSONL and the stand-in's base URL."""
    finished: frozenset[int] = frozenset({0})
    """Exit codes of a finished audit (``rt4 verify``: 1 when it found unsupported claims)."""
    batch: bool = False
    """Sent through the Batch API stand-in (tests/batch_server.py) and priced at batch rates."""


RT4_FINISHED = frozenset({0, 1})


def rt4_verify(*flags: str) -> Callable[[Path, str], list[str]]:
    def command(inputs: Path, base_url: str) -> list[str]:
        return [sys.executable, "-m", "rt4chart", "verify", str(inputs), "--out", str(inputs.with_suffix(".out.jsonl")),
                "--judge", f"openai/{PRICED_MODEL}", "--api-base", base_url, "--no-cache", "--concurrency", "1",
                "--samples-in-flight", "1", "-q", *flags]

    return command


def peer(python: str, name: str) -> Callable[[Path, str], list[str]]:
    def command(inputs: Path, base_url: str) -> list[str]:
        return [python, str(PEER_SCRIPT), name, str(inputs), base_url]

    return command


def tools(peers_python: str) -> list[Tool]:
    return [
        Tool("rt4chart online (judge decomposer, default)", rt4chart_reply, rt4_verify(), RT4_FINISHED),
        Tool("rt4chart online (`--decomposer rules`)", rt4chart_reply, rt4_verify("--decomposer", "rules"),
             RT4_FINISHED),
        # Every sample in flight: a batch audit's calls go in a few rounds (README: Batch audits).
        Tool("rt4chart `--batch` (judge decomposer)", rt4chart_reply,
             rt4_verify("--batch", "--batch-poll", "0.05", "--samples-in-flight", "1000"), RT4_FINISHED, batch=True),
        Tool("RAGAS faithfulness", ragas_reply, peer(peers_python, "ragas")),
        Tool("DeepEval faithfulness", deepeval_reply, peer(peers_python, "deepeval")),
    ]


@dataclass(frozen=True)
class Usage:
    """What one tool's audit sent and was answered, counted at the stand-in."""

    calls: int
    """Requests the stand-in received."""
    prompt_tokens: int
    """Prompt tokens of those requests (o200k_base)."""
    completion_tokens: int
    """Tokens of the stand-in's reply contents (o200k_base)."""
    cacheable_tokens: int
    """Prompt tokens in a prefix an earlier request of the same audit shares, under OpenAI's rule."""
    vllm_cacheable_tokens: int
    """The same under vLLM's automatic prefix caching (whole 16-token blocks)."""


@dataclass(frozen=True)
class Rates:
    """gpt-4o-mini's prices per token, from litellm's price list."""

    prompt: float
    """Input tokens."""
    cached_prompt: float
    """Input tokens read from the prompt cache."""
    completion: float
    """Output tokens."""

    def halved(self) -> Rates:
        """Batch rates: half of each (the Batch API's discount, cached prompt tokens included)."""
        return Rates(self.prompt / 2, self.cached_prompt / 2, self.completion / 2)

    def uncached(self, usage: Usage) -> float:
        return usage.prompt_tokens * self.prompt + usage.completion_tokens * self.completion

    def with_cache(self, usage: Usage) -> float:
        uncached = usage.prompt_tokens - usage.cacheable_tokens
        return (uncached * self.prompt + usage.cacheable_tokens * self.cached_prompt
                + usage.completion_tokens * self.completion)


def gpt_4o_mini_rates() -> Rates:
    import litellm

    prices = litellm.model_cost[PRICED_MODEL]
    return Rates(prices["input_cost_per_token"], prices["cache_read_input_token_cost"], prices["output_cost_per_token"])


def audit(tool: Tool, inputs: Path, encoding: tiktoken.Encoding) -> Usage:
    """Run ``tool`` over ``inputs`` against a fresh recording stand-in and count what it sent."""
    completions: list[int] = []

    def completion_tokens(content: str) -> int:
        completions.append(len(encoding.encode(content, disallowed_special=())))
        return completions[-1]

    with (batch_server if tool.batch else fault_server)(tool.reply) as server:
        answers = server.answers if isinstance(server, BatchServer) else server
        answers.prompt_tokens = lambda body: len(prompt_token_ids(body, encoding))
        answers.completion_tokens = completion_tokens
        done = subprocess.run(tool.command(inputs, server.base_url), capture_output=True, text=True, check=False,
                              env={**os.environ, "OPENAI_API_KEY": "no-key"})
        if done.returncode not in tool.finished:
            raise SystemExit(f"{tool.name} failed ({done.returncode}): {done.stderr[-3000:]}")
        if isinstance(server, BatchServer):  # the lines of every batch, in submission order; no call went online
            bodies = [line["body"] for batch in server.created_batches for line in batch["_lines"]] + server.online
        else:
            bodies = list(server.requests)
    prompts = [prompt_token_ids(body, encoding) for body in bodies]
    total, openai_cached, vllm_cached = cacheable(prompts)
    return Usage(len(bodies), total, sum(completions), openai_cached, vllm_cached)


def peer_versions(python: str) -> str:
    """The peers' installed versions, as the results name them."""
    query = "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in ('ragas', 'deepeval')))"
    return subprocess.run([python, "-c", query], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--peers-python", default="/work/venv-peers/bin/python",
                        help="a Python with ragas and deepeval installed")
    args = parser.parse_args()
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", litellm_tiktoken_dir())
    encoding = tiktoken.get_encoding("o200k_base")
    rates = gpt_4o_mini_rates()
    items, source = bench_inputs(args.samples)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        inputs = Path(scratch) / "in.jsonl"
        inputs.write_text("".join(item.sample.model_dump_json() + "\n" for item in items if item.sample), "utf-8")
        for tool in tools(args.peers_python):
            usage = audit(tool, inputs, encoding)
            priced = rates.halved() if tool.batch else rates
            rows.append(
                f"| {tool.name} | {usage.calls:,} | {usage.prompt_tokens:,} | {usage.completion_tokens:,} "
                f"| {usage.cacheable_tokens:,} ({usage.cacheable_tokens / usage.prompt_tokens:.0%}) "
                f"| {usage.vllm_cacheable_tokens / usage.prompt_tokens:.0%} "
                f"| ${priced.uncached(usage):.4f} | ${priced.with_cache(usage):.4f} "
                f"| ${priced.uncached(usage) / len(items):.5f} |"
            )
    per_million = 1_000_000
    record(
        "Cost side by side: rt4chart, RAGAS, DeepEval",
        [
            f"Input: {source}; {peer_versions(args.peers_python)}; one recording stand-in on 127.0.0.1 answering "
            "each tool's prompts with JSON of "
            "its own shape (see the script's docstring: completion tokens are the stand-in's wording, calls and "
            "prompt tokens the tools' own); tokens by o200k_base. Cacheable: prompt tokens in a prefix an earlier "
            f"call of the same audit shares, OpenAI's rule (>= {OPENAI_MINIMUM:,} tokens, {OPENAI_STEP}-token "
            f"steps; vLLM's: whole 16-token blocks, no price). "
            f"Prices: {PRICED_MODEL} from litellm's list, ${rates.prompt * per_million:.3f}/M input, "
            f"${rates.cached_prompt * per_million:.3f}/M cached input, ${rates.completion * per_million:.2f}/M "
            "output; the batch row at half of each (the Batch API's discount), its lines through tests/batch_server.py "
            "in submission order.",
            "",
            "| tool | calls | prompt tokens | completion tokens | cacheable prompt tokens (OpenAI) "
            "| cacheable share (vLLM) | $ | $, cacheable at cached rate | $ / sample |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
        ],
    )


if __name__ == "__main__":
    main()
