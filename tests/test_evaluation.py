"""The real CLI end to end: rt4 eval on fixture datasets with a scripted judge, rt4 score, rt4 convert."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.records.io import file_sha256
from rt4chart.runs.evaluation import EvalConfig, EvaluationResult, evaluate
from rt4chart.types import AuditRecord, Sample

FIXTURES = Path(__file__).parent / "fixtures" / "datasets"
ROOT = Path(__file__).resolve().parent.parent
RULES = FIXTURES / "fixtures.rules.json"
JUDGE = f"scripted:{RULES}"


def _run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def _text(outcome: Any) -> str:
    """The command's output with the console's line wrapping undone."""
    return str(outcome.output).replace("\n", "")


def _eval(tmp_path: Path, *extra: str, dataset: str = "ragtruth-qa", split: str = "dev") -> EvaluationResult:
    outcome = _run(
        "eval", dataset, "--path", str(FIXTURES / dataset), "--split", split, "--judge", JUDGE,
        "--results-dir", str(tmp_path), "--resamples", "200", "-q", *extra,
    )
    assert outcome.exit_code == 0, outcome.output
    written = sorted(tmp_path.glob("*.json"))
    assert len(written) == 1, written
    return EvaluationResult.model_validate_json(written[0].read_text(encoding="utf-8"))


def test_eval_scores_a_perfect_scripted_judge_and_records_provenance(tmp_path: Path) -> None:
    result = _eval(tmp_path, "--save-predictions")
    metrics = result.metrics
    assert (metrics.samples, metrics.scored, metrics.gold_positive, metrics.predicted_positive) == (3, 3, 2, 2)
    assert metrics.headline["answer_f1"].value == 1.0
    assert metrics.headline["balanced_accuracy"].value == 1.0
    # The scripted judge flags exactly the gold sentences, so character spans match exactly.
    assert metrics.headline["span_f1"].value == 1.0
    assert metrics.headline["mean_iou"].value == 1.0
    assert metrics.headline["auroc"].value == 1.0
    assert (metrics.claims.aligned, metrics.claims.unaligned, metrics.claims.gold_unsupported) == (6, 0, 2)
    assert metrics.claims.at_operating_point.f1 == 1.0 and metrics.claims.auroc == 1.0
    assert result.files[0].sha256 == file_sha256(FIXTURES / "ragtruth-qa" / "dev.jsonl")
    assert result.judge.startswith("scripted:") and result.prompt_version
    assert result.config.split == "dev" and result.config.variant == "rt4chart"
    stem = result.stem
    assert (tmp_path / f"{stem}.md").read_text(encoding="utf-8").count("| answer F1 | 1.000 |") == 1
    predictions = (tmp_path / f"{stem}.predictions.jsonl").read_text(encoding="utf-8").splitlines()
    assert [AuditRecord.model_validate_json(line).id for line in predictions] == ["qa-1", "qa-2", "qa-3"]


def test_eval_prints_the_metrics_table(tmp_path: Path) -> None:
    outcome = _run(
        "eval", "ragtruth-qa", "--path", str(FIXTURES / "ragtruth-qa"), "--split", "test", "--judge", JUDGE,
        "--results-dir", str(tmp_path), "--resamples", "50", "-q",
    )
    assert outcome.exit_code == 0, outcome.output
    for name in ("answer F1", "span F1 (chars)", "mean IoU", "balanced accuracy", "claim AUROC",
                 "contradiction F1", "baseless F1", "evidence samples"):
        assert name in outcome.output


def test_direct_baseline_and_ablation_variants(tmp_path: Path) -> None:
    direct = _eval(tmp_path / "direct", "--method", "direct")
    assert direct.config.variant == "direct"
    assert direct.metrics.headline["answer_f1"].value == 1.0
    # The direct baseline quotes whole sentences here, so its spans match the gold too.
    assert direct.metrics.headline["span_f1"].value == 1.0
    holistic = _eval(tmp_path / "holistic", "--decomposer", "holistic")
    assert holistic.config.variant == "rt4chart-holistic"
    assert holistic.metrics.headline["answer_f1"].value == 1.0
    # Holistic claims map to no answer span: span figures are n/a and no claim aligns.
    assert holistic.metrics.span is None and holistic.metrics.headline["span_f1"].value is None
    assert holistic.metrics.claims.aligned == 0
    assert holistic.metrics.claims.unaligned == 6
    local_only = _eval(tmp_path / "grid", "--no-global", "--window", "10", "--overlap", "3", "--limit", "2")
    assert local_only.config.variant == "rt4chart-no-global-W10-O3"
    assert local_only.metrics.samples == 2
    assert local_only.stem.endswith(f"rt4chart-no-global-W10-O3_n2_{local_only.configuration_digest}")
    bounded = _eval(tmp_path / "bounded", "--max-tokens", "256", "--limit", "1")
    assert bounded.stem.endswith(f"rt4chart_max-tokens-256_n1_{bounded.configuration_digest}")
    assert "max_tokens=256" in (tmp_path / "bounded" / f"{bounded.stem}.md").read_text(encoding="utf-8")


def test_configurations_that_differ_only_in_unnamed_options_never_share_a_result_file(tmp_path: Path) -> None:
    runs = [("default",), ("--batch-claims", "1"), ("--global-auto",), ("--ungrounded", "keep"), ("--no-skip-decided",)]
    for number, extra in enumerate(runs):
        _eval(tmp_path / str(number), *(option for option in extra if option != "default"), "--limit", "1")
    stems = {next((tmp_path / str(number)).glob("*.json")).stem for number in range(len(runs))}
    assert len(stems) == len(runs)
    # The same configuration again: the same file.
    again = _eval(tmp_path / "again", "--limit", "1")
    assert again.stem in stems


def test_result_files_named_before_the_digest_still_load() -> None:
    committed = sorted((ROOT / "evals" / "results").glob("*_rt4chart.json"))
    assert committed
    for path in committed:
        result = EvaluationResult.model_validate_json(path.read_text(encoding="utf-8"))
        assert result.stem.endswith(f"_{result.configuration_digest}") and result.metrics.samples > 0


def test_faithbench_eval_scores_evidence_grounding(tmp_path: Path) -> None:
    result = _eval(tmp_path, dataset="faithbench", split="test")
    assert result.metrics.samples == 2
    evidence = result.metrics.evidence
    # Gold evidence "300 loaves" (10 chars) inside the cited 37-character sentence.
    assert evidence is not None and (evidence.tp, evidence.fp, evidence.fn) == (10, 27, 0)


def test_convert_verify_and_score_round_trip(tmp_path: Path) -> None:
    converted = tmp_path / "dev.jsonl"
    outcome = _run(
        "convert", "ragtruth-qa", "--path", str(FIXTURES / "ragtruth-qa"), "--split", "dev", "-o", str(converted)
    )
    assert outcome.exit_code == 0, outcome.output
    samples = [Sample.model_validate_json(line) for line in converted.read_text(encoding="utf-8").splitlines()]
    assert [s.id for s in samples] == ["qa-1", "qa-2", "qa-3"]
    assert samples[0].gold is not None and samples[0].gold.spans
    predictions = tmp_path / "predictions.jsonl"
    verified = _run("verify", str(converted), "--judge", JUDGE, "--out", str(predictions), "-q", "--no-cache")
    assert verified.exit_code == 1, verified.output  # some answers are hallucinated
    scores = tmp_path / "scores.json"
    with_gold = _run("score", str(predictions), "--gold", str(converted), "--resamples", "50", "-o", str(scores))
    assert with_gold.exit_code == 0, with_gold.output
    assert "answer F1" in with_gold.output
    scored = json.loads(scores.read_text(encoding="utf-8"))
    assert scored["metrics"]["headline"]["span_f1"]["value"] == 1.0
    assert scored["gold"]["sha256"] == file_sha256(converted)
    # The records carry their gold, so --gold may be left out.
    embedded = _run("score", str(predictions), "--resamples", "50")
    assert embedded.exit_code == 0, embedded.output


def test_score_against_gold_counts_missing_predictions(tmp_path: Path) -> None:
    converted = tmp_path / "dev.jsonl"
    _run("convert", "ragtruth-qa", "--path", str(FIXTURES / "ragtruth-qa"), "-o", str(converted))
    first_only = tmp_path / "first.jsonl"
    _run("convert", "ragtruth-qa", "--path", str(FIXTURES / "ragtruth-qa"), "--limit", "1", "-o", str(first_only))
    predictions = tmp_path / "predictions.jsonl"
    _run("verify", str(first_only), "--judge", JUDGE, "--out", str(predictions), "-q", "--no-cache")
    scores = tmp_path / "scores.json"
    outcome = _run("score", str(predictions), "--gold", str(converted), "--resamples", "0", "-o", str(scores))
    assert outcome.exit_code == 0, outcome.output
    metrics = json.loads(scores.read_text(encoding="utf-8"))["metrics"]
    assert (metrics["samples"], metrics["scored"], metrics["missing"]) == (3, 1, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "halueval", "--judge", JUDGE], "unknown dataset"),
        (["eval", "ragtruth-qa", "--path", str(FIXTURES / "ragtruth-qa"), "--split", "train", "--judge", JUDGE],
         "no split"),
        (["eval", "ragtruth-qa", "--path", str(FIXTURES / "ragtruth-qa"), "--method", "oracle"], "--method"),
        (["eval", "ragtruth-qa", "--path", str(FIXTURES / "ragtruth-qa"), "--judge", "scripted:/nonexistent.json"],
         "nonexistent"),
        (["convert", "faithbench", "--path", "/nonexistent/faithbench", "-o", "/tmp/never-written.jsonl"], "not found"),
        (["score", "/nonexistent/predictions.jsonl"], "not found"),
    ],
)
def test_bad_usage_exits_2_with_a_clear_message(args: list[str], message: str) -> None:
    outcome = _run(*args)
    assert outcome.exit_code == 2
    assert message in _text(outcome)


def test_score_rejects_a_line_that_is_not_an_output_record(tmp_path: Path) -> None:
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text('{"id": "a", "line": 1}\n{"nonsense": true, "line": "x"}\n', encoding="utf-8")
    outcome = _run("score", str(predictions), "--gold", str(FIXTURES / "generic.jsonl"))
    assert outcome.exit_code == 2 and ":2: not an rt4chart output record" in _text(outcome)
    no_gold = tmp_path / "no-gold.jsonl"
    no_gold.write_text('{"id": "a", "line": 1}\n', encoding="utf-8")
    outcome = _run("score", str(no_gold))
    assert outcome.exit_code == 2 and "--gold" in _text(outcome)


def test_library_evaluate_without_the_cli() -> None:
    config = EvalConfig(dataset="generic", path=str(FIXTURES / "generic.jsonl"), judge=JUDGE, resamples=20)
    result, reports = evaluate(config)
    assert [r.id for r in reports] == ["g-1", "g-2", "g-3"]
    assert result.metrics.samples == 3 and result.config.variant == "rt4chart"
    assert result.stem.startswith("generic_all_scripted")


def test_result_files_written_before_options_were_grouped_still_read() -> None:
    legacy = {"dataset": "ragtruth-qa", "split": "dev", "method": "rt4chart", "decomposer": "auto",
              "window": 10, "overlap": 3, "batch_claims": 8, "max_tokens": 256, "global_verification": False}
    config = EvalConfig.model_validate(legacy)
    assert (config.options.window, config.options.overlap, config.options.max_tokens) == (10, 3, 256)
    assert config.variant == "rt4chart-no-global-W10-O3"
    assert EvalConfig.model_validate_json(config.model_dump_json()) == config


@pytest.mark.parametrize("method", ["rt4chart", "direct"])
def test_typed_detection_and_evidence_grounding_on_faithbench(tmp_path: Path, method: str) -> None:
    result = _eval(tmp_path, "--method", method, "--save-predictions", dataset="faithbench", split="test")
    metrics = result.metrics
    # faithbench-1-2 (intrinsic "500" against "300 loaves") and faithbench-2-3 (extrinsic).
    assert metrics.typed == 2
    assert metrics.contradiction is not None and metrics.baseless is not None
    assert (metrics.contradiction.tp, metrics.contradiction.fp, metrics.contradiction.fn) == (1, 0, 0)
    assert (metrics.baseless.tp, metrics.baseless.fp, metrics.baseless.fn) == (1, 0, 0)
    # The judge quotes the whole sentence "The bakery sold 300 loaves on Friday." (37 characters);
    # the annotator cited "300 loaves" (10) inside it.
    assert metrics.evidence_samples == 1 and metrics.evidence is not None
    assert (metrics.evidence.tp, metrics.evidence.fp, metrics.evidence.fn) == (10, 27, 0)
    predictions = next(tmp_path.glob("*.predictions.jsonl")).read_text(encoding="utf-8").splitlines()
    reports = {r.id: r for r in map(AuditRecord.model_validate_json, predictions)}
    [contradicted] = [c for c in reports["faithbench-1-2"].claims if c.label == "contradicted"]
    assert [e.text for e in contradicted.evidence] == ["The bakery sold 300 loaves on Friday."]
    assert contradicted.grounded
