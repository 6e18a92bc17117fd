"""The OpenAI-compatible transport (aiohttp): the same calls and records as litellm's on the same
server, never an import of litellm, and a server without JSON-schema output met with one 400.

Faults, secrets and budgets over both transports are in test_judge_unavailable.py, test_secrets.py
and test_budget.py (the ``transport`` fixture); the contract is in test_contract.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, TRANSPORTS, VerifyRequestFactory, judge_over
from faults import fault_server, grounded, judge_every_claim
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.judges.openai_compat import OpenAICompatBackend
from rt4chart.judges.registry import JudgeProfile, resolve_judge
from rt4chart.method.tasks import VerifyOutput

ROOT = Path(__file__).resolve().parents[2]
CLAIM = ["The trial lasts 14 days."]


def test_both_transports_send_the_same_requests_and_write_the_same_records(tmp_path: Path) -> None:
    bodies: dict[str, list[str]] = {}
    records: dict[str, str] = {}
    with fault_server(grounded) as server:
        for transport in TRANSPORTS:
            sent = len(server.requests)
            out = tmp_path / f"{transport}.jsonl"
            done = CliRunner().invoke(app, [
                "verify", str(EXAMPLES / "answers.jsonl"), "--judge", judge_over(transport, "openai/fault", tmp_path),
                "--api-base", server.base_url, "--no-cache", "-q", "--samples-in-flight", "1", "--out", str(out),
            ])
            assert done.exit_code in (0, 1), done.output
            # Calls run concurrently, so their order is not the comparison; what each one sends is.
            bodies[transport] = sorted(json.dumps(body, sort_keys=True) for body in server.requests[sent:])
            records[transport] = out.read_text(encoding="utf-8")
    assert bodies["openai-compatible"] == bodies["litellm"] and bodies["litellm"]
    assert json.loads(bodies["litellm"][0])["response_format"]["type"] == "json_schema"
    assert records["openai-compatible"] == records["litellm"]
    judges = {json.loads(line)["judge"] for line in records["litellm"].splitlines()}
    assert judges == {f"openai/fault@{server.base_url}"}, "the transport is not part of the judge's name"


def _verify_importing(judge: str, base_url: str, cwd: Path) -> tuple[int, set[str]]:
    """Exit code of a real ``rt4 verify`` and the top-level packages it imported (``-X importtime``)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rt4chart", "verify", str(EXAMPLES / "free_trial.jsonl"),
         "--judge", judge, "--api-base", base_url, "--no-cache", "-q", "--out", str(cwd / "out.jsonl")],
        capture_output=True, text=True, timeout=300, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in lines}
    return done.returncode, imported


def test_an_openai_compatible_judge_never_imports_litellm(tmp_path: Path) -> None:
    with fault_server(judge_every_claim("entailed")) as server:
        code, imported = _verify_importing("openai/fault", server.base_url, tmp_path)
        assert code in (0, 1) and len(server.requests) >= 2 and "rt4chart" in imported
        assert "litellm" not in imported and "openai" not in imported
        # The same judge through litellm does import it: the check above can fail.
        code, imported = _verify_importing(judge_over("litellm", "openai/fault", tmp_path), server.base_url, tmp_path)
    assert code in (0, 1) and "litellm" in imported


def test_a_server_without_json_schema_output_is_met_with_one_400(verify_request: VerifyRequestFactory) -> None:
    profile = JudgeProfile(name="schemaless", model="openai/schemaless", backoff_s=0.01)
    with fault_server(judge_every_claim("entailed")) as server:
        server.refused_formats = frozenset({"json_schema"})
        backend = OpenAICompatBackend(profile.openai_compat_settings(), api_key="no-key", api_base=server.base_url)

        async def two_calls() -> list[VerifyOutput | None]:
            replies = [await backend.complete(verify_request(CLAIM)) for _ in range(2)]
            await backend.aclose()
            return [reply.parsed if isinstance(reply.parsed, VerifyOutput) else None for reply in replies]

        parsed = asyncio.run(two_calls())
    assert all(reply is not None for reply in parsed)
    formats = [(body.get("response_format") or {}).get("type") for body in server.requests]
    # The refusal is met once; the second call (and every later backend of this endpoint) asks in JSON mode.
    assert formats == ["json_schema", "json_object", "json_object"]
    assert backend.sender.structured_output == "json_object"


def test_a_400_that_no_structured_output_mode_cures_is_the_calls_error(verify_request: VerifyRequestFactory) -> None:
    with fault_server(judge_every_claim("entailed")) as server:
        server.refused_formats = frozenset({"json_schema", "json_object", None})
        backend = resolve_judge("openai/refuses-all", api_base=server.base_url)
        reply = asyncio.run(backend.complete(verify_request(CLAIM)))
    assert reply.parsed is None and reply.error and "HTTP 400" in reply.error and "not supported" in reply.error
    formats = [(body.get("response_format") or {}).get("type") for body in server.requests]
    assert formats == ["json_schema", "json_object", None]  # tried once each, not retried: a 400 is the request's
    assert isinstance(backend, OpenAICompatBackend) and backend.sender.structured_output == "json_schema"


def test_which_judges_take_the_openai_compatible_transport(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = "http://127.0.0.1:9/v1"
    specs = ("openai/m", "hosted_vllm/org/served", "gpt-4o-mini")
    lean = [resolve_judge(spec, api_base=base) for spec in specs]
    assert all(isinstance(backend, OpenAICompatBackend) for backend in lean)
    assert [backend.name for backend in lean] == [f"{spec}@{base}" for spec in specs]
    assert [backend.sender.model for backend in lean] == ["m", "org/served", "gpt-4o-mini"]  # type: ignore[attr-defined]
    forced = resolve_judge(judge_over("litellm", "gpt-4o-mini", tmp_path), api_base=base)
    assert type(forced).__name__ == "LiteLLMBackend" and forced.name == lean[2].name
    # Another provider's protocol at a base URL stays with litellm.
    assert type(resolve_judge("ollama/llama3", api_base=base)).__name__ == "LiteLLMBackend"
    profile = tmp_path / "cloud.toml"
    profile.write_text('name = "cloud"\nmodel = "gpt-4o-mini"\napi = "openai-compatible"\napi_key_env = "RT4_KEY"\n')
    monkeypatch.setenv("RT4_KEY", "sk-test-0123456789abcdef")
    cloud = resolve_judge(str(profile))
    assert isinstance(cloud, OpenAICompatBackend) and cloud.name == "cloud"
    assert cloud.sender.endpoint == "cloud (at https://api.openai.com/v1)"
