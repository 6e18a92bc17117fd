"""Prompt tokens a provider read from its prompt cache (``usage.prompt_tokens_details.cached_tokens``)
are counted apart and priced at the judge's cached-input rate, in each call, the records, the
manifest and the run's summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from audit_fixtures import read_records, write_samples
from faults import fault_server, grounded

ROOT = Path(__file__).resolve().parents[1]
PROMPT, CACHED, COMPLETION = 1_000, 768, 20
INPUT_USD, CACHED_USD, OUTPUT_USD = 1.0, 0.25, 4.0
"""Per million tokens."""


def profile(path: Path, base_url: str, *, cached_price: bool) -> Path:
    cached = f"cached_input_usd_per_mtok = {CACHED_USD}\n" if cached_price else ""
    path.write_text(
        f'name = "cached"\nmodel = "openai/cached"\napi_base = "{base_url}"\n'
        f"input_usd_per_mtok = {INPUT_USD}\noutput_usd_per_mtok = {OUTPUT_USD}\n{cached}",
        encoding="utf-8",
    )
    return path


def audit(tmp_path: Path, *, cached_price: bool) -> tuple[list[dict[str, Any]], dict[str, Any], str, int]:
    write_samples(tmp_path / "in.jsonl", 3)
    with fault_server(grounded) as server:
        server.prompt_tokens = lambda body: PROMPT
        server.cached_tokens = lambda body: CACHED
        server.completion_tokens = COMPLETION
        judge = profile(tmp_path / "judge.toml", server.base_url, cached_price=cached_price)
        done = subprocess.run(
            [sys.executable, "-m", "rt4chart", "verify", "in.jsonl", "--out", "out.jsonl", "--judge", str(judge),
             "--decomposer", "rules", "--no-cache"],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": "no-key"},
            capture_output=True, text=True, timeout=300, check=False,
        )
        calls = len(server.requests)
    assert done.returncode in (0, 1), done.stderr
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text(encoding="utf-8"))
    return read_records(tmp_path / "out.jsonl"), manifest, done.stderr, calls


@pytest.mark.parametrize("cached_price", [True, False], ids=["cached rate", "no cached rate: the prompt rate"])
def test_cached_prompt_tokens_are_counted_and_priced_at_their_rate(tmp_path: Path, cached_price: bool) -> None:
    records, manifest, summary, calls = audit(tmp_path, cached_price=cached_price)
    cached_rate = CACHED_USD if cached_price else INPUT_USD
    per_call = ((PROMPT - CACHED) * INPUT_USD + CACHED * cached_rate + COMPLETION * OUTPUT_USD) / 1e6
    assert calls > 0 and sum(record["usage"]["calls"] for record in records) == calls
    for record in records:
        usage = record["usage"]
        assert usage["prompt_tokens"] == PROMPT * usage["calls"]
        assert usage["cached_prompt_tokens"] == CACHED * usage["calls"]
        assert usage["cost_usd"] == pytest.approx(per_call * usage["calls"])
    assert manifest["usage"]["cached_prompt_tokens"] == CACHED * calls
    assert manifest["usage"]["cost_usd"] == pytest.approx(per_call * calls)
    assert f"{CACHED * calls} from the provider's prompt cache" in summary
