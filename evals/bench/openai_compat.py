"""The OpenAI-compatible transport (aiohttp) against litellm's and the scripted judge, in one run.

    python evals/bench/openai_compat.py [--pairs 7] [--small 40] [--large 200] [--cpu-runs 5]

Three figures, each taken side by side (A B A B ...: the machine is shared, so each ratio is taken
pair by pair and the median counts):

- start-up: wall seconds of a fresh ``rt4 verify`` of one sample (``examples/free_trial.jsonl``,
  ``--decomposer rules --no-cache``) with ``--judge openai/bench --api-base URL`` over each
  transport, against the same command with the scripted judge (target: at most 1.5x);
- client CPU per judge call: the marginal CPU seconds (user + system, the process's own rusage) of
  ``rt4 verify`` of ``--large`` vs ``--small`` RAGTruth QA dev samples, over the calls the records
  count, against a server that answers at once (target: at most 1 ms; each command's fastest of
  ``--cpu-runs`` interleaved runs, contention only ever adding CPU time), beside the scripted judge
  (no server: the audit's own CPU per call, what no transport can go below); with
  ``--decomposer rules``, and over the OpenAI-compatible transport also with the default judge
  decomposer against a second server that decomposes as a model does (each answer sentence its one
  claim; verdicts entailed with a quote where the context holds the claim word for word, else
  baseless: tests/faults.py ``sentences_as_claims_grounded``), so the row measures the default path's
  replies, claim checks and grounding, not re-asks (until stop 50 the first server answered the
  decomposition requests too, with no claims, so that row measured every sentence re-asked);
- worker set-up: a fresh process building what a Ray worker builds (``ray_engine.AuditShard``: the
  judge stack and the pipeline) and auditing one sample, over each transport (Ray's own start is
  not in it).

The servers are the fault server of tests/faults.py in child processes (their CPU is not the client's).
``--cpu-only`` measures the client CPU of the OpenAI-compatible transport (both decomposers) and of the
scripted judge only: no start-up, no litellm, no worker set-up.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from conftest import judge_over
from faults import fault_server, sentences_as_claims_grounded
from litellm_throughput import serve
from results import record
from workload import bench_inputs

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "free_trial.jsonl"
RULES = ROOT / "examples" / "free_trial.rules.json"
EMPTY_RULES = Path(__file__).with_name("empty_rules.json")
WORKER = """
import sys
from rt4chart.records.io import read_jsonl
from rt4chart.runs.ray_engine import AuditShard, WorkerJudge
judge = WorkerJudge(judge=sys.argv[1], api_base=sys.argv[2] or None, options={"decomposer": "rules"})
shard = AuditShard(judge)
item = next(iter(read_jsonl(sys.argv[3])))
result = shard({"line": [item.line], "sample": [item.sample.model_dump_json()]})
assert result["record"][0], result
"""

JUDGE_DECOMPOSER = "openai-compatible, judge decomposer"

DETECTOR_IMPORT = "from rt4chart import languages"
DETECTOR = DETECTOR_IMPORT + "; languages._identifier()"


def timed(argv: list[str], ok: tuple[int, ...] = (0, 1)) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (its own rusage: user + system) and exit status of one process,
    which must exit with one of ``ok`` (``rt4 verify``: 1 is findings)."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    # Bytecode is written and reused, as on an installed machine: with PYTHONDONTWRITEBYTECODE set (as on this
    # project's sandboxes) every run compiles its imports again, seconds of CPU that vary by more than a
    # marginal of ~1 ms a call over ~1,000 calls can tell apart.
    environment.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.perf_counter()
    process = subprocess.Popen(argv, cwd=ROOT, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    assert process.stderr is not None
    error = process.stderr.read().decode()
    process.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code not in ok:
        raise SystemExit(f"{' '.join(argv)} exited {code}:\n{error[-2000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime, code


def verify(inputs: Path, judge: str, base_url: str | None, out: Path, decomposer: str = "rules") -> list[str]:
    argv = [sys.executable, "-m", "rt4chart", "verify", str(inputs), "--judge", judge, "--decomposer", decomposer,
            "--no-cache", "-q", "--out", str(out)]
    return argv + (["--api-base", base_url] if base_url else [])


def paired(commands: dict[str, list[str]], pairs: int, ok: tuple[int, ...] = (0, 1)) -> dict[str, list[float]]:
    """Wall seconds of each command, run in turn ``pairs`` times (one warm-up round first)."""
    for argv in commands.values():
        timed(argv, ok)
    walls: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(pairs):
        for name, argv in commands.items():
            walls[name].append(timed(argv, ok)[0])
    return walls


def ratio(walls: dict[str, list[float]], a: str, b: str) -> float:
    return statistics.median(x / y for x, y in zip(walls[a], walls[b], strict=True))


def record_calls(out: Path) -> int:
    """Judge calls the records of ``out`` count."""
    return sum(int(json.loads(line)["usage"]["calls"]) for line in out.read_text(encoding="utf-8").splitlines())


def serve_decompositions(address: multiprocessing.Queue[str], stop: multiprocessing.Event) -> None:  # type: ignore[type-arg]
    """A server answering at once as a model that decomposes (the judge decomposer's row)."""
    with fault_server(sentences_as_claims_grounded) as server:
        server.latency_s = 0.0
        address.put(server.base_url)
        stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--small", type=int, default=40)
    parser.add_argument("--large", type=int, default=200)
    parser.add_argument("--cpu-runs", type=int, default=5, help="runs of each command for the CPU figure")
    parser.add_argument("--cpu-only", action="store_true",
                        help="client CPU of the OpenAI-compatible transport and the scripted judge only")
    args = parser.parse_args()
    address: multiprocessing.Queue[str] = multiprocessing.Queue()
    decomposing_address: multiprocessing.Queue[str] = multiprocessing.Queue()
    stop = multiprocessing.Event()
    servers = [
        multiprocessing.Process(target=serve, args=(0.0, address, stop), daemon=True),
        multiprocessing.Process(target=serve_decompositions, args=(decomposing_address, stop), daemon=True),
    ]
    for server in servers:
        server.start()
    load_before = os.getloadavg()[0]
    startup: dict[str, list[float]] = {}
    workers: dict[str, list[float]] = {}
    try:
        base_url, decomposing_url = address.get(timeout=60), decomposing_address.get(timeout=60)
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch)
            transports = ("openai-compatible",) if args.cpu_only else ("openai-compatible", "litellm")
            judges = {transport: judge_over(transport, "openai/bench", folder) for transport in transports}
            out = folder / "out.jsonl"
            if not args.cpu_only:
                startup = paired({
                    "openai-compatible": verify(SAMPLE, judges["openai-compatible"], base_url, out),
                    "litellm": verify(SAMPLE, judges["litellm"], base_url, out),
                    "scripted": verify(SAMPLE, f"scripted:{RULES}", None, out),
                }, args.pairs)
            cpu: dict[str, list[float]] = {}
            calls: dict[str, int] = {}
            inputs: dict[int, Path] = {}
            for size in (args.small, args.large):
                items, source = bench_inputs(size)
                inputs[size] = folder / f"in{size}.jsonl"
                inputs[size].write_text(
                    "".join(item.sample.model_dump_json() + "\n" for item in items if item.sample), encoding="utf-8"
                )
            # The scripted judge calls no server: its marginal CPU is the audit's own, the floor.
            measured = {**{transport: (judge, base_url, "rules") for transport, judge in judges.items()},
                        JUDGE_DECOMPOSER: (judges["openai-compatible"], decomposing_url, "judge"),
                        "scripted": (f"scripted:{EMPTY_RULES}", None, "rules")}
            # Interleaved rounds: a slow spell of the machine falls on every command alike.
            for _ in range(args.cpu_runs):
                for transport, (judge, url, decomposer) in measured.items():
                    for size in (args.small, args.large):
                        name = f"{transport}{size}"
                        argv = verify(inputs[size], judge, url, folder / f"{name}.jsonl", decomposer)
                        cpu.setdefault(name, []).append(timed(argv)[1])
                        calls[name] = record_calls(folder / f"{name}.jsonl")
            # A one-time cost inside the marginal: an answer that the English-word shortcut does not settle
            # loads the language detector's model (5 of the first 200 RAGTruth QA dev answers, none of the 40).
            detector_cpu = statistics.median(
                timed([sys.executable, "-c", DETECTOR], ok=(0,))[1]
                - timed([sys.executable, "-c", DETECTOR_IMPORT], ok=(0,))[1]
                for _ in range(3)
            )
            if not args.cpu_only:
                workers = paired({
                    transport: [sys.executable, "-c", WORKER, judge, base_url, str(SAMPLE)]
                    for transport, judge in judges.items()
                }, args.pairs, ok=(0,))
    finally:
        stop.set()
        for server in servers:
            server.join(timeout=10)
    lines = [
        f"Machine shared with other work (load average {load_before:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end): absolute seconds are inflated alike, the ratios, each "
        f"taken pair by pair over {args.pairs} rounds (after one warm-up round), are the figures.",
        "",
    ]
    if startup:
        medians = {name: statistics.median(walls) for name, walls in startup.items()}
        lines += [
            "| `rt4 verify` of 1 sample, fresh process | median wall s | / scripted (median of pairs) |",
            "|---|---:|---:|",
            *(f"| `--judge {name}` | {medians[name]:.2f} | {ratio(startup, name, 'scripted'):.2f}x |"
              for name in ("openai-compatible", "litellm", "scripted")),
            "",
            f"**Start-up, OpenAI-compatible vs scripted: {ratio(startup, 'openai-compatible', 'scripted'):.2f}x** "
            f"(target <= 1.5x: {'met' if ratio(startup, 'openai-compatible', 'scripted') <= 1.5 else 'NOT met'}); "
            f"litellm vs scripted {ratio(startup, 'litellm', 'scripted'):.2f}x.",
            "",
        ]
    lines += [
        f"Client CPU per judge call, marginal ({args.large} vs {args.small} samples of {source.split(' of ')[-1]}, "
        f"`--decomposer rules` unless the row says otherwise, a server answering at once; {args.cpu_runs} "
        "interleaved runs of each command). "
        "The figure takes each command's fastest run: contention on a shared machine only ever adds CPU time "
        "(caches, memory bandwidth), so the fastest run is the least disturbed one; the medians are beside it.",
        "",
        "| transport | calls (small / large) | fastest CPU s (small / large) | marginal ms per call | "
        "from medians |",
        "|---|---:|---:|---:|---:|",
    ]
    marginal: dict[str, float] = {}
    for transport in measured:
        small, large = f"{transport}{args.small}", f"{transport}{args.large}"
        more_calls = calls[large] - calls[small]
        cpu_small, cpu_large = min(cpu[small]), min(cpu[large])
        marginal[transport] = (cpu_large - cpu_small) / more_calls * 1000
        from_medians = (statistics.median(cpu[large]) - statistics.median(cpu[small])) / more_calls * 1000
        lines.append(f"| {transport} | {calls[small]} / {calls[large]} | {cpu_small:.2f} / {cpu_large:.2f} | "
                     f"{marginal[transport]:.2f} | {from_medians:.2f} |")
    litellm = (f"; litellm {marginal['litellm']:.2f} ms" if "litellm" in marginal else "")
    transport_share = f"{marginal['openai-compatible'] - marginal['scripted']:.2f} ms over aiohttp" + (
        f" and {marginal['litellm'] - marginal['scripted']:.2f} ms over litellm" if "litellm" in marginal else "")
    lines += [
        "",
        f"**Client CPU per call over the OpenAI-compatible transport: {marginal['openai-compatible']:.2f} ms** "
        f"(target <= 1 ms: {'met' if marginal['openai-compatible'] <= 1 else 'NOT met'}); with the judge "
        f"decomposer {marginal[JUDGE_DECOMPOSER]:.2f} ms (target <= 1 ms: "
        f"{'met' if marginal[JUDGE_DECOMPOSER] <= 1 else 'NOT met'}){litellm}. The marginal CPU is the whole "
        "audit's per call (segmentation, prompts, parsing, grounding, records), not the transport's alone: the "
        f"scripted judge, which sends nothing, costs {marginal['scripted']:.2f} ms per call of it, so the "
        f"transport's own share is {transport_share}. A one-time cost can sit inside the "
        f"marginal: loading the language detector's model costs {detector_cpu:.2f} CPU s once "
        f"({detector_cpu / (calls[f'scripted{args.large}'] - calls[f'scripted{args.small}']) * 1000:.2f} ms per "
        "call of this marginal) and counts in it only when the small set does not load it (the first 40 RAGTruth "
        "QA dev answers do not, the first 200 do: compare `--small 200`).",
    ]
    if workers:
        lines += [
            "",
            "| worker set-up (fresh process: AuditShard + 1 sample) | median wall s | / OpenAI-compatible |",
            "|---|---:|---:|",
            *(f"| {name} | {statistics.median(walls):.2f} | {ratio(workers, name, 'openai-compatible'):.2f}x |"
              for name, walls in workers.items()),
        ]
    record("OpenAI-compatible transport: client CPU per call" if args.cpu_only
           else "OpenAI-compatible transport: start-up, CPU per call, worker set-up", lines)


if __name__ == "__main__":
    main()
