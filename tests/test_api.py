"""The Python API: ``rt4chart.verify`` and ``rt4chart.averify`` over one sample or many."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fixtures.spine.judges import RUNNING_EXAMPLE_RULES, running_example_judge, running_example_sample
from pydantic import ValidationError

import rt4chart
from rt4chart import AuditRecord, Label, Sample

EXAMPLE_OPTIONS: dict[str, Any] = {"window": 2, "overlap": 1}
JUDGE = f"scripted:{RUNNING_EXAMPLE_RULES}"


def _as_dict(sample: Sample) -> dict[str, Any]:
    return sample.model_dump(exclude_none=True)


def _labels(report: AuditRecord) -> tuple[Label | None, list[Label | None]]:
    return report.label, [claim.label for claim in report.claims]


CON, ENT, BAS = Label.CONTRADICTED, Label.ENTAILED, Label.BASELESS
EXPECTED = (CON, [CON, CON, ENT, ENT, BAS])


@pytest.mark.parametrize("as_input", [lambda s: s, _as_dict], ids=["Sample", "dict"])
def test_verify_one_sample_returns_one_report(as_input: Any) -> None:
    report = rt4chart.verify(as_input(running_example_sample()), judge=JUDGE, **EXAMPLE_OPTIONS)
    assert isinstance(report, AuditRecord)
    assert (report.id, report.line) == ("free-trial", 1)
    assert _labels(report) == EXPECTED


def test_verify_a_list_returns_reports_in_order_with_bad_items_as_errors() -> None:
    sample = running_example_sample()
    batch: list[Sample | dict[str, Any]] = [
        sample,
        {"id": "broken", "context": "c"},
        {**_as_dict(sample), "id": "again"},
    ]
    reports = rt4chart.verify(batch, judge=JUDGE, **EXAMPLE_OPTIONS)
    assert isinstance(reports, list)
    assert [(r.id, r.line) for r in reports] == [("free-trial", 1), ("broken", 2), ("again", 3)]
    assert _labels(reports[0]) == _labels(reports[2]) == EXPECTED
    assert reports[1].label is None and reports[1].errors and "answer" in reports[1].errors[0]


def test_verify_an_empty_list_returns_an_empty_list() -> None:
    assert rt4chart.verify([], judge=JUDGE) == []


def test_averify_matches_verify_and_accepts_a_backend_it_does_not_close() -> None:
    backend = running_example_judge()
    sample = running_example_sample()
    single = asyncio.run(rt4chart.averify(sample, judge=backend, **EXAMPLE_OPTIONS))
    many = asyncio.run(rt4chart.averify([sample, sample], judge=backend, **EXAMPLE_OPTIONS))
    assert isinstance(single, AuditRecord) and isinstance(many, list)
    assert [_labels(r) for r in [single, *many]] == [EXPECTED] * 3
    assert single.usage.calls + sum(r.usage.calls for r in many) == len(backend.requests)
    assert single.judge == backend.name


def test_options_reach_the_pipeline() -> None:
    report = rt4chart.verify(running_example_sample(), judge=JUDGE, global_verification=False, **EXAMPLE_OPTIONS)
    assert report.chunks == 3
    assert report.claims[3].label == Label.BASELESS
    decided = [claim for claim in report.claims if claim.local_label != Label.BASELESS]
    assert decided and all(claim.judge == report.judge for claim in decided), "local votes name their judge"


def test_an_answer_without_any_sentence_is_an_error_not_entailed() -> None:
    backend = running_example_judge()
    report = rt4chart.verify({"id": "x", "context": "A fact.", "answer": "- \n* "}, judge=backend)
    assert report.label is None and report.hallucinated is None
    assert report.errors == ["line 1: answer has no sentence to verify"]
    assert backend.requests == []


@pytest.mark.parametrize(
    "options",
    [{"window": 2, "overlap": 2}, {"windw": 2}, {"batch_claims": 0}],
    ids=["overlap-not-below-window", "misspelt-option", "no-claims-per-call"],
)
def test_bad_options_raise_before_any_judge_call(options: dict[str, Any]) -> None:
    backend = running_example_judge()
    with pytest.raises(ValidationError):
        rt4chart.verify(running_example_sample(), judge=backend, **options)
    assert backend.requests == []


def test_an_unusable_judge_raises_a_config_error() -> None:
    with pytest.raises(rt4chart.JudgeConfigError, match=r"missing\.json"):
        rt4chart.verify(running_example_sample(), judge="scripted:missing.json")


def test_cache_dir_makes_a_second_run_call_no_judge(tmp_path: Any) -> None:
    sample = running_example_sample()
    first = rt4chart.verify(sample, judge=JUDGE, cache_dir=tmp_path / "cache", **EXAMPLE_OPTIONS)
    second = rt4chart.verify(sample, judge=JUDGE, cache_dir=tmp_path / "cache", **EXAMPLE_OPTIONS)
    assert first.usage.calls > 0 and first.usage.cache_hits == 0
    assert second.usage.calls == 0 and second.usage.cache_hits == first.usage.calls
    assert _labels(second) == _labels(first) == EXPECTED
    uncached = rt4chart.verify(sample, judge=JUDGE, **EXAMPLE_OPTIONS)
    assert uncached.usage.calls == first.usage.calls, "without cache_dir the API caches nothing"


def test_budget_stops_a_paid_judge_before_it_overspends(tmp_path: Any) -> None:
    paid = tmp_path / "paid.rules.json"
    rules = RUNNING_EXAMPLE_RULES.read_text(encoding="utf-8").rstrip().rstrip("}") + ', "cost_per_call": 0.01}'
    paid.write_text(rules, encoding="utf-8")
    with pytest.raises(rt4chart.BudgetExhausted):
        rt4chart.verify(running_example_sample(), judge=f"scripted:{paid}", budget=0.025, **EXAMPLE_OPTIONS)
    report = rt4chart.verify(running_example_sample(), judge=f"scripted:{paid}", budget=1.0, **EXAMPLE_OPTIONS)
    assert report.usage.cost_usd == pytest.approx(0.01 * report.usage.calls) and report.usage.cost_usd <= 1.0
