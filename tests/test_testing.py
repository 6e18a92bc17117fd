"""rt4chart.testing.asserts without pytest's plugin: assertions, their messages, event loops, judge failures
and the budget shared between processes. Real judges: the scripted one of examples/answers.rules.json,
litellm against the fault server and a closed port of 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from conftest import EXAMPLES
from faults import fault_server, grounded
from test_judge_unavailable import closed_port_url

from rt4chart.judges.budget import MeteredBackend
from rt4chart.judges.registry import JudgeConfigError, judge_stack
from rt4chart.method.text import join_passages
from rt4chart.protocol import BackendWrapper, BudgetExhausted, JudgeUnavailable
from rt4chart.testing.asserts import (
    AuditSession,
    GroundingError,
    JudgeFailed,
    SessionBudgetStop,
    SessionSettings,
    SharedLedger,
    aassert_grounded,
    acheck_grounded,
    assert_grounded,
    check_grounded,
    failing_claims,
    support_score,
)
from rt4chart.types import AuditRecord, Label, Sample, Usage

JUDGE = f"scripted:{EXAMPLES / 'answers.rules.json'}"


def example(sample_id: str) -> Sample:
    for line in (EXAMPLES / "answers.jsonl").read_text(encoding="utf-8").splitlines():
        if json.loads(line)["id"] == sample_id:
            return Sample.model_validate_json(line)
    raise KeyError(sample_id)


def test_a_grounded_answer_passes_and_returns_its_record() -> None:
    sample = example("refund-faithful")
    report = assert_grounded(sample.answer, sample.context, sample.question, judge=JUDGE)
    assert report.label is Label.ENTAILED and report.claims


def test_the_failure_names_each_failing_claim_its_label_rationale_and_evidence_in_context() -> None:
    sample = example("paper-running-example")
    with pytest.raises(GroundingError) as failure:
        assert_grounded(sample.answer, sample.context, sample.question, judge=JUDGE)
    message = str(failure.value)
    failing = failure.value.failing
    assert {claim.label for claim in failing} == {Label.CONTRADICTED, Label.BASELESS}
    assert f"{len(failing)} of {len(failure.value.report.claims)} claims not grounded" in message
    context = join_passages(sample.context)[0]
    unwrapped = " ".join(message.split())
    for claim in failing:
        assert f"[{claim.index}] {claim.label} {claim.text}" in unwrapped
        assert f"why: {claim.rationale}" in unwrapped
        for evidence in claim.evidence:
            assert context[evidence.start : evidence.end] == evidence.text
            # the quote is marked inside its surrounding context, and its place is named
            assert f"«{evidence.text}»" in unwrapped
            sentences = ", ".join(str(n) for n in evidence.sentence_ids)
            assert f"[context {evidence.start}-{evidence.end}, sentence {sentences}]" in unwrapped
    entailed = [claim for claim in failure.value.report.claims if claim.label is Label.ENTAILED]
    assert entailed and all(f"] entailed {claim.text}" not in unwrapped for claim in entailed)


def test_fail_on_contradicted_lets_a_baseless_claim_pass_and_check_grounded_never_raises() -> None:
    sample = example("battery-unsupported")
    report = assert_grounded(sample.answer, sample.context, judge=JUDGE, fail_on="contradicted")
    assert report.label is Label.BASELESS
    with pytest.raises(GroundingError):
        assert_grounded(sample.answer, sample.context, judge=JUDGE)
    assert check_grounded(sample.answer, sample.context, judge=JUDGE).label is Label.BASELESS


def test_allowed_unsupported_tolerates_that_many_failing_claims_and_no_more() -> None:
    sample = example("paper-running-example")
    record = check_grounded(sample.answer, sample.context, sample.question, judge=JUDGE)
    failing = len(failing_claims(record))
    assert failing >= 2, "the example needs claims to tolerate"
    passed = assert_grounded(sample.answer, sample.context, sample.question, judge=JUDGE,
                             allowed_unsupported=failing)
    assert passed.label is record.label
    with pytest.raises(GroundingError) as failure:
        assert_grounded(sample.answer, sample.context, sample.question, judge=JUDGE,
                        allowed_unsupported=failing - 1)
    assert f"{failing} of {len(record.claims)} claims not grounded in the context; {failing - 1} allowed" in str(
        failure.value)


def test_min_support_fails_an_answer_whose_share_of_entailed_claims_is_below_it() -> None:
    sample = example("paper-running-example")
    record = check_grounded(sample.answer, sample.context, sample.question, judge=JUDGE)
    score = support_score(record)
    entailed = sum(claim.label is Label.ENTAILED for claim in record.claims)
    assert 0 < score < 1 and score == entailed / len(record.claims)
    tolerant = {"allowed_unsupported": len(record.claims)}
    assert_grounded(sample.answer, sample.context, sample.question, judge=JUDGE, min_support=score, **tolerant)
    with pytest.raises(GroundingError) as failure:
        asyncio.run(aassert_grounded(sample.answer, sample.context, sample.question, judge=JUDGE,
                                     min_support=min(1.0, score + 0.01), **tolerant))
    assert f"support {score:.3g} below min_support=" in str(failure.value)
    assert failure.value.failing == failing_claims(record)


@pytest.mark.parametrize("thresholds", [{"allowed_unsupported": -1}, {"min_support": 1.5}])
def test_thresholds_out_of_range_are_refused_before_any_call(thresholds: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(thresholds))):
        assert_grounded("The sky is blue.", "The sky is blue.", judge="scripted:/nonexistent.json", **thresholds)


def test_a_policy_an_assertion_cannot_have_is_refused() -> None:
    sample = example("refund-faithful")
    for policy in ("never", "sometimes"):
        with pytest.raises(ValueError, match="fail_on must be one of contradicted, hallucinated"):
            assert_grounded(sample.answer, sample.context, judge=JUDGE, fail_on=policy)


def test_an_answer_without_a_sentence_is_a_clear_error_not_a_pass() -> None:
    with pytest.raises(ValueError, match="answer has no sentence to verify"):
        check_grounded("- ", "Some context.", judge=JUDGE)


def test_sync_and_async_assertions_work_inside_a_running_event_loop() -> None:
    sample = example("refund-wrong-number")

    async def in_a_loop() -> tuple[Label | None, Label | None, str]:
        synchronous = check_grounded(sample.answer, sample.context, judge=JUDGE)  # no "loop already running"
        asynchronous = await acheck_grounded(sample.answer, sample.context, judge=JUDGE)
        with pytest.raises(GroundingError) as failure:
            await aassert_grounded(sample.answer, sample.context, judge=JUDGE)
        return synchronous.label, asynchronous.label, str(failure.value)

    sync_label, async_label, message = asyncio.run(in_a_loop())
    assert sync_label is async_label is Label.CONTRADICTED
    assert "60 days" in message


def test_an_unreachable_judge_raises_a_judge_failure_naming_the_endpoint(tmp_path: Path) -> None:
    url = closed_port_url()
    profile = tmp_path / "closed.toml"
    profile.write_text(f'name = "closed"\nmodel = "openai/closed"\napi_base = "{url}"\nbackoff_s = 0.01\n'
                       "backoff_max_s = 0.05\n", encoding="utf-8")
    sample = example("refund-faithful")
    with pytest.raises((JudgeUnavailable, JudgeFailed)) as failure:
        assert_grounded(sample.answer, sample.context, judge=str(profile), decomposer="rules")
    assert url in str(failure.value)
    assert not isinstance(failure.value, AssertionError), "a judge failure is not a finding"


def test_a_session_serves_sync_and_async_callers_from_one_loop_and_closes_cleanly(tmp_path: Path) -> None:
    sample = example("refund-faithful")
    with fault_server(grounded) as server:
        profile = tmp_path / "fault.toml"
        profile.write_text(f'name = "fault"\nmodel = "openai/fault"\napi_base = "{server.base_url}"\n',
                           encoding="utf-8")
        session = AuditSession(SessionSettings(judge=str(profile), cache=str(tmp_path / "cache")))

        async def from_another_loop() -> AuditRecord:
            return await session.aaudit(sample, {"decomposer": "rules"})

        first = session.audit(sample, {"decomposer": "rules"})
        second = asyncio.run(from_another_loop())  # a second loop: the judge's clients stay on theirs
        session.close()
        calls = len(server.requests)
    assert first.label is not None and second.label == first.label
    assert first.usage.calls == calls > 0 and second.usage.cache_hits == calls and second.usage.calls == 0
    assert [record.report for record in session.records] == [first, second]
    assert not [thread for thread in threading.enumerate() if thread.name == "rt4chart-judge"]


def test_a_sessions_audit_is_metered_once_in_the_sessions_ledger(tmp_path: Path) -> None:
    with fault_server(grounded) as server:
        profile = tmp_path / "fault.toml"
        profile.write_text(f'name = "fault"\nmodel = "openai/fault"\napi_base = "{server.base_url}"\n'
                           'input_usd_per_mtok = 1.0\noutput_usd_per_mtok = 2.0\n', encoding="utf-8")
        session = AuditSession(SessionSettings(judge=str(profile), budget_usd=5.0))
        report = session.audit(example("refund-faithful"), {"decomposer": "rules"})
        stack = session.judge()
        run_stack = judge_stack(stack)  # what the run layer builds around the session's judge
        session.close()
        calls = len(server.requests)
    assert calls > 0 and report.usage.calls == calls
    assert stack.ledger.usage.calls == calls and stack.ledger.spent_usd == pytest.approx(report.usage.cost_usd)
    assert run_stack.ledger is stack.ledger  # one ledger: no second meter around the session's
    meters, layer = 0, run_stack.inner
    while isinstance(layer, BackendWrapper):
        meters += isinstance(layer, MeteredBackend)
        layer = layer.inner
    assert meters == 1


def test_a_budget_stop_ends_the_sessions_audits_without_another_call(tmp_path: Path) -> None:
    rules = json.loads((EXAMPLES / "answers.rules.json").read_text(encoding="utf-8"))
    paid = tmp_path / "paid.rules.json"
    paid.write_text(json.dumps({**rules, "cost_per_call": 0.01}), encoding="utf-8")
    session = AuditSession(SessionSettings(judge=f"scripted:{paid}", budget_usd=0.025))
    sample = example("refund-faithful")
    with pytest.raises(SessionBudgetStop):  # a BudgetExhausted the plugin tells from a test's own
        for _ in range(10):
            session.audit(sample, {})
    audited = len(session.records)
    with pytest.raises(BudgetExhausted, match="the session's budget stopped its audits"):
        session.audit(sample, {})
    session.close()
    assert len(session.records) == audited and session.skipped == 1
    assert sum(record.report.usage.cost_usd for record in session.records) <= 0.025


def test_ledgers_sharing_one_file_share_one_cap(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    first, second = SharedLedger(path, 0.05), SharedLedger(path, 0.05)
    assert first.reserve(0.03)
    assert not second.reserve(0.03), "the other ledger's reservation counts against the cap"
    first.settle(0.03, Usage(calls=1, cost_usd=0.02))
    assert second.reserve(0.03)
    second.settle(0.03, Usage(calls=1, cost_usd=0.03))
    assert first.shared_spent_usd() == pytest.approx(0.05) and not first.reserve(0.001)


def test_a_session_with_an_unknown_judge_says_so_and_leaves_no_thread_behind() -> None:
    session = AuditSession(SessionSettings(judge="no-such-judge"))
    sample = example("refund-faithful")
    for _ in range(2):
        with pytest.raises(JudgeConfigError, match="no-such-judge"):
            session.audit(sample, {})
    session.close()
    assert not [thread for thread in threading.enumerate() if thread.name == "rt4chart-judge"]
