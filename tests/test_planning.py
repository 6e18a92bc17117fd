"""``rt4 estimate`` plans an audit by running it against a judge that answers nothing: its expected
count is exact where the plan is knowable (rule-based claims, no global stage), and its worst case
is never below what a cold audit really sends."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from audit_fixtures import write_rules, write_samples
from fixtures.spine.judges import copy_running_example
from typer.testing import CliRunner

from rt4chart.analysis.datasets import default_data_dir, load_dataset
from rt4chart.cli.app import app

runner = CliRunner()


def plan(input_path: Path, *args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["estimate", str(input_path), "--json", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def cold_calls(input_path: Path, *args: str) -> int:
    """Judge calls a cold audit makes (no cache): the sum of every record's ``usage.calls``."""
    out = input_path.parent / "cold.jsonl"
    result = runner.invoke(app, ["verify", str(input_path), "--no-cache", "-q", "--out", str(out), *args])
    assert result.exit_code in (0, 1), result.output
    return sum(json.loads(line)["usage"]["calls"] for line in out.read_text(encoding="utf-8").splitlines())


VARIANTS = [
    pytest.param([], id="default"),
    pytest.param(["--no-global"], id="no-global"),
    pytest.param(["--decomposer", "rules"], id="rules"),
    pytest.param(["--batch-claims", "1"], id="one-claim-per-call"),
    pytest.param(["--decomposer", "rules", "--no-global"], id="rules-no-global"),
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_running_example_never_exceeds_its_worst_case(tmp_path: Path, variant: list[str]) -> None:
    input_path, rules = copy_running_example(tmp_path)
    args = ["--judge", f"scripted:{rules}", "--window", "2", "--overlap", "1", *variant]
    estimate, real = plan(input_path, *args), cold_calls(input_path, *args)
    assert estimate["calls_worst_case"] >= real >= 1
    if "--no-global" in variant and "rules" in variant:
        assert estimate["calls_expected"] == real


@pytest.mark.parametrize("variant", VARIANTS)
def test_twenty_short_samples_never_exceed_their_worst_case(tmp_path: Path, variant: list[str]) -> None:
    # The case of the issue: rule-based claims, global stage on, twenty short samples. The real
    # global stage groups claims by their deciding chunk, so it may send more calls than expected.
    input_path = tmp_path / "in.jsonl"
    write_samples(input_path, 20)
    args = ["--judge", f"scripted:{write_rules(tmp_path / 'rules.json')}", *variant]
    estimate, real = plan(input_path, *args), cold_calls(input_path, *args)
    assert estimate["calls_expected"] <= estimate["calls_worst_case"]
    assert estimate["calls_worst_case"] >= real
    if "--no-global" in variant and "rules" in variant:
        assert estimate["calls_expected"] == real


RAGTRUTH_DEV = default_data_dir() / "ragtruth-qa" / "dev.jsonl"
DEV_SAMPLES = int(os.environ.get("RT4_PLAN_DEV_SAMPLES", "60"))


@pytest.mark.skipif(not RAGTRUTH_DEV.is_file(), reason="RAGTruth QA dev is not beside the checkout")
@pytest.mark.parametrize("variant", [pytest.param([], id="default"), pytest.param(["--no-global"], id="no-global")])
def test_ragtruth_dev_with_the_embedded_judge(tmp_path: Path, variant: list[str]) -> None:
    """The first RT4_PLAN_DEV_SAMPLES (default 60) dev samples; the embedded judge decomposes by
    rules, so without the global stage the expected count is exact."""
    input_path = tmp_path / "dev.jsonl"
    samples = load_dataset("ragtruth-qa", RAGTRUTH_DEV.parent, "dev", DEV_SAMPLES)
    input_path.write_text("".join(s.model_dump_json(exclude={"gold"}) + "\n" for s in samples), encoding="utf-8")
    estimate, real = plan(input_path, *variant), cold_calls(input_path, *variant)
    assert estimate["calls_worst_case"] >= real
    if variant:
        assert estimate["calls_expected"] == real


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_embedded_plan_is_the_runs_calls_and_lists_no_tokens(tmp_path: Path) -> None:
    input_path = tmp_path / "answers.jsonl"
    input_path.write_bytes((EXAMPLES / "answers.jsonl").read_bytes())
    cache = ["--cache-dir", str(tmp_path / "plan-cache")]
    estimate, real = plan(input_path, *cache), cold_calls(input_path)
    assert estimate["calls_expected"] == real >= 1
    assert estimate["prompt_tokens"] == 0 and not estimate["counts_tokens"]
    table = runner.invoke(app, ["estimate", str(input_path), *cache], catch_exceptions=False).output
    assert "prompt tokens" not in table and "judge calls (expected)" in table


def test_a_cloud_judge_is_priced_without_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    input_path = tmp_path / "answers.jsonl"
    input_path.write_bytes((EXAMPLES / "answers.jsonl").read_bytes())
    estimate = plan(input_path, "--judge", "gpt-4o-mini", "--cache-dir", str(tmp_path / "cache"))
    assert estimate["expected_usd"] > 0 and estimate["prompt_tokens"] > 0
    # The audit itself still needs the key, before any work.
    verified = runner.invoke(app, ["verify", str(input_path), "--judge", "gpt-4o-mini", "-o", str(tmp_path / "o")])
    assert verified.exit_code == 2 and "OPENAI_API_KEY" in verified.output
