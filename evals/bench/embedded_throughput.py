"""Throughput of the embedded offline verifier through the real pipeline, in claims per second.

    python evals/bench/embedded_throughput.py --threads 2 --samples 200 [--baseline 8675a1a]

Reads RAGTruth QA dev answers (or any rt4 input JSONL given with --input), decomposes them with the
rule-based decomposer, and verifies them with local + global verification (W=25, O=10), starting
from a cold embedding cache: every context sentence is embedded during the timed run. The model
load is timed separately. Prints the measured figures and the command that produced them.

``--baseline COMMIT`` also times the embedded verifier as it was at COMMIT (its module read with
``git show``), in the same run and on the same answers, each with its own cold encoder, and prints
the ratio. COMMIT must have the folder layout (rt4chart/judges/embedded/); for an older one (such as
8675a1a, the hand-tuned heuristic before the learned head) run this script from a checkout of it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from rt4chart.judges.embedded.verifier import EmbeddedBackend
from rt4chart.options import AuditOptions
from rt4chart.protocol import Backend
from rt4chart.records.io import InputLine, read_jsonl
from rt4chart.runs.engine import Pipeline
from rt4chart.types import Sample

RAGTRUTH_DEV = Path("/work/shared/data/ragtruth-qa/dev.jsonl")


def ragtruth_lines(limit: int) -> list[InputLine]:
    lines = []
    with RAGTRUTH_DEV.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if number > limit:
                break
            row = json.loads(text)
            sample = Sample(id=row["id"], context=row["d1"], question=row["query"], answer=row["d2"])
            lines.append(InputLine(number, sample))
    return lines


async def verify_all(pipeline: Pipeline, lines: list[InputLine]) -> tuple[int, int, float, float]:
    """Claims, judge calls, wall seconds and process CPU seconds (all threads) of one run."""
    started, cpu_started = time.perf_counter(), time.process_time()
    claims = calls = 0
    async for report in pipeline.run(lines):
        claims += len(report.claims)
        calls += report.usage.calls
    return claims, calls, time.perf_counter() - started, time.process_time() - cpu_started


def _import_file(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def module_at(commit: str) -> ModuleType:
    """rt4chart/judges/embedded/verifier.py as it was at ``commit``, imported under another name, with the
    learned head's module and model file of that commit where it had them."""
    directory = Path(tempfile.mkdtemp())
    files = {}
    for name in ("verifier.py", "model.py", "model.json"):
        shown = subprocess.run(
            ["git", "show", f"{commit}:rt4chart/judges/embedded/{name}"], capture_output=True, text=True, check=False
        )
        if shown.returncode == 0:
            # The head module finds its model file beside it by the file name.
            target = name if name.endswith(".json") else f"{Path(name).stem}_{commit}.py"
            files[name] = directory / target
            files[name].write_text(shown.stdout)
    if "verifier.py" not in files:
        raise SystemExit(f"{commit} has no rt4chart/judges/embedded/verifier.py")
    if "model.py" not in files:
        return _import_file(files["verifier.py"])
    # The old verifier imports its head's module by its package name: lend it the old one.
    head_module = _import_file(files["model.py"])
    current = sys.modules["rt4chart.judges.embedded.model"]
    sys.modules["rt4chart.judges.embedded.model"] = head_module
    try:
        return _import_file(files["verifier.py"])
    finally:
        sys.modules["rt4chart.judges.embedded.model"] = current


def load_average() -> str:
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())


def measure(make_backend: Callable[[], Backend], lines: list[InputLine], label: str) -> float:
    """Load a backend, verify every line, print the figures; returns claims per second."""
    started = time.perf_counter()
    backend = make_backend()
    load_s = time.perf_counter() - started
    pipeline = Pipeline(backend, AuditOptions(decomposer="rules"))
    claims, calls, elapsed, cpu = asyncio.run(verify_all(pipeline, lines))
    print(f"[{label}] judge: {backend.name}, model load: {load_s:.2f} s")
    print(f"[{label}] answers: {len(lines)}, claims: {claims}, judge calls: {calls}, time: {elapsed:.2f} s")
    print(f"[{label}] throughput: {claims / elapsed:.1f} claims/s ({len(lines) / elapsed:.1f} answers/s); "
          f"{claims / cpu:.1f} claims per CPU-second ({cpu:.1f} CPU-s); load average {load_average()}")
    return claims / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="encoder threads (cores to use)")
    parser.add_argument("--samples", type=int, default=200, help="answers to verify")
    parser.add_argument("--input", type=Path, default=None, help="rt4 input JSONL instead of RAGTruth")
    parser.add_argument("--baseline", default=None, help="also time the verifier of this git commit")
    args = parser.parse_args()
    if args.input:
        lines = [line for line in read_jsonl(args.input) if line.sample][: args.samples]
    else:
        lines = ragtruth_lines(args.samples)

    command = shlex.join([os.path.relpath(sys.executable), *sys.argv])
    print(f"command: {command}")
    print(f"cpus available: {len(os.sched_getaffinity(0))}, threads: {args.threads}, load average: {load_average()}")
    if args.baseline:
        old = module_at(args.baseline)
        baseline = measure(lambda: old.EmbeddedBackend(threads=args.threads), lines, f"at {args.baseline}")
    current = measure(lambda: EmbeddedBackend(threads=args.threads), lines, "current")
    if args.baseline:
        print(f"current / {args.baseline}: {current / baseline:.2f}x")


if __name__ == "__main__":
    main()
