"""Batched verification vs the reference one-claim-per-call algorithm (issue: fewer judge calls).

    python evals/bench/batching.py [--samples 100] [--judge embedded] [--batch-claims 8]

Runs the pipeline twice over RAGTruth QA dev (``--batch-claims N`` and ``--batch-claims 1``) with
a judge that runs here, records every request and reply, and reports calls and tokens per sample,
whether every claim label is identical, answer-level F1 of both modes, and the projected cost per
sample at the gpt-4o-mini profile's prices. Tokens are counted with gpt-4o-mini's tokenizer (via
litellm) on the exact prompts rt4chart sends; completion tokens are those of the replies the judge
here gave. The projection adds one judge decomposition call per sample (prompt rendered exactly,
completion = the claims as JSON), since gpt-4o-mini would decompose the answer itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import dataclass

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from results import record
from workload import bench_inputs

from rt4chart.analysis.metrics import binary_prf
from rt4chart.judges.registry import load_profiles, resolve_judge
from rt4chart.method.decompose import decompose_request, rule_claims
from rt4chart.method.session import JudgeSession
from rt4chart.method.tasks import DecomposedSentence, DecomposeOutput, load_prompts
from rt4chart.method.text import split_sentences
from rt4chart.options import AuditOptions
from rt4chart.protocol import Backend, BackendWrapper, JudgeRequest, JudgeResponse
from rt4chart.records.io import InputLine
from rt4chart.runs.engine import Pipeline
from rt4chart.types import AuditRecord

TOKENIZER_MODEL = "gpt-4o-mini"


def tokens(text: str) -> int:
    return int(litellm.token_counter(model=TOKENIZER_MODEL, text=text))


def prompt_tokens(request: JudgeRequest) -> int:
    messages = [m.model_dump() for m in request.messages]
    return int(litellm.token_counter(model=TOKENIZER_MODEL, messages=messages))


class Recorder(BackendWrapper):
    """Wraps a judge and keeps every exchange."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.exchanges: list[tuple[JudgeRequest, JudgeResponse]] = []

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        response = await self.inner.complete(request)
        self.exchanges.append((request, response))
        return response


@dataclass
class ModeResult:
    batch_claims: int
    reports: list[AuditRecord]
    calls: int
    prompt_tokens: int
    completion_tokens: int


async def run_mode(judge: str, items: list[InputLine], batch_claims: int) -> ModeResult:
    recorders: list[Recorder] = []

    def wrap(leaf: Backend) -> Backend:
        recorders.append(Recorder(leaf))
        return recorders[-1]

    backend = resolve_judge(judge, wrap=wrap)
    pipeline = Pipeline(backend, AuditOptions(batch_claims=batch_claims))
    reports = [report async for report in pipeline.run(items)]
    await backend.aclose()
    exchanges = [exchange for recorder in recorders for exchange in recorder.exchanges]
    return ModeResult(
        batch_claims=batch_claims,
        reports=reports,
        calls=len(exchanges),
        prompt_tokens=sum(prompt_tokens(request) for request, _ in exchanges),
        completion_tokens=sum(tokens(response.raw) for _, response in exchanges),
    )


def decomposition_tokens(items: list[InputLine], backend: Backend) -> tuple[int, int]:
    """Prompt and completion tokens of one judge decomposition per sample, summed."""
    session = JudgeSession(backend, load_prompts())
    prompt = completion = 0
    for item in items:
        assert item.sample is not None
        sentences = split_sentences(item.sample.answer)
        prompt += prompt_tokens(decompose_request(session, sentences, item.sample.question))
        reply = DecomposeOutput(
            sentences=[DecomposedSentence(sentence=s.index, claims=rule_claims(s)) for s in sentences]
        )
        completion += tokens(reply.model_dump_json())
    return prompt, completion


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--judge", default="embedded")
    parser.add_argument("--batch-claims", type=int, default=8)
    args = parser.parse_args()
    items, source = bench_inputs(args.samples)
    batched = await run_mode(args.judge, items, args.batch_claims)
    reference = await run_mode(args.judge, items, 1)
    n = len(items)

    identical = [
        [c.label for c in a.claims] == [c.label for c in b.claims]
        for a, b in zip(batched.reports, reference.reports, strict=True)
    ]
    decompose_in, decompose_out = decomposition_tokens(items, resolve_judge(args.judge))
    profile = load_profiles()[TOKENIZER_MODEL]
    price_in, price_out = profile.input_usd_per_mtok or 0.0, profile.output_usd_per_mtok or 0.0

    def per_sample_cost(mode: ModeResult) -> float:
        prompt = mode.prompt_tokens + decompose_in
        completion = mode.completion_tokens + decompose_out
        return (prompt * price_in + completion * price_out) / 1e6 / n

    def f1(mode: ModeResult) -> str:
        pairs = [(r.gold.hallucinated, bool(r.hallucinated)) for r in mode.reports if r.gold]
        if not pairs or any(g is None for g, _ in pairs):
            return "n/a"
        return f"{binary_prf([bool(g) for g, _ in pairs], [p for _, p in pairs]).f1:.3f}"

    rows = []
    for mode in (reference, batched):
        rows.append(
            f"| {mode.batch_claims} | {mode.calls / n:.2f} | {mode.prompt_tokens / n:,.0f} | "
            f"{mode.completion_tokens / n:,.0f} | ${per_sample_cost(mode):.5f} | {f1(mode)} |"
        )
    call_ratio = batched.calls / reference.calls
    cost = per_sample_cost(batched)
    record(
        f"Batched verification vs one claim per call ({args.judge} judge)",
        [
            f"Input: {source}; judge: {args.judge}. Per sample, verification only (decomposition adds "
            f"{decompose_in / n:,.0f} prompt and {decompose_out / n:,.0f} completion tokens, in the cost column).",
            "",
            "| --batch-claims | calls | prompt tokens | completion tokens | projected gpt-4o-mini $ | answer F1 |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"**Calls: {call_ratio:.2f} of the reference** "
            f"(target <= 0.33: {'met' if call_ratio <= 1 / 3 else 'NOT met'}); "
            f"**projected cost ${cost:.4f} per sample** at ${price_in}/M in, ${price_out}/M out "
            f"(target <= $0.004: {'met' if cost <= 0.004 else 'NOT met'}; the paper reports $0.0104).",
            f"Claim labels identical in both modes for {sum(identical)}/{n} samples.",
        ],
    )


if __name__ == "__main__":
    asyncio.run(main())
