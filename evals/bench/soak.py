"""Soak: N samples through the real ``rt4 verify`` CLI with an OpenAI-compatible judge (``openai/fault``
at the server's base URL: the OpenAI-compatible transport, on the transport policy) against the project's
fault server (tests/faults.py) injecting 10% 429s, 5% 5xx, 2% hangs past a short --timeout and 3%
malformed replies, compared with a fault-free run of the same inputs on the same server.

    python evals/bench/soak.py [--samples 2000] [--memory-baseline 500] [--json FILE] [--no-record]
    python evals/bench/soak.py --memory 5000 50000 [--json FILE] [--no-record]

Checks, each printed with its figure: every input line has exactly one record, in order; every
record whose calls eventually succeeded (no error on the record or a claim) equals the fault-free
record of the same line (usage aside: retries cost calls); records that could not be judged carry
errors (and, once judge failures null the label, ``label: null``: the figure says how many do);
the CLI's peak memory (max RSS, from ``wait4``) for N samples vs the baseline count.

``--memory SMALL LARGE`` is the memory check of streamed records: the real ``rt4 verify`` over SMALL
then LARGE generated samples with the scripted judge (the same records as the fault server's judge,
without HTTP), the peak RSS of each run from ``wait4``; the target is LARGE within 10% of SMALL.
Every sample has its own id and answer but all share one context: the figures in RESULTS.md were
taken while every verify request still built a bounded reply schema per distinct context (about
10 ms of CPU each, made lazy since in c7b30cb), and one context kept 50,000 samples within a
quarter of an hour on two shared cores.

The fault sequence is drawn with a fixed seed; which request meets which fault depends on arrival
order under concurrency, so figures vary a little from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from audit_fixtures import write_rules, write_samples  # noqa: E402
from faults import Fault, FaultServer, claims_in, fault_server  # noqa: E402

FAULT_SHARES = {"rate_limit": 0.10, "server_error": 0.05, "hang": 0.02, "invalid_json": 0.03}
TIMEOUT_S = 1.0
HANG_S = 3.0
"""Hung requests answer after 3 s, past the 1 s --timeout of the run."""

VOLATILE = ("usage", "usage_by_judge")
VOLATILE_CLAIM = ("calls", "cost_usd")
"""What retries legitimately change in a record: what it cost."""


def reply(body: dict[str, Any]) -> str:
    """A deterministic judge: the opening-hours claim is entailed with its quote, the rest baseless."""
    judgements = []
    for position, claim in enumerate(claims_in(body)):
        if "opens at" in claim:
            # Evidence needs substance (a whole sentence or two content words) and must be in the context.
            judgements.append({"claim": position, "label": "entailed", "evidence": ["opens daily"],
                               "rationale": "quoted", "confidence": 0.9})
        else:
            judgements.append({"claim": position, "label": "baseless", "evidence": [],
                               "rationale": "not stated", "confidence": 0.9})
    return json.dumps({"judgements": judgements})


def fault_script(requests: int, seed: int) -> deque[Fault]:
    draw = random.Random(seed)
    script: deque[Fault] = deque()
    for _ in range(requests):
        roll, behaviour = draw.random(), "ok"
        for name, share in FAULT_SHARES.items():
            if roll < share:
                behaviour = name
                break
            roll -= share
        script.append(Fault(behaviour, hang_s=HANG_S))  # type: ignore[arg-type]
    return script


def run_cli(server: FaultServer, inputs: Path, out: Path) -> tuple[int, int, float]:
    """Exit code, peak RSS in KiB and seconds of one ``rt4 verify`` run."""
    command = [sys.executable, "-m", "rt4chart", "verify", str(inputs), "--judge", "openai/fault", "--api-base",
               server.base_url, "--decomposer", "rules", "--no-cache", "--out", str(out), "-q",
               "--timeout", str(TIMEOUT_S), "--concurrency", "16"]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    started = time.perf_counter()
    process = subprocess.Popen(command, env=environment)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss, time.perf_counter() - started


def peak_rss(command: list[str]) -> tuple[int, int, float]:
    """Exit code, peak RSS in KiB and seconds of one run of ``command``."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    process = subprocess.Popen(command, env=environment)
    _, status, usage = os.wait4(process.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss, time.perf_counter() - started


SHARED_CONTEXT = "Store 1 opens daily at 9 am. It sells 30 kinds of bread."


def memory_check(small: int, large: int, workdir: Path) -> dict[str, Any]:
    """Peak RSS of ``rt4 verify`` over ``small`` and ``large`` samples (scripted judge, no cache)."""
    rules = write_rules(workdir / "rules.json")
    figures: dict[str, Any] = {"samples": [small, large], "peak_rss_mib": {}, "seconds": {}, "records": {}}
    for count in (small, large):
        inputs, out = workdir / f"in{count}.jsonl", workdir / f"out{count}.jsonl"
        with inputs.open("w", encoding="utf-8") as lines:
            for number in range(count):
                sample = {"id": f"s{number}", "context": SHARED_CONTEXT,
                          "answer": f"Store 1 opens at 9 am. It also sells {number} kinds of cake."}
                lines.write(json.dumps(sample) + "\n")
        code, kib, seconds = peak_rss([sys.executable, "-m", "rt4chart", "verify", str(inputs), "--judge",
                                       f"scripted:{rules}", "--decomposer", "rules", "--no-cache", "--out", str(out),
                                       "-q"])
        assert code == 1, f"rt4 verify exited {code}"  # 1: the cakes are baseless in every sample
        figures["peak_rss_mib"][str(count)] = round(kib / 1024, 1)
        figures["seconds"][str(count)] = round(seconds, 1)
        with out.open("rb") as written:
            figures["records"][str(count)] = sum(1 for _ in written)
        inputs.unlink()
        out.unlink()
    rss = figures["peak_rss_mib"]
    figures["memory_growth"] = round(rss[str(large)] / rss[str(small)] - 1, 4)
    return figures


def memory_table(result: dict[str, Any]) -> list[str]:
    small, large = result["samples"]
    rss, seconds, records = result["peak_rss_mib"], result["seconds"], result["records"]
    return [
        "Input: generated samples (2 claims each, one shared context); `rt4 verify --judge scripted:RULES "
        "--decomposer rules --no-cache --out FILE -q`, the run's peak RSS from `wait4`. Taken under load "
        "(8 helpers on 2 cores).",
        "",
        "| samples | records written | peak RSS (MiB) | wall seconds |",
        "|---|---|---|---|",
        *(f"| {n} | {records[str(n)]} | {rss[str(n)]} | {seconds[str(n)]} |" for n in (small, large)),
        "",
        f"Growth from {small} to {large} samples: {result['memory_growth']:.1%} (target: within 10%).",
    ]


def stable(record: dict[str, Any]) -> dict[str, Any]:
    kept = {key: value for key, value in record.items() if key not in VOLATILE}
    kept["claims"] = [{k: v for k, v in claim.items() if k not in VOLATILE_CLAIM} for claim in record["claims"]]
    return kept


def judged(record: dict[str, Any]) -> bool:
    return not record["errors"] and not any(claim["errors"] for claim in record["claims"])


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def soak(samples: int, baseline: int, workdir: Path, seed: int = 0) -> dict[str, Any]:
    inputs, small = workdir / "in.jsonl", workdir / "small.jsonl"
    write_samples(inputs, samples)
    small.write_text("".join(inputs.read_text(encoding="utf-8").splitlines(keepends=True)[:baseline]),
                     encoding="utf-8")
    with fault_server(reply) as server:
        clean_code, _, clean_s = run_cli(server, inputs, workdir / "clean.jsonl")
        clean_requests = len(server.requests)
        server.script = fault_script(clean_requests * 3, seed)
        faulty_code, peak_kib, faulty_s = run_cli(server, inputs, workdir / "faulty.jsonl")
        faulty_requests = len(server.requests) - clean_requests
        injected = {name: 0 for name in FAULT_SHARES}
        for fault in list(fault_script(clean_requests * 3, seed))[: clean_requests * 3 - len(server.script)]:
            if fault.behaviour in injected:
                injected[fault.behaviour] += 1
        server.script = fault_script(clean_requests * 3, seed + 1)
        baseline_code, baseline_kib, _ = run_cli(server, small, workdir / "small_out.jsonl")
    # A crashed baseline run would make its peak RSS meaningless: it must be a finished audit.
    assert baseline_code in (0, 1, 4), f"the {baseline}-sample baseline run exited {baseline_code}"
    assert len(records(workdir / "small_out.jsonl")) == baseline, "the baseline run lost records"
    clean, faulty = records(workdir / "clean.jsonl"), records(workdir / "faulty.jsonl")
    lines = [record["line"] for record in faulty]
    succeeded = [record for record in faulty if judged(record)]
    unjudged = [record for record in faulty if not judged(record)]
    by_line = {record["line"]: record for record in clean}
    return {
        "samples": samples,
        "exit_codes": {"fault_free": clean_code, "faulty": faulty_code},
        "requests": {"fault_free": clean_requests, "faulty": faulty_requests},
        "faults_injected": injected,
        "seconds": {"fault_free": round(clean_s, 1), "faulty": round(faulty_s, 1)},
        "records": len(faulty),
        "records_lost": samples - len(set(lines)),
        "records_duplicated": len(lines) - len(set(lines)),
        "in_input_order": lines == sorted(lines),
        "fault_free_all_judged": all(judged(record) for record in clean),
        "succeeded": len(succeeded),
        "succeeded_equal_to_fault_free": sum(stable(r) == stable(by_line[r["line"]]) for r in succeeded),
        "unjudged": len(unjudged),
        "unjudged_with_errors": sum(bool(r["errors"] or any(c["errors"] for c in r["claims"])) for r in unjudged),
        "unjudged_with_null_label": sum(r["label"] is None for r in unjudged),
        "peak_rss_mib": {str(baseline): round(baseline_kib / 1024, 1), str(samples): round(peak_kib / 1024, 1)},
        "memory_growth": round(peak_kib / baseline_kib - 1, 4),
    }


def table(result: dict[str, Any], baseline: int) -> list[str]:
    samples = result["samples"]
    injected = ", ".join(f"{count} {name}" for name, count in result["faults_injected"].items())
    return [
        f"Input: {samples} generated samples (2 claims each); judge `openai/fault` on the fault server, "
        f"`--timeout {TIMEOUT_S:g} --concurrency 16 --decomposer rules`.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests, fault-free / faulty run | {result['requests']['fault_free']} / {result['requests']['faulty']} |",
        f"| faults injected (429, 5xx, hang {HANG_S:g} s, malformed) | {injected} |",
        f"| wall seconds, fault-free / faulty | {result['seconds']['fault_free']} / {result['seconds']['faulty']} |",
        f"| records / inputs | {result['records']} / {samples} |",
        f"| records lost / duplicated | {result['records_lost']} / {result['records_duplicated']} |",
        f"| records in input order | {result['in_input_order']} |",
        f"| records whose calls succeeded | {result['succeeded']} |",
        f"| ... equal to the fault-free record | {result['succeeded_equal_to_fault_free']} |",
        f"| records not judged (a call failed for good) | {result['unjudged']} |",
        f"| ... carrying errors / with `label: null` | {result['unjudged_with_errors']} / "
        f"{result['unjudged_with_null_label']} |",
        f"| peak RSS, {baseline} vs {samples} samples (MiB) | {result['peak_rss_mib'][str(baseline)]} vs "
        f"{result['peak_rss_mib'][str(samples)]} (growth {result['memory_growth']:.1%}, target < 20%) |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--memory-baseline", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="Also write the figures as JSON here.")
    parser.add_argument("--no-record", action="store_true", help="Do not write evals/bench/RESULTS.md.")
    parser.add_argument("--memory", type=int, nargs=2, metavar=("SMALL", "LARGE"),
                        help="Only the memory check: peak RSS over SMALL and LARGE samples.")
    arguments = parser.parse_args()
    if arguments.memory:
        with TemporaryDirectory() as folder:
            figures = memory_check(*arguments.memory, Path(folder))
        if arguments.json:
            arguments.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        if arguments.no_record:
            print("\n".join(memory_table(figures)))
        else:
            from results import record

            record("Soak: memory flat in the number of samples", memory_table(figures))
        return
    with TemporaryDirectory() as folder:
        result = soak(arguments.samples, arguments.memory_baseline, Path(folder), arguments.seed)
    if arguments.json:
        arguments.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    lines = table(result, arguments.memory_baseline)
    if arguments.no_record:
        print("\n".join(lines))
    else:
        from results import record

        record("Soak: faults injected into a long run", lines)


if __name__ == "__main__":
    main()
