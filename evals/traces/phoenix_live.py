"""The README's Phoenix walk-through against a real ``phoenix serve`` (not in CI: Phoenix needs a virtual
environment of its own, its pins conflict with rt4chart's).

    python3 -m venv /work/phoenix-venv && /work/phoenix-venv/bin/pip install arize-phoenix opentelemetry-sdk \\
        opentelemetry-exporter-otlp-proto-common openinference-instrumentation-openai openai
    python evals/traces/phoenix_live.py --phoenix-venv /work/phoenix-venv

What it does, each step checked (a failed check exits 1 naming it):
1. starts ``phoenix serve`` (SQLite in a temporary folder, 127.0.0.1, a free port) and waits for it;
2. a small RAG app (tests/fixtures/traces/make_real_sdk.py: OpenInference's OpenAI instrumentation around a
   real ``openai`` client calling a stand-in LLM) runs in that venv; its spans go to Phoenix over
   OTLP/HTTP (protobuf, ``POST /v1/traces``);
3. ``rt4 verify phoenix://127.0.0.1:PORT/default --write-back`` audits the project; a file-based audit
   of the same turns (``--input-format otlp``) must give the same labels per trace;
4. the annotations read back through Phoenix's API (``GET /v1/projects/default/span_annotations``): one
   per answer, labels equal to the records';
5. the same audit again under a fresh watermark: the annotations are updated, none added;
6. the app runs once more: the next run (same watermark) audits only its new traces.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "examples" / "answers.rules.json"
APP = ROOT / "tests" / "fixtures" / "traces" / "make_real_sdk.py"
# Runs in the Phoenix venv: an OTLP/JSON export (ids in hex) to protobuf, posted to Phoenix's OTLP/HTTP route.
SEND = """
import base64, json, sys, urllib.request
from google.protobuf.json_format import ParseDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
def b64(value):
    if isinstance(value, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId")
                    and isinstance(v, str) else b64(v)) for k, v in value.items()}
    return [b64(v) for v in value] if isinstance(value, list) else value
body = ParseDict(b64(json.load(open(sys.argv[1]))), ExportTraceServiceRequest()).SerializeToString()
request = urllib.request.Request(sys.argv[2] + "/v1/traces", data=body,
                                 headers={"Content-Type": "application/x-protobuf"})
print(urllib.request.urlopen(request).status)
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _check(condition: bool, what: str) -> None:
    print(("ok    " if condition else "FAILED") + f" {what}", flush=True)
    if not condition:
        sys.exit(1)


def _rt4(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rt4chart", *args]
    print("$ rt4 " + " ".join(args), flush=True)
    return subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _send_app_traces(venv: Path, url: str, folder: Path, name: str) -> Path:
    export = folder / f"{name}.json"
    subprocess.run([str(venv / "bin" / "python"), str(APP), str(export)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-c", SEND, str(export), url], check=True)
    return export


def _annotations(url: str, span_ids: list[str]) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/v1/projects/default/span_annotations", params={"span_ids": span_ids, "limit": 1000})
    response.raise_for_status()
    found: list[dict[str, Any]] = response.json()["data"]
    return [a for a in found if a["name"] == "rt4chart"]


def _wait_for_spans(url: str, count: int, deadline_s: float = 60.0) -> None:
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        spans = httpx.get(f"{url}/v1/projects/default/spans/otlpv1", params={"limit": 1000}).json().get("data", [])
        if len(spans) >= count:
            return
        time.sleep(1)
    _check(False, f"Phoenix holds {count} spans within {deadline_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phoenix-venv", type=Path, required=True, help="a venv with arize-phoenix and the app's SDKs")
    parser.add_argument("--startup-s", type=float, default=300.0, help="how long phoenix serve may take to start")
    args = parser.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        env = {**os.environ, "PHOENIX_WORKING_DIR": str(folder / "phoenix"), "PHOENIX_HOST": "127.0.0.1",
               "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(_free_port())}
        started = time.monotonic()
        server = subprocess.Popen([str(args.phoenix_venv / "bin" / "phoenix"), "serve"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while time.monotonic() - started < args.startup_s:
                try:
                    if httpx.get(f"{url}/v1/projects", timeout=2).is_success:
                        break
                except httpx.HTTPError:
                    time.sleep(1)
            else:
                _check(False, f"phoenix serve answers within {args.startup_s:.0f} s")
            print(f"phoenix serve up in {time.monotonic() - started:.0f} s at {url}", flush=True)
            export = _send_app_traces(args.phoenix_venv, url, folder, "first")
            _wait_for_spans(url, 9)  # 3 traces of 3 spans
            source = f"phoenix://127.0.0.1:{port}/default"
            out, cache = folder / "audit.jsonl", folder / "cache"
            audit = _rt4("verify", source, "--write-back", "--judge", f"scripted:{RULES}", "--cache-dir", str(cache),
                         "-o", str(out))
            print(audit.stderr)
            records = _records(out)
            file_out = folder / "file.jsonl"
            _rt4("verify", str(export), "--input-format", "otlp", "--judge", f"scripted:{RULES}", "--no-cache",
                 "-o", str(file_out), "-q")
            _check({r["id"]: r["label"] for r in records} == {r["id"]: r["label"] for r in _records(file_out)},
                   "labels per trace equal a file-based audit of the same turns")
            answered = [r for r in records if r["label"] is not None]
            annotations = _annotations(url, [r["trace"]["answer_span_id"] for r in answered])
            _check(sorted((a["span_id"], a["result"]["label"]) for a in annotations)
                   == sorted((r["trace"]["answer_span_id"], r["label"]) for r in answered),
                   f"one annotation per answer ({len(answered)}), labels equal to the records'")
            again = _rt4("verify", source, "--write-back", "--judge", f"scripted:{RULES}", "--cache-dir",
                          str(folder / "fresh"), "-o", str(folder / "again.jsonl"), "-q")
            print(again.stderr)
            rerun = _annotations(url, [r["trace"]["answer_span_id"] for r in answered])
            _check(sorted(a["id"] for a in rerun) == sorted(a["id"] for a in annotations),
                   "a rerun updates the annotations, adds none")
            _send_app_traces(args.phoenix_venv, url, folder, "second")
            _wait_for_spans(url, 18)
            nightly = _rt4("verify", source, "--write-back", "--judge", f"scripted:{RULES}", "--cache-dir",
                           str(cache), "-o", str(folder / "nightly.jsonl"))
            print(nightly.stderr)
            new = _records(folder / "nightly.jsonl")
            _check(len(new) == 3 and not {r["id"] for r in new} & {r["id"] for r in records},
                   "the watermark: the next run audits only the 3 new traces")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
