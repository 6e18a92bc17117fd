"""Audit rt4chart input lines with a peer's faithfulness metric, against an OpenAI-compatible server.

    /work/venv-peers/bin/python evals/bench/peer_faithfulness.py {ragas,deepeval} INPUT.jsonl BASE_URL

Run by evals/bench/cost_side_by_side.py in the peers' own virtual environment (RAGAS and DeepEval
are not rt4chart dependencies). Each sample is scored in turn, one after the other, as a loop over
the peer's async scorer does: RAGAS ``Faithfulness`` (``ragas.metrics.collections``, llm_factory
over an ``AsyncOpenAI`` client: instructor's JSON mode) and DeepEval ``FaithfulnessMetric``
(``GPTModel`` with its defaults: reason included, structured outputs). Prints one score per line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
os.environ.setdefault("DEEPEVAL_TELEMETRY_OPT_OUT", "YES")
os.environ.setdefault("OPENAI_API_KEY", "no-key")

MODEL = "gpt-4o-mini"


def passages(context: Any) -> list[str]:
    """An rt4chart context (a string, or a list of passages or documents) as a list of strings."""
    if isinstance(context, str):
        return [context]
    return [item if isinstance(item, str) else str(item.get("text") or item.get("content") or "") for item in context]


async def ragas_scores(samples: list[dict[str, Any]], base_url: str) -> list[float]:
    from openai import AsyncOpenAI
    from ragas.llms.base import llm_factory
    from ragas.metrics.collections import Faithfulness

    metric = Faithfulness(llm=llm_factory(MODEL, client=AsyncOpenAI(base_url=base_url)))
    scores = []
    for sample in samples:
        result = await metric.ascore(user_input=sample.get("question") or "-", response=sample["answer"],
                                     retrieved_contexts=passages(sample["context"]))
        scores.append(float(result.value))
    return scores


async def deepeval_scores(samples: list[dict[str, Any]], base_url: str) -> list[float]:
    from deepeval.metrics import FaithfulnessMetric
    from deepeval.models import GPTModel
    from deepeval.test_case import LLMTestCase

    metric = FaithfulnessMetric(model=GPTModel(model=MODEL, base_url=base_url), async_mode=True)
    scores = []
    for sample in samples:
        case = LLMTestCase(input=sample.get("question") or "-", actual_output=sample["answer"],
                           retrieval_context=passages(sample["context"]))
        scores.append(float(await metric.a_measure(case, _show_indicator=False)))
    return scores


def main() -> None:
    tool, inputs, base_url = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    samples = [json.loads(line) for line in inputs.read_text("utf-8").splitlines() if line.strip()]
    score = {"ragas": ragas_scores, "deepeval": deepeval_scores}[tool]
    for value in asyncio.run(score(samples, base_url)):
        print(value)


if __name__ == "__main__":
    main()
