"""``rt4 calibrate``: operating points for a target, held-out folds that never see their own labels,
and a written profile that changes the verdicts of the embedded judge, of a judge's stated confidence
and of a vote's member share exactly as the calibration predicts."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rt4chart.analysis.calibration import (
    CalibrationError,
    LabelledClaim,
    _columns,
    choose_threshold,
    cross_validate,
    fold_of_groups,
    parse_target,
)
from rt4chart.analysis.review import ClaimReview, ReviewLabel, run_key, write_reviews
from rt4chart.cli.app import app
from rt4chart.judges.registry import JudgeConfigError, JudgeProfile, resolve_judge
from rt4chart.method.joins import and_join, answer_hallucinated
from rt4chart.method.settlement import claim_unsupported_score
from rt4chart.records.io import read_predictions
from rt4chart.types import AuditRecord, JudgeScore, Label

EXIT_USAGE = 2

# A hand-made labelled set: each answer's unsupported sentences are listed (the labels a team would give).
ANSWERS: list[dict[str, Any]] = [
    {"id": "bridge", "question": "When did the bridge open and how long is it?",
     "context": "The Harbour Bridge opened to traffic in 1932. It is 1,149 metres long and carries eight lanes. "
                "Tolls are charged only for southbound traffic.",
     "answer": "The Harbour Bridge opened in 1932. It is 1,149 metres long. It was designed by a Norwegian "
               "architect. Tolls are charged in both directions.",
     "unsupported": ["It was designed by a Norwegian architect.", "Tolls are charged in both directions."]},
    {"id": "library", "question": "What are the library's opening hours?",
     "context": "The city library is open from 9 am to 8 pm on weekdays. On Saturdays it closes at 5 pm. It is "
                "closed on Sundays and public holidays.",
     "answer": "The library opens at 9 am on weekdays and closes at 8 pm. On Saturdays it closes at 5 pm. It has "
               "a rooftop cafe with free coffee.",
     "unsupported": ["It has a rooftop cafe with free coffee."]},
    {"id": "vaccine", "question": "How should the vaccine be stored?",
     "context": "The vaccine must be stored between 2 and 8 degrees Celsius. It must not be frozen. Once opened, "
                "a vial should be used within six hours.",
     "answer": "Store the vaccine between 2 and 8 degrees Celsius. Freezing it extends its shelf life. An opened "
               "vial should be used within six hours. The vaccine was developed in Sweden.",
     "unsupported": ["Freezing it extends its shelf life.", "The vaccine was developed in Sweden."]},
    {"id": "train", "question": "How often do trains run to the airport?",
     "context": "Airport trains leave the central station every 15 minutes between 5 am and midnight. The journey "
                "takes 22 minutes. Tickets cost 12 euros.",
     "answer": "Trains to the airport leave every 15 minutes. The trip takes about 22 minutes. Tickets cost 12 "
               "euros and children travel free. The line was built by a private company.",
     "unsupported": ["Tickets cost 12 euros and children travel free.", "The line was built by a private company."]},
    {"id": "river", "question": "Where does the river flow?",
     "context": "The Elm River rises in the northern hills and flows south for 240 kilometres. It empties into "
                "the Grey Sea near the town of Marlow.",
     "answer": "The Elm River rises in the northern hills. It flows south for 240 kilometres into the Grey Sea. "
               "Salmon spawn in its upper reaches every autumn.",
     "unsupported": ["Salmon spawn in its upper reaches every autumn."]},
    {"id": "battery", "question": "How long does the battery last?",
     "context": "The X200 laptop has a 56 Wh battery that lasts up to 10 hours of video playback. Charging to 80 "
                "percent takes one hour.",
     "answer": "The X200 battery lasts up to 10 hours of video playback. It charges to 80 percent in one hour. "
               "The battery can be replaced by the user in minutes.",
     "unsupported": ["The battery can be replaced by the user in minutes."]},
]


def claim(group: str, unsupported: bool, score: float, fixed: bool | None = None) -> LabelledClaim:
    return LabelledClaim(group, unsupported, score, fixed, flagged=score >= 0.5)


def test_targets_parse_and_bad_ones_are_refused() -> None:
    assert parse_target("best-f1").kind == "best-f1"
    assert parse_target("precision>=0.8").bound == 0.8
    assert parse_target("recall >= 0.7").kind == "recall"
    for bad in ("precision>0.8", "precision>=1.5", "accuracy>=0.9", "recall>=", "recall>=0"):
        with pytest.raises(CalibrationError, match="--target"):
            parse_target(bad)


def test_each_target_picks_its_point() -> None:
    # Scores 0.9 .. 0.1; unsupported: 0.9, 0.8, 0.6, 0.3.
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    gold = [True, True, False, True, False, False, True, False, False]
    columns = _columns([claim(f"a{i}", g, s) for i, (g, s) in enumerate(zip(gold, scores, strict=True))])
    rows = np.arange(len(scores))
    best, reached = choose_threshold(columns, rows, parse_target("best-f1"))
    assert 0.5 < best < 0.6 and reached  # flags 0.9, 0.8, 0.7, 0.6: P 0.75, R 0.75 (F1 0.75, the best)
    exact, _ = choose_threshold(columns, rows, parse_target("precision>=1.0"))
    assert 0.7 < exact < 0.8  # only 0.9 and 0.8 flagged: the most recall at precision 1
    everything, _ = choose_threshold(columns, rows, parse_target("recall>=1.0"))
    assert 0.2 < everything < 0.3  # down to 0.3: the most precision (4/7) at recall 1
    unreachable, reached = choose_threshold(
        _columns([claim("a", False, 0.9), claim("b", True, 0.2)]), np.arange(2), parse_target("precision>=0.9")
    )
    assert not reached and unreachable < 0.2  # the nearest point: the best precision (1/2)


def test_a_guard_decided_claim_is_flagged_at_any_threshold() -> None:
    columns = _columns([claim("a", True, 0.9), claim("b", False, 0.05, fixed=True), claim("c", False, 0.1)])
    threshold, reached = choose_threshold(columns, np.arange(3), parse_target("precision>=1.0"))
    assert not reached  # the guard's false positive can never be unflagged
    assert threshold > 0.1


def test_folds_never_choose_on_their_own_labels() -> None:
    rng = np.random.default_rng(3)
    claims = [claim(f"answer-{i // 3}", bool(rng.random() < 0.4), float(rng.random())) for i in range(120)]
    target = parse_target("best-f1")
    fold_of = fold_of_groups(40, 4, seed=0)
    columns = _columns(claims)
    _, points = cross_validate(columns, np.arange(len(claims)), fold_of, target, 4)
    held = {p.fold: p.threshold for p in points}
    # Flip every label of fold 0: its own threshold (chosen on folds 1-3) must not move; the others
    # (chosen with fold 0's labels) do.
    flipped = [
        LabelledClaim(c.group, not c.unsupported if fold_of[columns.group[i]] == 0 else c.unsupported, c.score,
                      c.fixed, c.flagged)
        for i, c in enumerate(claims)
    ]
    _, again = cross_validate(_columns(flipped), np.arange(len(claims)), fold_of, target, 4)
    moved = {p.fold: p.threshold for p in again}
    assert moved[0] == held[0]
    assert any(moved[f] != held[f] for f in (1, 2, 3))
    assert sorted(p.claims for p in points) == sorted(int((fold_of[columns.group] == f).sum()) for f in range(4))


def test_a_threshold_profile_is_for_the_embedded_judge_only() -> None:
    with pytest.raises(ValueError, match="embedded judge only"):
        JudgeProfile(name="x", model="gpt-4o-mini", claim_thresholds={"question": 0.3})
    with pytest.raises(ValueError):
        JudgeProfile(name="x", kind="embedded", claim_thresholds={"question": 1.5})


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The hand-made set audited by the shipped embedded judge: (input, gold, records)."""
    folder = tmp_path_factory.mktemp("calibrate")
    inputs, gold = folder / "answers.jsonl", folder / "gold.jsonl"
    lines, gold_lines = [], []
    for item in ANSWERS:
        sample = {key: item[key] for key in ("id", "question", "context", "answer")}
        starts = [item["answer"].index(sentence) for sentence in item["unsupported"]]
        spans = [{"start": start, "end": start + len(s)} for start, s in zip(starts, item["unsupported"], strict=True)]
        lines.append(json.dumps(sample))
        gold_lines.append(json.dumps(sample | {"gold": {"hallucinated": bool(spans), "spans": spans}}))
    inputs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    gold.write_text("\n".join(gold_lines) + "\n", encoding="utf-8")
    records = folder / "shipped.jsonl"
    arguments = ["verify", str(inputs), "--judge", "embedded", "--no-cache", "--out", str(records)]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code in (0, 1), result.output
    return inputs, gold, records


def test_the_written_profile_changes_verdicts_as_predicted(audited: tuple[Path, Path, Path], tmp_path: Path) -> None:
    inputs, gold, records = audited
    profile = tmp_path / "calibrated.toml"
    result = CliRunner().invoke(app, ["calibrate", str(records), "--gold", str(gold), "--target", "best-f1",
                                      "--folds", "2", "--resamples", "50", "--out", str(profile), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    threshold = report["threshold"]
    assert report["labelled"] == sum(len(r.claims) for r in read_predictions(records))
    assert tomllib.loads(profile.read_text(encoding="utf-8"))["claim_thresholds"] == {"question": threshold}
    for name in ("precision", "recall"):
        estimate = report["held_out"][name]
        assert estimate["low"] <= estimate["value"] <= estimate["high"]
    assert resolve_judge(str(profile)).name.endswith(f"+question={threshold:g}")

    calibrated = tmp_path / "calibrated.jsonl"
    run = CliRunner().invoke(app, ["verify", str(inputs), "--judge", str(profile), "--no-cache", "--out",
                                   str(calibrated)])
    assert run.exit_code in (0, 1), run.output
    changed = 0
    for before, after in zip(read_predictions(records), read_predictions(calibrated), strict=True):
        for old, new in zip(before.claims, after.claims, strict=True):
            assert old.score is not None and new.score is not None
            assert new.score.threshold == threshold
            by_head = old.score.decided_by == "head"
            predicted = old.score.p_unsupported >= threshold if by_head else old.label != Label.ENTAILED
            assert (new.label != Label.ENTAILED) == predicted, new.text
            changed += (old.label != Label.ENTAILED) != predicted
    assert changed == report["changed"] > 0  # the threshold moved verdicts, and the count said how many


def reviews_of(
    records: list[AuditRecord], label_of: dict[str, ReviewLabel], plan: float | None = None
) -> list[ClaimReview]:
    key = run_key(records)
    return [
        ClaimReview(run=key, record_id=r.id or "", claim_index=i, claim=c.text,
                    judge_label=c.label.value if c.label else None, label=label_of.get(c.text, "entailed"),
                    inclusion_probability=plan)
        for r in records for i, c in enumerate(r.claims)
    ]


def test_reviews_are_labels_too(audited: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, _, records = audited
    read = read_predictions(records)
    unsupported = {s for item in ANSWERS for s in item["unsupported"]}
    labels: dict[str, ReviewLabel] = {c.text: "baseless" for r in read for c in r.claims if c.text in unsupported}
    labels[read[0].claims[0].text] = "unsure"
    reviews = tmp_path / "reviews.jsonl"
    write_reviews(reviews, reviews_of(read, labels, plan=0.5))
    result = CliRunner().invoke(app, ["calibrate", str(records), "--reviews", str(reviews), "--folds", "2",
                                      "--resamples", "20", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["unsure"] == 1 and report["weighted"] is True
    assert report["labelled"] == sum(len(r.claims) for r in read) - 1

    other = tmp_path / "other.jsonl"
    write_reviews(other, [review.model_copy(update={"run": "0" * 16}) for review in reviews_of(read, labels)])
    refused = CliRunner().invoke(app, ["calibrate", str(records), "--reviews", str(other)])
    assert refused.exit_code == EXIT_USAGE
    assert "another audit" in refused.output


def test_bad_input_is_a_usage_error(audited: tuple[Path, Path, Path]) -> None:
    inputs, gold, records = audited
    for arguments, message in (
        (["--gold", str(gold), "--target", "precision>0.9"], "--target"),
        (["--gold", str(gold), "--folds", "7"], "cannot fill 7 folds"),
        (["--gold", str(gold), "--reviews", str(gold)], "not both"),
        (["--reviews", str(gold)], "not an rt4chart.review/1 review"),
    ):
        result = CliRunner().invoke(app, ["calibrate", str(records), *arguments])
        assert result.exit_code == EXIT_USAGE, result.output
        assert message in result.output
    not_records = CliRunner().invoke(app, ["calibrate", str(inputs)])
    assert not_records.exit_code == EXIT_USAGE


def test_a_profile_cannot_carry_thresholds_for_another_judge(tmp_path: Path) -> None:
    path = tmp_path / "llm.toml"
    path.write_text('name = "llm"\nmodel = "gpt-4o-mini"\n\n[claim_thresholds]\nquestion = 0.3\n', encoding="utf-8")
    with pytest.raises(JudgeConfigError, match="embedded judge only"):
        resolve_judge(str(path))


def test_refit_is_cross_validated_against_the_shipped_head(audited: tuple[Path, Path, Path]) -> None:
    pytest.importorskip("sklearn", reason="--refit fits with scikit-learn (the signals or dev extra)")
    inputs, gold, records = audited
    result = CliRunner().invoke(app, ["calibrate", str(records), "--gold", str(gold), "--refit", str(inputs),
                                      "--folds", "3", "--resamples", "20", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    refit = report["refit"]
    assert refit["measured"] == report["labelled"]
    assert refit["reproduced"] == refit["measured"]  # the same features the audit's verdicts came from
    assert len(refit["c"]) == 3
    beats = (refit["refit_auroc"] > refit["shipped_auroc"]) and (
        refit["held_out"]["f1"]["value"] > report["held_out"]["f1"]["value"]
    )
    assert refit["beat"] is beats
    too_few = CliRunner().invoke(app, ["calibrate", str(records), "--gold", str(gold), "--refit", str(inputs),
                                       "--folds", "2"])
    assert too_few.exit_code == EXIT_USAGE and "--folds 3" in too_few.output


# Answers for judges that state a confidence: two supported and two unsupported sentences each, every
# supported one quoted verbatim in the context (a scripted judge's entailed evidence must be found there).
FACTS = ["The museum opens at 9 am.", "Entry costs 12 euros.", "It has three floors."]


def stated_answers(folder: Path) -> Path:
    """Six answers with gold spans on their unsupported sentences (founded..., gardens...)."""
    lines = []
    for number in range(6):
        unsupported = [f"It was founded in 18{number}0.", f"It has {number + 4} gardens."]
        answer = " ".join(FACTS[:2] + unsupported)
        spans = [{"start": answer.index(s), "end": answer.index(s) + len(s)} for s in unsupported]
        sample = {"id": f"museum-{number}", "question": "What should visitors know?",
                  "context": " ".join(FACTS) + f" Exhibit {number} is new.", "answer": answer}
        lines.append(json.dumps(sample | {"gold": {"hallucinated": True, "spans": spans}}))
    path = folder / "answers.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_rules(path: Path, verdicts: dict[str, tuple[str, float]]) -> Path:
    """A scripted judge's rules: per claim word, its label and stated confidence (entailed ones quote their fact)."""
    evidence = {"opens": FACTS[0], "Entry": FACTS[1], "gardens": FACTS[2], "founded": FACTS[2]}
    rules = [{"claim": word, "label": label, "confidence": confidence,
              "evidence": [evidence[word]] if label != "baseless" else []}
             for word, (label, confidence) in verdicts.items()]
    path.write_text(json.dumps({"verify": rules}), encoding="utf-8")
    return path


def calibrate_and_reverify(
    inputs: Path, judge: str, folder: Path, *calibrate_options: str
) -> tuple[dict[str, Any], list[AuditRecord], list[AuditRecord], Path]:
    """Audit with ``judge``, calibrate on the gold inside the records writing a profile, audit again
    with the profile: (the calibration, the first records, the calibrated records, the profile)."""
    records, calibrated, profile = folder / "records.jsonl", folder / "calibrated.jsonl", folder / "calibrated.toml"
    first = CliRunner().invoke(app, ["verify", str(inputs), "--judge", judge, "--no-cache", "--out", str(records)])
    assert first.exit_code == 1, first.output
    result = CliRunner().invoke(app, ["calibrate", str(records), "--folds", "3", "--resamples", "20",
                                      "--out", str(profile), "--json", *calibrate_options])
    assert result.exit_code == 0, result.output
    again = CliRunner().invoke(app, ["verify", str(inputs), "--judge", str(profile), "--no-cache", "--out",
                                     str(calibrated)])
    assert again.exit_code in (0, 1), again.output
    return json.loads(result.output), read_predictions(records), read_predictions(calibrated), profile


def assert_flags_as_calibrated(
    report: dict[str, Any], before: list[AuditRecord], after: list[AuditRecord]
) -> int:
    """Every claim verdict of ``after`` is not entailed exactly where the calibration flags the claim of
    ``before`` (score >= threshold); the claims it flips keep the judge's verdict; answers follow the
    AND-join. Returns the claims flipped."""
    threshold, flipped = report["threshold"], 0
    for old_record, new_record in zip(before, after, strict=True):
        assert new_record.judge == f"{old_record.judge}+unsupported>={threshold:g}"
        for old, new in zip(old_record.claims, new_record.claims, strict=True):
            score = claim_unsupported_score(old)
            assert score is not None and claim_unsupported_score(new) == pytest.approx(score, abs=1e-6)
            assert (new.label != Label.ENTAILED) == (score >= threshold), new.text
            if new.label == old.label:
                assert new.judge_verdict is None and new.evidence == old.evidence
                continue
            flipped += 1
            assert new.judge_verdict is not None and new.judge_verdict.label == old.label
            assert new.judge_verdict.confidence == old.confidence and new.judge_verdict.evidence == old.evidence
            assert new.label == (Label.BASELESS if old.label == Label.ENTAILED else Label.ENTAILED)
            assert new.evidence == [] and "calibrated threshold" in new.rationale
        assert new_record.label == and_join(c.label for c in new_record.claims)
        assert new_record.hallucinated == answer_hallucinated(c.label for c in new_record.claims)
    assert flipped == report["changed"] > 0
    return flipped


UNSURE_BOTH_WAYS = {"founded": ("baseless", 0.9), "gardens": ("entailed", 0.2), "opens": ("entailed", 0.9),
                    "Entry": ("baseless", 0.3)}
"""Unsupported sentences: baseless and sure (score 0.9), or entailed and unsure (score 0.8); supported
ones: entailed and sure (0.1), or baseless and unsure (0.3)."""


def test_a_judges_stated_confidence_is_written_and_applied(tmp_path: Path) -> None:
    # The point falls between 0.3 and 0.8, so it flips both unsure verdicts, each way.
    rules = write_rules(tmp_path / "rules.json", UNSURE_BOTH_WAYS)
    report, before, after, profile = calibrate_and_reverify(
        stated_answers(tmp_path), f"scripted:{rules}", tmp_path, "--judge", f"scripted:{rules}"
    )
    assert report["score"] == "confidence" and 0.3 < report["threshold"] < 0.8
    assert report["held_out"]["f1"]["value"] == 1.0 > report["current"]["f1"]["value"]
    read_back = JudgeProfile.model_validate(tomllib.loads(profile.read_text(encoding="utf-8")))
    assert (read_back.kind, read_back.judge, read_back.claim_threshold) == ("calibrated", f"scripted:{rules}",
                                                                            report["threshold"])
    flipped = assert_flags_as_calibrated(report, before, after)
    assert {c.judge_verdict.label for r in after for c in r.claims if c.judge_verdict} == {Label.ENTAILED,
                                                                                          Label.BASELESS}
    assert flipped == 12  # the unsure verdicts: two of the four claims of each of the six answers

    refused = CliRunner().invoke(app, ["calibrate", str(tmp_path / "calibrated.jsonl"), "--out",
                                       str(tmp_path / "again.toml")])
    assert refused.exit_code == EXIT_USAGE and "written by a calibrated profile" in refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "again.toml").exists()


def test_a_votes_member_share_is_written_and_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Three members; the vote's recorded confidence is the winning label's share. founded: two of three say
    # baseless (score 2/3); gardens: one of three (score 1/3, entailed by the majority); opens and Entry:
    # all entailed (score 0). Best F1 flags every claim a member doubted: the point is below 1/3.
    monkeypatch.chdir(tmp_path)  # the vote's name keeps only the rules files' names: read from here
    members = [
        write_rules(tmp_path / "a.json", {"founded": ("baseless", 1.0), "gardens": ("baseless", 1.0),
                                          "opens": ("entailed", 1.0), "Entry": ("entailed", 1.0)}),
        write_rules(tmp_path / "b.json", {"founded": ("baseless", 1.0), "gardens": ("entailed", 1.0),
                                          "opens": ("entailed", 1.0), "Entry": ("entailed", 1.0)}),
        write_rules(tmp_path / "c.json", {"founded": ("entailed", 1.0), "gardens": ("entailed", 1.0),
                                          "opens": ("entailed", 1.0), "Entry": ("entailed", 1.0)}),
    ]
    vote = "vote:" + ",".join(f"scripted:{member.name}" for member in members)
    report, before, after, profile = calibrate_and_reverify(stated_answers(tmp_path), vote, tmp_path)
    shares = {round(c.confidence or 0.0, 4) for r in before for c in r.claims}
    assert shares == {0.6667, 1.0}  # what a vote records: its winning label's share of members
    assert 0.0 < report["threshold"] < 1 / 3
    read_back = JudgeProfile.model_validate(tomllib.loads(profile.read_text(encoding="utf-8")))
    assert read_back.judge == vote and read_back.claim_threshold == report["threshold"]
    assert resolve_judge(str(profile)).name == f"{before[0].judge}+unsupported>={report['threshold']:g}"
    assert assert_flags_as_calibrated(report, before, after) == 6  # every "gardens" claim becomes baseless
    assert all(r.label == Label.BASELESS for r in after)

    # Records of a vote from before it recorded its share alone: a member's score sits on a claim.
    score = JudgeScore(p_unsupported=0.9, threshold=0.5, decided_by="head")
    older = [r.model_copy(update={"claims": [r.claims[0].model_copy(update={"score": score}), *r.claims[1:]]})
             for r in before]
    old_records = tmp_path / "older.jsonl"
    old_records.write_text("".join(r.model_dump_json() + "\n" for r in older), encoding="utf-8")
    refused = CliRunner().invoke(app, ["calibrate", str(old_records), "--folds", "3"])
    assert refused.exit_code == EXIT_USAGE and "audit again" in refused.output and "Traceback" not in refused.output


def test_a_profile_is_refused_for_a_cascade_or_a_judge_it_cannot_name(tmp_path: Path) -> None:
    rules = write_rules(tmp_path / "rules.json", UNSURE_BOTH_WAYS)
    inputs = stated_answers(tmp_path)
    for name, judge in (("cascade", f"cascade:scripted:{rules}@0.5,scripted:{rules}"), ("one", f"scripted:{rules}")):
        records = tmp_path / f"{name}.jsonl"
        verified = CliRunner().invoke(app, ["verify", str(inputs), "--judge", judge, "--no-cache", "--out",
                                            str(records)])
        assert verified.exit_code == 1, verified.output
        refused = CliRunner().invoke(app, ["calibrate", str(records), "--folds", "3", "--out",
                                           str(tmp_path / f"{name}.toml")])
        assert refused.exit_code == EXIT_USAGE, refused.output
        assert "Traceback" not in refused.output and not (tmp_path / f"{name}.toml").exists()
        # A cascade: its records hold only the settling stage. One judge whose rules file is not in the
        # working directory: the profile must name the --judge value the records were written with.
        why = "only the verdict of the stage" if name == "cascade" else "rt4 calibrate --judge SPEC"
        assert why in refused.output
    cascade = tmp_path / "cascade.toml"
    cascade.write_text(f'name = "c"\nkind = "calibrated"\njudge = "cascade:scripted:{rules}@0.5,scripted:{rules}"\n'
                       "claim_threshold = 0.5\n", encoding="utf-8")
    run = CliRunner().invoke(app, ["verify", str(inputs), "--judge", str(cascade), "--no-cache"])
    assert run.exit_code == EXIT_USAGE and "cannot settle judge" in run.output and "Traceback" not in run.output


def test_a_point_worse_than_the_judge_on_every_figure_is_said_and_not_recommended(tmp_path: Path) -> None:
    # The judge's own verdicts are right on every claim, but its stated confidences rank them badly:
    # unsupported claims score 0.9, 0.9 and 0.05, supported ones 0.95, 0.5, 0.5 and 0.5. The best F1
    # point (0.9) then flags one supported claim and misses one unsupported: held out, precision,
    # recall and F1 all fall below the judge's own 1.0.
    supported = ["The museum opens at 9 am.", "Entry costs 12 euros.", "It has three floors.", "Guides speak French."]
    unsupported = ["It was founded in 1850.", "It has seven gardens.", "The cafe sells pizza."]
    verdicts = {"opens": ("entailed", 0.05), "Entry": ("entailed", 0.5), "floors": ("entailed", 0.5),
                "Guides": ("entailed", 0.5), "founded": ("baseless", 0.9), "gardens": ("baseless", 0.9),
                "cafe": ("baseless", 0.05)}
    lines = []
    for number in range(6):
        answer = " ".join(supported + unsupported)
        spans = [{"start": answer.index(s), "end": answer.index(s) + len(s)} for s in unsupported]
        sample = {"id": f"museum-{number}", "question": "What should visitors know?",
                  "context": " ".join(supported) + f" Exhibit {number} is new.", "answer": answer,
                  "gold": {"hallucinated": True, "spans": spans}}
        lines.append(json.dumps(sample))
    inputs = tmp_path / "answers.jsonl"
    inputs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    evidence = dict(zip(["opens", "Entry", "floors", "Guides"], supported, strict=True))
    rules = [{"claim": word, "label": label, "confidence": confidence,
              "evidence": [evidence[word]] if label == "entailed" else []}
             for word, (label, confidence) in verdicts.items()]
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps({"verify": rules}), encoding="utf-8")
    records, profile = tmp_path / "records.jsonl", tmp_path / "calibrated.toml"
    audit = CliRunner().invoke(app, ["verify", str(inputs), "--judge", f"scripted:{rules_file}", "--no-cache",
                                     "--out", str(records)])
    assert audit.exit_code == 1, audit.output
    arguments = ["calibrate", str(records), "--folds", "3", "--resamples", "20", "--judge", f"scripted:{rules_file}"]
    report = json.loads(CliRunner().invoke(app, [*arguments, "--json"]).output)
    assert all(report["held_out"][name]["value"] < report["current"][name]["value"]
               for name in ("precision", "recall", "f1")), report
    assert report["below_judge"] and any("no improvement" in warning for warning in report["warnings"])
    shown = CliRunner().invoke(app, [*arguments, "--out", str(profile)])
    assert shown.exit_code == 0, shown.output
    assert "no improvement" in shown.output and "not recommended" in shown.output
    assert f"use it with --judge {profile}" not in shown.output
