"""Samples per second of ``rt4 verify`` on 1, 2 and 4 Ray workers, beside the single-process run.

    nice -n 10 python evals/scale/ray_workers.py [--samples 400] [--latency 0.2] [--concurrency 4]
        [--workers 1 2 4] [--json FILE]

Every run audits the same generated samples (two answer sentences each, rule-based claims, the
global stage on) against the project's fault server
(``tests/faults.py``) answering every call after a fixed latency, with the same judge stack
(``openai/<model>`` on the server, ``--concurrency`` calls in flight per process or worker, no
cache). The single-process run is :func:`rt4chart.runs.engine.run_audit` with a
:class:`~rt4chart.runs.engine.Pipeline`, the Ray runs the same with ``rt4 verify --engine ray``'s
:class:`~rt4chart.runs.ray_engine.RayEngine`, on one local Ray cluster started once (its start is not
counted; each run's worker actors start inside the run and are). Reported per run: wall seconds,
samples/s over the whole run, steady samples/s (from the 20th record to the last: worker start-up
excluded), the ratio to the single-process run, the driver's CPU seconds per judge call, and the
1-minute load average before and after (the machine is shared).

Every run must write the same records (checked: usage aside, a run is identical or the bench
fails), so the figures compare equal work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from audit_fixtures import read_records, write_samples  # noqa: E402
from faults import FaultServer, fault_server, grounded  # noqa: E402

from rt4chart.judges.budget import RunLimits  # noqa: E402
from rt4chart.judges.registry import judge_stack  # noqa: E402
from rt4chart.options import AuditOptions  # noqa: E402
from rt4chart.records.io import read_jsonl  # noqa: E402
from rt4chart.runs.engine import EngineOptions, Pipeline, run_audit  # noqa: E402
from rt4chart.types import AuditRecord  # noqa: E402

STEADY_FROM = 20
"""Records after which a run counts as started (worker actors up, first shards back)."""


@dataclass
class Run:
    """One measured run."""

    engine: str
    workers: int
    seconds: float
    steady_samples_per_s: float
    driver_cpu_s_per_call: float
    calls: int
    records: list[dict[str, Any]]


def audit(server: FaultServer, inputs: Path, out: Path, concurrency: int, workers: int | None) -> Run:
    items = list(read_jsonl(inputs))
    judge = "openai/smollm2"
    stack = judge_stack(judge, api_base=server.base_url, concurrency=concurrency)
    options = AuditOptions(decomposer="rules")
    pipeline: Pipeline = Pipeline(stack, options)
    if workers is not None:
        from rt4chart.runs.ray_engine import ray_audit_engine

        engine = EngineOptions(engine="ray", workers=workers)
        pipeline = ray_audit_engine(stack, options, engine, judge=judge, api_base=server.base_url,
                                limits=RunLimits(concurrency=concurrency), cache=None)
    arrivals: list[float] = []

    def on_report(report: AuditRecord) -> None:
        arrivals.append(time.perf_counter())

    calls_before = len(server.requests)
    cpu_started, started = time.process_time(), time.perf_counter()

    async def go() -> None:
        try:
            await run_audit(pipeline, items, out, on_report)
        finally:
            await stack.aclose()

    asyncio.run(go())
    seconds = time.perf_counter() - started
    calls = len(server.requests) - calls_before
    steady = (len(arrivals) - STEADY_FROM) / (arrivals[-1] - arrivals[STEADY_FROM])
    return Run("single process" if workers is None else "ray", workers or 1, seconds, steady,
               (time.process_time() - cpu_started) / calls, calls, read_records(out))


def without_usage(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if key not in ("usage", "usage_by_judge")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the server takes per call")
    parser.add_argument("--concurrency", type=int, default=4, help="judge calls in flight per process or worker")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    arguments = parser.parse_args()

    import ray

    load_before = os.getloadavg()[0]
    ray.init(num_cpus=max(arguments.workers) + 1, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    runs: list[Run] = []
    with TemporaryDirectory() as temporary, fault_server(grounded) as server:
        directory = Path(temporary)
        inputs = directory / "in.jsonl"
        write_samples(inputs, arguments.samples)
        server.latency_s = arguments.latency
        runs.append(audit(server, inputs, directory / "single.jsonl", arguments.concurrency, None))
        for workers in arguments.workers:
            runs.append(audit(server, inputs, directory / f"ray-{workers}.jsonl", arguments.concurrency, workers))
    ray.shutdown()
    load_after = os.getloadavg()[0]

    reference = runs[0]
    identical = all([without_usage(r) for r in run.records] == [without_usage(r) for r in reference.records]
                    for run in runs)
    print(f"{arguments.samples} samples, {reference.calls} judge calls per run "
          f"({reference.calls / arguments.samples:.1f} per sample), server latency "
          f"{arguments.latency:.2f} s, {arguments.concurrency} calls in flight per process/worker, "
          f"{os.cpu_count()} cores; load average (1 min) {load_before:.2f} before, {load_after:.2f} after")
    print("| run | workers | wall s | samples/s | steady samples/s | ratio (steady) | driver CPU ms/call |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    figures = []
    for run in runs:
        ratio = run.steady_samples_per_s / reference.steady_samples_per_s
        figure = {"engine": run.engine, "workers": run.workers, "wall_s": run.seconds,
                  "samples_per_s": arguments.samples / run.seconds, "steady_samples_per_s": run.steady_samples_per_s,
                  "ratio_steady": ratio, "driver_cpu_ms_per_call": 1000 * run.driver_cpu_s_per_call,
                  "calls": run.calls}
        figures.append(figure)
        print(f"| {run.engine} | {run.workers} | {run.seconds:.1f} | {figure['samples_per_s']:.1f} | "
              f"{run.steady_samples_per_s:.1f} | {ratio:.2f} | {figure['driver_cpu_ms_per_call']:.2f} |")
    print(f"records identical across runs (usage aside): {identical}")
    if arguments.json:
        arguments.json.write_text(json.dumps({"arguments": vars(arguments) | {"json": str(arguments.json)},
                                              "load_before": load_before, "load_after": load_after,
                                              "identical": identical, "runs": figures}, indent=2) + "\n")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
