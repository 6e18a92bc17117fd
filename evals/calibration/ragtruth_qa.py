"""RAGTruth QA dev as "a team's own labels": `rt4 calibrate` for the embedded judge, then its profile on test.

    nice -n 10 python evals/calibration/ragtruth_qa.py            # about 5 minutes on 2 cores

1. `rt4 convert ragtruth-qa --split dev`, `rt4 verify` with the shipped embedded judge: the dev records;
2. `rt4 calibrate` on them with the dev gold claims (folds grouped by context) for ``--target``,
   writing the profile ``evals/calibration/ragtruth-qa-dev.toml`` and the calibration as JSON;
3. only then is the test split read: `rt4 convert ragtruth-qa --split test`, `rt4 verify --judge
   <the profile>`, and `rt4 score` of those records (claim precision / recall at the profile's point);
4. the test split audited by the shipped judge too, to check that the profile changed exactly the
   verdicts the calibration predicted (a claim the head decided is flagged when P(not entailed) >= the
   threshold; a guard's verdict stays);
5. `rt4 calibrate --refit` on dev: the embedded head refitted on the dev labels (the training code of
   evals/embedded/train.py), cross-validated against the shipped head (dev only);
6. RESULTS.md beside this script, from the measured files (nothing typed in by hand).

Records and converted data stay under evals/results/tmp/calibration/ (git-ignored: never data in the repository).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

from rt4chart.analysis.calibration import Calibration
from rt4chart.analysis.metrics import claim_gold_unsupported, format_estimate
from rt4chart.records.io import read_predictions
from rt4chart.runs.evaluation import ScoreResult
from rt4chart.types import Label

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORK = Path("evals/results/tmp/calibration")
"""Records and converted data, relative to the repository root (where every command runs)."""
PROFILE = Path("evals/calibration/ragtruth-qa-dev.toml")


def rt4(*arguments: str | Path, out: Path | None = None, ok: tuple[int, ...] = (0,)) -> str:
    """Run the real CLI; ``ok`` exit codes pass (``rt4 verify`` exits 1 when answers are hallucinated)."""
    command = ["rt4", *map(str, arguments)]
    print("$", shlex.join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode not in ok:
        sys.exit(f"{shlex.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    if out is not None:
        (ROOT / out).write_text(done.stdout, encoding="utf-8")
    return done.stdout


def verdicts_as_predicted(shipped: Path, calibrated: Path, threshold: float) -> tuple[int, int]:
    """(claims, claims whose calibrated verdict is not what the threshold predicts from the shipped run)."""
    claims = mismatched = 0
    for before, after in zip(read_predictions(shipped), read_predictions(calibrated), strict=True):
        assert before.id == after.id and len(before.claims) == len(after.claims)
        for old, new in zip(before.claims, after.claims, strict=True):
            assert old.score is not None
            by_head = old.score.decided_by == "head"
            predicted = old.score.p_unsupported >= threshold if by_head else old.label != Label.ENTAILED
            claims += 1
            mismatched += predicted != (new.label != Label.ENTAILED)
    return claims, mismatched


def guard_flags(records: Path) -> tuple[int, int]:
    """(claims a guard flagged, of them gold unsupported) in records that carry their gold."""
    flagged = unsupported = 0
    for record in read_predictions(records):
        assert record.gold is not None
        for verdict in record.claims:
            if verdict.score is not None and verdict.score.decided_by != "head":
                flagged += 1
                unsupported += bool(claim_gold_unsupported(verdict, record.gold))
    return flagged, unsupported


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="precision>=0.3", help="rt4 calibrate's --target")
    parser.add_argument("--resamples", default="1000")
    args = parser.parse_args()
    (ROOT / WORK).mkdir(parents=True, exist_ok=True)
    dev, dev_records = WORK / "dev.jsonl", WORK / "dev.audit.jsonl"
    rt4("convert", "ragtruth-qa", "--split", "dev", "--out", dev)
    rt4("verify", dev, "--out", dev_records, "--judge", "embedded", ok=(0, 1))
    calibration_json = WORK / "dev.calibration.json"
    calibrate = ["calibrate", dev_records, "--gold", dev, "--target", args.target, "--resamples", args.resamples]
    rt4(*calibrate, "--out", PROFILE, "--json", out=calibration_json)
    markdown = rt4(*calibrate)
    calibration = Calibration.model_validate_json((ROOT / calibration_json).read_text(encoding="utf-8"))
    # The profile is written: from here on the test split may be read.
    test, test_records, test_shipped = WORK / "test.jsonl", WORK / "test.calibrated.jsonl", WORK / "test.shipped.jsonl"
    rt4("convert", "ragtruth-qa", "--split", "test", "--out", test)
    rt4("verify", test, "--out", test_records, "--judge", PROFILE, ok=(0, 1))
    score_json = WORK / "test.score.json"
    rt4("score", test_records, "--out", score_json)
    score = ScoreResult.model_validate_json((ROOT / score_json).read_text(encoding="utf-8"))
    rt4("verify", test, "--out", test_shipped, "--judge", "embedded", ok=(0, 1))
    shipped_score_json = WORK / "test.shipped.score.json"
    rt4("score", test_shipped, "--out", shipped_score_json)
    shipped = ScoreResult.model_validate_json((ROOT / shipped_score_json).read_text(encoding="utf-8"))
    claims, mismatched = verdicts_as_predicted(ROOT / test_shipped, ROOT / test_records, calibration.threshold)
    guarded, guarded_right = guard_flags(ROOT / dev_records)
    refit_markdown = rt4(*calibrate, "--refit", dev)
    refit_section = refit_markdown[refit_markdown.index("Head refitted"):].split("\n\nwrote")[0]

    held = calibration.held_out["precision"]
    test_claims = score.metrics.claims.at_operating_point
    inside = held.low is not None and held.high is not None and held.low <= test_claims.precision <= held.high
    lines = [
        "# Calibrating the embedded judge on RAGTruth QA dev, checked on test",
        "",
        f"Written by `python evals/calibration/ragtruth_qa.py --target '{args.target}'`, which runs the commands",
        f"below from the repository root (records and converted data in {WORK}/, git-ignored). No timing is",
        "reported (the machine was shared with other work).",
        "",
        "## Commands, in order (the test split is read only after the profile is written)",
        "",
        "```",
        f"rt4 convert ragtruth-qa --split dev --out {dev}",
        f"rt4 verify {dev} --judge embedded --out {dev_records}",
        f"rt4 calibrate {dev_records} --gold {dev} --target '{args.target}' --resamples {args.resamples} \\",
        f"    --out {PROFILE}",
        f"rt4 convert ragtruth-qa --split test --out {test}",
        f"rt4 verify {test} --judge {PROFILE} --out {test_records}",
        f"rt4 score {test_records}",
        f"rt4 verify {test} --judge embedded --out {test_shipped}   # the shipped point, for comparison",
        f"rt4 calibrate {dev_records} --gold {dev} --target '{args.target}' --resamples {args.resamples} --refit {dev}",
        "```",
        "",
        "## The answer",
        "",
        f"- dev, held out ({calibration.folds} folds over {calibration.groups} contexts): claim precision "
        f"{format_estimate(held)}, recall {format_estimate(calibration.held_out['recall'])} at the target "
        f"`{calibration.target}`; the profile's threshold (chosen on all dev labels): P(not entailed) >= "
        f"{calibration.threshold:g}" + ("" if calibration.target_reached else " (target not reached on dev)"),
        f"- dev, the judge's own verdicts (shipped threshold) on the same claims: precision "
        f"{format_estimate(calibration.current['precision'])}, recall {format_estimate(calibration.current['recall'])}",
        f"- dev, claims a guard decided (flagged at any threshold): {guarded}, of which {guarded_right} gold "
        "unsupported: they bound the precision any threshold can reach",
        f"- test, with the profile: claim precision **{test_claims.precision:.3f}**, recall {test_claims.recall:.3f}, "
        f"F1 {test_claims.f1:.3f} over {score.metrics.claims.aligned} aligned claims "
        f"({test_claims.tp} TP / {test_claims.fp} FP / {test_claims.fn} FN)",
        f"- test precision {'lies within' if inside else 'lies OUTSIDE'} the dev held-out interval "
        f"{format_estimate(held)}",
        f"- test, shipped threshold: claim precision {shipped.metrics.claims.at_operating_point.precision:.3f}, "
        f"recall {shipped.metrics.claims.at_operating_point.recall:.3f}",
        f"- answer level on test: with the profile P / R / F1 {score.metrics.answer.precision:.3f} / "
        f"{score.metrics.answer.recall:.3f} / {score.metrics.answer.f1:.3f}; shipped "
        f"{shipped.metrics.answer.precision:.3f} / {shipped.metrics.answer.recall:.3f} / "
        f"{shipped.metrics.answer.f1:.3f}",
        f"- the profile changed the verdicts the calibration predicted: {mismatched} of {claims} test claims differ "
        "from the prediction made from the shipped run's scores",
        "",
        "## rt4 calibrate's report on dev",
        "",
        markdown,
        "## `--refit`: the head refitted on the dev labels",
        "",
        "The last command above. The shipped head was trained on these same dev labels, so its figures here",
        "are in-sample and the comparison favours it; the refit's are out of fold.",
        "",
        refit_section.rstrip(),
        "",
        "## The profile",
        "",
        "```toml",
        (ROOT / PROFILE).read_text(encoding="utf-8").rstrip(),
        "```",
        "",
    ]
    (HERE / "RESULTS.md").write_text("\n".join(lines), encoding="utf-8")
    print(json.dumps({"test_precision": test_claims.precision, "held_out": held.model_dump(), "inside": inside,
                      "mismatched": mismatched, "claims": claims}))


if __name__ == "__main__":
    main()
