"""The hard budget: spend never crosses it, only complete records are written, resume finishes."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from audit_fixtures import read_records, write_rules, write_samples
from conftest import judge_over
from faults import fault_server, judge_every_claim
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.judges.budget import Ledger, MeteredBackend
from rt4chart.judges.registry import resolve_judge
from rt4chart.judges.scripted import ScriptedBackend
from rt4chart.options import AuditOptions
from rt4chart.records.io import read_jsonl
from rt4chart.runs.engine import Pipeline, run_audit
from rt4chart.types import Usage

COST = 0.01
runner = CliRunner()


def test_ledger_reserves_within_the_limit_and_settles_to_the_real_cost() -> None:
    ledger = Ledger(limit_usd=1.0)
    assert ledger.reserve(0.6)
    assert not ledger.reserve(0.5), "0.6 reserved + 0.5 would cross 1.0"
    assert ledger.refused == 1
    ledger.settle(0.6, Usage(calls=1, cost_usd=0.2))
    assert (ledger.reserved_usd, ledger.spent_usd) == (0.0, 0.2)
    assert ledger.reserve(0.8)
    assert Ledger().reserve(1e9), "no limit, no refusal"


@pytest.mark.parametrize("in_flight", [1, 4])
def test_spend_never_exceeds_the_budget_and_only_complete_records_are_written(
    tmp_path: Path, in_flight: int
) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json", cost_per_call=COST)
    write_samples(inputs, 10)
    ledger = Ledger(limit_usd=0.2)
    pipeline = Pipeline(
        MeteredBackend(ScriptedBackend.from_file(rules), ledger),
        AuditOptions(samples_in_flight=in_flight),
    )
    out = tmp_path / "out.jsonl"
    result = asyncio.run(run_audit(pipeline, list(read_jsonl(inputs)), out, lambda report: None))
    records = read_records(out)
    assert result.stopped_by_budget
    assert ledger.spent_usd <= 0.2 + 1e-12
    assert ledger.spent_usd == pytest.approx(ledger.usage.calls * COST)
    assert result.written == len(records) and result.remaining == 10 - len(records)
    assert [r["line"] for r in records] == list(range(1, len(records) + 1))
    assert all(r["label"] is not None and len(r["claims"]) == 2 for r in records)


def test_cli_stops_with_exit_3_then_resume_with_a_larger_budget_finishes(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json", cost_per_call=COST)
    write_samples(inputs, 10)
    out, cache = tmp_path / "out.jsonl", str(tmp_path / "cache")
    args = ["verify", str(inputs), "--judge", f"scripted:{rules}", "--out", str(out), "--cache-dir", cache,
            "--samples-in-flight", "1"]
    first = runner.invoke(app, [*args, "--budget", "0.2"])
    assert first.exit_code == 3, first.output
    assert "stopped by budget" in first.output
    partial = read_records(out)
    assert 0 < len(partial) < 10, "a budget for about half the work writes about half the records"
    assert sum(r["usage"]["cost_usd"] for r in partial) <= 0.2

    second = runner.invoke(app, [*args, "--budget", "1.0", "--resume"])
    assert second.exit_code == 1, second.output
    records = read_records(out)
    assert [r["id"] for r in records] == [f"s{i}" for i in range(10)]
    assert records[: len(partial)] == partial, "records of the first run are kept as they were"
    new = records[len(partial) :]
    assert sum(r["usage"]["cache_hits"] for r in new) > 0, "calls paid before the stop are not paid again"


def table_value(output: str, row: str) -> str:
    match = re.search(rf"{row}\s*│\s*([^│]+?)\s*│", output)
    assert match, f"no row {row!r} in:\n{output}"
    return match.group(1)


def test_estimate_prices_the_planned_calls_without_calling_the_judge(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json", cost_per_call=COST)
    write_samples(inputs, 3)
    args = ["estimate", str(inputs), "--judge", f"scripted:{rules}", "--cache-dir", str(tmp_path / "cache")]
    cold = runner.invoke(app, args)
    assert cold.exit_code == 0, cold.output
    # Per sample: one decomposition, one local call (one chunk, both claims in a batch), one global call.
    assert table_value(cold.output, "judge calls \\(expected\\)") == "9"
    assert table_value(cold.output, "cost, expected \\(typical replies, cached calls free\\)") == "$0.0900"
    worst_calls = int(table_value(cold.output, "judge calls \\(worst case\\)"))
    worst_cost = table_value(cold.output, "cost, worst case \\(full replies, every re-ask\\)")
    assert float(worst_cost.lstrip("$")) >= worst_calls * COST > 9 * COST
    assert table_value(cold.output, "already cached") == "0"

    audit = runner.invoke(app, ["verify", str(inputs), "--judge", f"scripted:{rules}", "-q",
                                "--cache-dir", str(tmp_path / "cache")])
    assert audit.exit_code == 1
    warm = runner.invoke(app, args)
    # Decomposition and local calls are planned exactly; the real global stage split the claims
    # into two hint groups, so the planned single global call is not in the cache.
    assert table_value(warm.output, "already cached") == "6"


def test_max_tokens_bounds_what_each_planned_call_reserves(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json", cost_per_call=COST)
    write_samples(inputs, 3)
    args = ["estimate", str(inputs), "--judge", f"scripted:{rules}", "--cache-dir", str(tmp_path / "cache")]
    default = runner.invoke(app, args)
    bounded = runner.invoke(app, [*args, "--max-tokens", "100"])
    assert default.exit_code == bounded.exit_code == 0, bounded.output
    assert table_value(default.output, "completion tokens \\(expected calls, full max_tokens\\)") == str(9 * 1024)
    assert table_value(bounded.output, "completion tokens \\(expected calls, full max_tokens\\)") == str(9 * 100)
    refused = runner.invoke(app, [*args, "--max-tokens", "0"])
    assert refused.exit_code == 2 and "--max-tokens: Input should be greater than or equal to 1" in refused.output


def test_claims_carry_their_share_of_the_cost(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json", cost_per_call=COST)
    write_samples(inputs, 1)
    out = tmp_path / "out.jsonl"
    args = ["verify", str(inputs), "--judge", f"scripted:{rules}", "--no-cache", "-q", "-o", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    record = read_records(out)[0]
    # One decomposition call, one local call judging both claims, one global call per hint group.
    assert [(c["calls"], c["cost_usd"]) for c in record["claims"]] == [
        (2, pytest.approx(COST / 2 + COST)),
        (2, pytest.approx(COST / 2 + COST)),
    ]
    decomposition = COST
    assert sum(c["cost_usd"] for c in record["claims"]) + decomposition == pytest.approx(record["usage"]["cost_usd"])


# --- a worst case the server cannot exceed --------------------------------------------------------


def test_ledger_books_at_most_the_reservation_and_reports_the_overrun() -> None:
    ledger = Ledger(limit_usd=1.0)
    assert ledger.reserve(0.3)
    assert ledger.settle(0.3, Usage(calls=1, cost_usd=0.5)) == pytest.approx(0.2)
    assert (ledger.spent_usd, ledger.overrun_usd) == (pytest.approx(0.3), pytest.approx(0.2))
    for bad in (float("nan"), float("inf"), -0.01):
        with pytest.raises(ValueError, match="finite"):
            Ledger(limit_usd=bad)


def _bytes_of(body: dict[str, Any]) -> int:
    return sum(len(str(m["content"]).encode()) for m in body["messages"])


@pytest.mark.parametrize(
    ("reported_prompt_tokens", "stops_on_overrun"),
    [
        # A tokenizer close to one token per byte: far more than rt4's own count, still possible.
        (lambda body: int(_bytes_of(body) * 0.95), False),
        # A server that over-reports beyond any tokenizer.
        (lambda body: 1_000_000, True),
    ],
)
def test_spend_stays_under_the_cap_whatever_the_server_reports(
    tmp_path: Path, reported_prompt_tokens: Callable[[dict[str, Any]], int], stops_on_overrun: bool, transport: str
) -> None:
    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, 12)
    cap = 0.002
    ledger = Ledger(limit_usd=cap)
    with fault_server(judge_every_claim("entailed")) as server:
        server.prompt_tokens = reported_prompt_tokens
        backend = resolve_judge(judge_over(transport, "gpt-4o-mini", tmp_path), api_base=server.base_url, concurrency=4,
                                wrap=lambda leaf: MeteredBackend(leaf, ledger))
        options = AuditOptions(decomposer="rules", max_tokens=1, samples_in_flight=4)
        out = tmp_path / "out.jsonl"
        result = asyncio.run(run_audit(Pipeline(backend, options), list(read_jsonl(inputs)), out, lambda r: None))
    assert result.stopped_by_budget
    assert ledger.spent_usd <= cap
    assert sum(r["usage"]["cost_usd"] for r in read_records(out)) <= cap
    assert (ledger.overrun_usd > 0) == stops_on_overrun


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--budget", "nan"), ("--budget", "inf"), ("--budget", "-1"), ("--concurrency", "0"),
     ("--concurrency", "-1"), ("--timeout", "0"), ("--timeout", "nan"), ("--samples-in-flight", "0")],
)
def test_run_limits_that_make_no_sense_are_refused_before_any_work(tmp_path: Path, flag: str, value: str) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json", cost_per_call=COST)
    write_samples(inputs, 1)
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["verify", str(inputs), "--judge", f"scripted:{rules}", "--out", str(out),
                                 "--no-cache", flag, value])
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Traceback" not in result.output
    assert not out.exists(), "refused before any work"


# --- money told honestly (issue 27, item 4) ------------------------------------------------------


def test_negative_usage_is_an_error_on_its_call_and_never_credits_the_ledger(tmp_path: Path, transport: str) -> None:
    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, 30)
    cap = 0.03  # about 30 calls at their worst case: a few samples, far from all 30
    ledger = Ledger(limit_usd=cap)
    with fault_server(judge_every_claim("entailed")) as server:
        server.prompt_tokens = lambda body: -1_000_000_000
        backend = resolve_judge(judge_over(transport, "gpt-4o-mini", tmp_path), api_base=server.base_url, concurrency=4,
                                wrap=lambda leaf: MeteredBackend(leaf, ledger))
        options = AuditOptions(decomposer="rules", max_tokens=1, samples_in_flight=1)
        out = tmp_path / "out.jsonl"
        result = asyncio.run(run_audit(Pipeline(backend, options), list(read_jsonl(inputs)), out, lambda r: None))
    assert 0 < ledger.spent_usd <= cap and ledger.usage.cost_usd >= 0
    assert result.stopped_by_budget, "every call is booked at its worst case, so the budget ends the run"
    records = read_records(out)
    assert records and all(r["label"] is None for r in records)
    assert all("negative usage" in vote["error"] for r in records for c in r["claims"] for vote in c["votes"])


def test_a_small_budget_finishes_whole_samples_and_every_resume_makes_progress(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json", cost_per_call=COST)
    write_samples(inputs, 16)
    out = tmp_path / "out.jsonl"
    # About two and a half samples' worth, with 16 samples in flight (the default).
    args = ["verify", str(inputs), "--judge", f"scripted:{rules}", "--out", str(out), "--no-cache",
            "--decomposer", "rules", "--budget", str(5 * COST + COST / 2)]
    written = []
    for resume in ([], ["--resume"], ["--resume"]):
        done = runner.invoke(app, [*args, *resume])
        assert done.exit_code == 3, done.output
        written.append(len(read_records(out)))
    assert 0 < written[0] < written[1] < written[2], written


def test_the_summary_shows_what_the_server_reported_beyond_the_worst_case(tmp_path: Path, transport: str) -> None:
    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, 6)
    with fault_server(judge_every_claim("entailed")) as server:
        server.prompt_tokens = lambda body: 100_000_000
        judge = judge_over(transport, "gpt-4o-mini", tmp_path)
        done = runner.invoke(app, ["verify", str(inputs), "--judge", judge, "--api-base", server.base_url,
                                   "--decomposer", "rules", "--no-cache", "--budget", "0.05", "--max-tokens", "1",
                                   "--out", str(tmp_path / "out.jsonl")])
    assert done.exit_code == 3, done.output
    assert float(table_value(done.output, "reported beyond worst case").split()[0].lstrip("$")) > 1
    assert int(table_value(done.output, "calls by this run").split()[0]) >= 1
