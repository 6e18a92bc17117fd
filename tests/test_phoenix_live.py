"""The README's Phoenix walk-through against a real ``phoenix serve`` (arize-phoenix, SQLite, 127.0.0.1).

Phoenix's pins conflict with rt4chart's, so it runs from a virtual environment of its own, named by
``RT4_PHOENIX_PYTHON`` (its python; ``.ci/run`` builds ``.venv-phoenix`` from tests/phoenix/requirements.txt
with uv and sets it); without it the test is skipped, saying so (a failure under ``RT4_REQUIRE_ALL=1``).

1. ``phoenix serve`` starts with its working directory (SQLite) in a temporary folder and its HTTP and gRPC
   ports free ones on 127.0.0.1, so two pytest-xdist workers never share a server;
2. a small RAG app (tests/fixtures/traces/make_real_sdk.py: OpenInference's OpenAI instrumentation around a
   real ``openai`` client calling a stand-in LLM) runs in that environment; the SDK's OTLP/HTTP exporter sends
   its spans to Phoenix, and the app writes the same request as an OTLP/JSON file;
3. ``rt4 verify phoenix://127.0.0.1:PORT/default --write-back`` audits the project: the same labels per trace
   as a file-based audit of the same turns (``--input-format otlp``);
4. the annotations read back through Phoenix's REST API: one per answer, labels equal to the records';
5. the same audit under a fresh watermark updates the annotations and adds none;
6. the app runs again (its request also written as protobuf): the next run from the first watermark audits
   only the new traces, with the labels of a file-based audit of that protobuf export.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "examples" / "answers.rules.json"
APP = ROOT / "tests" / "fixtures" / "traces" / "make_real_sdk.py"
EXIT_USAGE = 2
PROJECT = "default"
"""The project Phoenix files spans under when the app names none."""
TRACES_PER_RUN = 3
"""The app's questions per run, one trace each."""
SPANS_PER_RUN = 3 * TRACES_PER_RUN
"""Each trace is a CHAIN, a RETRIEVER and an LLM span."""
STARTUP_DEADLINE_S = 180.0
"""How long ``phoenix serve`` may take to answer (it migrates its SQLite database first)."""
INGEST_DEADLINE_S = 60.0
"""How long Phoenix may take to store spans it has accepted (it inserts them in batches)."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Phoenix:
    """A running ``phoenix serve`` and the environment it runs from."""

    python: Path
    """The Phoenix environment's python (the app runs there too)."""
    url: str
    """``http://127.0.0.1:PORT``."""

    @property
    def source(self) -> str:
        return f"phoenix://{self.url.removeprefix('http://')}/{PROJECT}"


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """``phoenix serve`` from ``RT4_PHOENIX_PYTHON``'s environment, alone on its ports and its database."""
    configured = os.environ.get("RT4_PHOENIX_PYTHON")
    if not configured:
        pytest.skip("needs a Phoenix environment: set RT4_PHOENIX_PYTHON to the python of a venv built from "
                    "tests/phoenix/requirements.txt (.ci/run builds .venv-phoenix and sets it)")
    python = Path(configured)
    folder = tmp_path_factory.mktemp("phoenix")
    port = _free_port()
    # Only this server's settings: a PHOENIX_* of the caller (another database, auth) must not leak in.
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("PHOENIX_", "OTEL_"))}
    environment |= {"PHOENIX_WORKING_DIR": str(folder), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
                    "PHOENIX_GRPC_PORT": str(_free_port()), "PHOENIX_TELEMETRY_ENABLED": "false"}
    log = folder / "phoenix.log"
    with log.open("wb") as output:
        server = subprocess.Popen([str(python.parent / "phoenix"), "serve"], env=environment, stdout=output,
                                  stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(server, url, log)
        yield Phoenix(python, url)
    finally:
        server.terminate()
        server.wait(timeout=30)


def _wait_until_up(server: subprocess.Popen[bytes], url: str, log: Path) -> None:
    until = time.monotonic() + STARTUP_DEADLINE_S
    while time.monotonic() < until and server.poll() is None:
        try:
            if httpx.get(f"{url}/v1/projects", timeout=2).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
    pytest.fail(f"phoenix serve did not answer at {url} (exit {server.poll()}); its log ends:\n{tail}")


def _run_app(phoenix: Phoenix, export: Path, *flags: str) -> None:
    """The RAG app once: its spans sent to Phoenix, its request written to ``export`` (and ``flags``' files)."""
    done = subprocess.run([str(phoenix.python), str(APP), str(export), "--endpoint", phoenix.url, *flags],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr


def _spans_stored(phoenix: Phoenix, count: int) -> None:
    """Wait until Phoenix holds ``count`` spans of the project (it stores accepted spans in batches)."""
    until, stored = time.monotonic() + INGEST_DEADLINE_S, 0
    while time.monotonic() < until:
        page = httpx.get(f"{phoenix.url}/v1/projects/{PROJECT}/spans/otlpv1", params={"limit": 1000}, timeout=30)
        stored = len(page.json().get("data") or []) if page.is_success else 0
        if stored >= count:
            return
        time.sleep(0.5)
    pytest.fail(f"Phoenix stored {stored} of the {count} spans sent within {INGEST_DEADLINE_S:.0f} s")


def _rt4(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "rt4chart", *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=ROOT)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _audit(phoenix: Phoenix, out: Path, cache: Path) -> list[dict[str, Any]]:
    done = _rt4("verify", phoenix.source, "--write-back", "--judge", f"scripted:{RULES}", "--cache-dir", str(cache),
                "-o", str(out))
    # Each run of the app has one question its retriever found nothing for: invalid input, its record says so.
    assert done.returncode == EXIT_USAGE, done.stderr
    return _records(out)


def _file_audit(export: Path, out: Path) -> dict[str, str | None]:
    done = _rt4("verify", str(export), "--input-format", "otlp", "--judge", f"scripted:{RULES}", "--no-cache",
                "-o", str(out), "-q")
    assert done.returncode == EXIT_USAGE, done.stderr
    return _labels(_records(out))


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _labels(records: list[dict[str, Any]]) -> dict[str, str | None]:
    return {record["id"]: record["label"] for record in records}


def _answer_spans(records: list[dict[str, Any]]) -> dict[str, str]:
    """Answer span id -> label of each record with a verdict."""
    return {record["trace"]["answer_span_id"]: record["label"] for record in records if record["label"]}


def _annotations(phoenix: Phoenix, span_ids: list[str]) -> list[dict[str, Any]]:
    """rt4chart's annotations on those spans, as Phoenix's REST API lists them."""
    page = httpx.get(f"{phoenix.url}/v1/projects/{PROJECT}/span_annotations",
                     params={"span_ids": span_ids, "limit": 1000}, timeout=30)
    assert page.is_success, page.text
    return [a for a in page.json()["data"] if a["name"] == "rt4chart"]


def test_a_real_phoenix_project_is_audited_annotated_once_and_read_incrementally(
    phoenix: Phoenix, tmp_path: Path
) -> None:
    first_export = tmp_path / "first.json"
    _run_app(phoenix, first_export)
    _spans_stored(phoenix, SPANS_PER_RUN)
    cache = tmp_path / "cache"
    first = _audit(phoenix, tmp_path / "first.jsonl", cache)
    assert _labels(first) == _file_audit(first_export, tmp_path / "first-file.jsonl")
    assert sorted(label or "" for label in _labels(first).values()) == ["", "contradicted", "entailed"]

    answered = _answer_spans(first)
    annotations = _annotations(phoenix, list(answered))
    assert {a["span_id"]: a["result"]["label"] for a in annotations} == answered
    assert len(annotations) == len(answered)

    # The same traces audited again (a fresh cache, so a fresh watermark): updated in place, none added.
    again = _audit(phoenix, tmp_path / "again.jsonl", tmp_path / "fresh-cache")
    assert _labels(again) == _labels(first)
    rerun = _annotations(phoenix, list(answered))
    assert sorted(a["id"] for a in rerun) == sorted(a["id"] for a in annotations)

    # New traces arrive; the next run from the first watermark audits them alone.
    second_export, second_binary = tmp_path / "second.json", tmp_path / "second.binpb"
    _run_app(phoenix, second_export, "--protobuf", str(second_binary))
    _spans_stored(phoenix, 2 * SPANS_PER_RUN)
    nightly = _audit(phoenix, tmp_path / "nightly.jsonl", cache)
    assert _labels(nightly) == _file_audit(second_binary, tmp_path / "second-file.jsonl")
    assert len(nightly) == TRACES_PER_RUN and not set(_labels(nightly)) & set(_labels(first))
    assert {a["span_id"]: a["result"]["label"] for a in _annotations(phoenix, list(_answer_spans(nightly)))} == \
        _answer_spans(nightly)
