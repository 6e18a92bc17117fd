"""``rt4 estimate``'s expected cost against what a run really costs at a real OpenAI-compatible
server on 127.0.0.1 (tests/faults.py), priced here from the requests and replies the server saw.

The server answers every verify request with grounded judgements and reports token counts of four
characters a token (the approximation the judge counts prompts with), so the real cost of the run is
computed here, call by call, from the server's side of the wire. The expected cost must land near
it, from typical reply sizes on a cold cache and from the cache's own replies once it holds some;
the worst case must stay above it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from audit_fixtures import write_samples
from faults import FaultServer, fault_server, grounded
from typer.testing import CliRunner

from rt4chart.cli.app import app

INPUT_USD, OUTPUT_USD = 1.0e-6, 4.0e-6
"""The judge profile's prices per token (1 and 4 USD per million)."""
OPTIONS = ["--decomposer", "rules", "--no-global"]  # a plan whose calls are exactly the run's


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def prompt_tokens(body: dict[str, Any]) -> int:
    return tokens("".join(message["content"] for message in body["messages"]))


def real_cost(server: FaultServer, since: int) -> float:
    """The USD of the calls the server answered from request ``since`` on, at the profile's prices."""
    return sum(prompt_tokens(body) * INPUT_USD + tokens(grounded(body)) * OUTPUT_USD
               for body in server.requests[since:])


def profile(directory: Path) -> Path:
    path = directory / "priced.toml"
    path.write_text('name = "priced"\nmodel = "openai/priced"\ninput_usd_per_mtok = 1.0\n'
                    'output_usd_per_mtok = 4.0\n', encoding="utf-8")
    return path


def estimate(inputs: Path, judge: Path, cache: Path, url: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["estimate", str(inputs), "--judge", str(judge), "--api-base", url,
                                      "--cache-dir", str(cache), "--json", *OPTIONS])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def verify(inputs: Path, judge: Path, cache: Path, url: str, out: Path) -> None:
    result = CliRunner().invoke(app, ["verify", str(inputs), "--judge", str(judge), "--api-base", url,
                                      "--cache-dir", str(cache), "--out", str(out), "-q", *OPTIONS])
    assert result.exit_code in (0, 1), result.output


def test_the_expected_cost_is_near_the_real_one_and_the_worst_case_above(tmp_path: Path) -> None:
    judge, cache = profile(tmp_path), tmp_path / "cache"
    first, both = tmp_path / "first.jsonl", tmp_path / "both.jsonl"
    samples = write_samples(both, 16)
    first.write_text("".join(json.dumps(s) + "\n" for s in samples[:8]), encoding="utf-8")
    with fault_server(grounded) as server:
        server.prompt_tokens, server.completion_tokens = prompt_tokens, tokens
        cold = estimate(first, judge, cache, server.base_url)
        verify(first, judge, cache, server.base_url, tmp_path / "a.jsonl")
        spent = real_cost(server, 0)
        assert cold["calls_expected"] == len(server.requests) and cold["cached"] == 0
        # Typical reply sizes, no history: within a third of the real cost.
        assert abs(cold["expected_usd"] - spent) <= spent / 3, (cold["expected_usd"], spent)
        full = cold["prompt_tokens"] * INPUT_USD + cold["max_completion_tokens"] * OUTPUT_USD
        assert cold["expected_usd"] < full <= cold["worst_case_usd"] and spent <= cold["worst_case_usd"]
        # Its own printed tokens at the profile's prices.
        assert cold["expected_usd"] == pytest.approx(
            cold["prompt_tokens"] * INPUT_USD + cold["expected_completion_tokens"] * OUTPUT_USD)

        # The first eight are cached now: they cost nothing, and their replies size the other eight.
        warm = estimate(both, judge, cache, server.base_url)
        before = len(server.requests)
        verify(both, judge, cache, server.base_url, tmp_path / "b.jsonl")
        spent_now = real_cost(server, before)
    assert warm["cached"] == cold["calls_expected"] and warm["sized_from_cache"] == warm["cached"]
    assert warm["calls_expected"] - warm["cached"] == len(server.requests) - before
    assert abs(warm["expected_usd"] - spent_now) <= spent_now * 0.05, (warm["expected_usd"], spent_now)
    print(f"cold: expected {cold['expected_usd']:.6f}, real {spent:.6f}, full replies {full:.6f}, worst "
          f"{cold['worst_case_usd']:.6f}; warm: expected {warm['expected_usd']:.6f}, real {spent_now:.6f}")
