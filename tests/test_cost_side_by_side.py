"""The stand-in replies of ``evals/bench/cost_side_by_side.py`` and its pricing (the peers themselves
are not needed: the request bodies below end as RAGAS 0.4.3's and DeepEval 4.3.1's prompts end)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "evals" / "bench" / "cost_side_by_side.py"
CONTEXT = "The X200 has a 56 Wh battery. It lasts up to 11 hours."
ANSWER = "The X200 has a 56 Wh battery. It supports wireless charging."


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cost_side_by_side", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def user(text: str, schema: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": schema}}
    return body


def test_ragas_statements_then_one_verdict_per_statement(bench: ModuleType) -> None:
    given = json.dumps({"question": "What battery?", "answer": ANSWER}, indent=4)
    statements = json.loads(bench.ragas_reply(user(f"examples...\ninput: {{}}\nOutput: \ninput: {given}\nOutput: ")))
    assert statements == {"statements": ["The X200 has a 56 Wh battery.", "It supports wireless charging."]}
    given = json.dumps({"context": CONTEXT, **statements}, indent=4)
    verdicts = json.loads(bench.ragas_reply(user(f"input: {given}\nOutput: ")))["statements"]
    assert [verdict["verdict"] for verdict in verdicts] == [1, 0]


def test_deepeval_answers_each_schema_in_its_shape(bench: ModuleType) -> None:
    truths = json.loads(bench.deepeval_reply(user(f"Example...\n\nText:\n{CONTEXT}\n\nJSON:", "Truths")))
    assert truths == {"truths": ["The X200 has a 56 Wh battery.", "It lasts up to 11 hours."]}
    claims = json.loads(bench.deepeval_reply(user(f"Example...\n\nAI Output:\n{ANSWER}\n\nJSON:", "Claims")))
    listed = repr(claims["claims"])
    prompt = f"Retrieval Contexts:\n{CONTEXT}\n\nClaims:\n{listed}\n\nJSON:"
    verdicts = json.loads(bench.deepeval_reply(user(prompt, "Verdicts")))["verdicts"]
    assert [verdict["verdict"] for verdict in verdicts] == ["yes", "borderline"]
    prompt = "Faithfulness Score:\n0.50\n\nContradictions:\n[]\n\nJSON:"
    reason = json.loads(bench.deepeval_reply(user(prompt, "FaithfulnessScoreReason")))
    assert reason["reason"].startswith("The score is 0.50 because")


def test_cacheable_tokens_are_priced_at_the_cached_rate(bench: ModuleType) -> None:
    rates = bench.Rates(prompt=4.0, cached_prompt=1.0, completion=10.0)
    usage = bench.Usage(calls=2, prompt_tokens=100, completion_tokens=5, cacheable_tokens=40, vllm_cacheable_tokens=48)
    assert rates.uncached(usage) == 100 * 4.0 + 5 * 10.0
    assert rates.with_cache(usage) == 60 * 4.0 + 40 * 1.0 + 5 * 10.0
    assert rates.halved().with_cache(usage) == rates.with_cache(usage) / 2
