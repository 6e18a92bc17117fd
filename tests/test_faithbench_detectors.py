"""The evals recipe that turns FaithBench's stored detector verdicts into rt4chart output records."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "datasets" / "faithbench"
SCRIPT = ROOT / "evals" / "agreement" / "faithbench_detectors.py"
DETECTORS = ["HHEM-1.0", "HHEM-2.1", "HHEM-2.1-English", "TrueTeacher", "TRUE-NLI", "GPT-3.5-Turbo",
             "GPT-4-Turbo", "GPT-4o"]


def test_detector_records_align_with_rt4_convert_and_feed_rt4_agree(tmp_path: Path) -> None:
    data = tmp_path / "faithbench"
    shutil.copytree(FIXTURE, data)
    # Scores for every stored detector: HHEM flags sample 1-2 (0.2 < 0.5); TRUE-NLI has no score for 2-3.
    for batch in (data / "data_for_release").glob("batch_*.json"):
        content = json.loads(batch.read_text(encoding="utf-8"))
        for sample in content["samples"]:
            key = f"{batch.stem.split('_')[1]}-{sample['sample_id']}"
            sample["metadata"].update({
                "hhemv1": 0.9, "hhem-2.1": 0.2 if key == "1-2" else 0.8, "hhem-2.1-english": 0.5,
                "trueteacher": 0, "true_nli": None if key == "2-3" else 1, "gpt-3.5-turbo": 1, "gpt-4-turbo": 0,
            })
        batch.write_text(json.dumps(content), encoding="utf-8")
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(SCRIPT), "--path", str(data), "--split", "all", "--out-dir", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert sorted(p.stem for p in out.iterdir()) == sorted(DETECTORS)
    converted = tmp_path / "input.jsonl"
    subprocess.run([sys.executable, "-m", "rt4chart", "convert", "faithbench", "--path", str(data), "-o",
                    str(converted)], check=True, capture_output=True, timeout=300)
    inputs = [json.loads(line) for line in converted.read_text(encoding="utf-8").splitlines()]

    def records(name: str) -> list[dict[str, object]]:
        return [json.loads(line) for line in (out / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]

    hhem = records("HHEM-2.1")
    assert [(r["id"], r["line"]) for r in hhem] == [(s["id"], n) for n, s in enumerate(inputs, start=1)]
    assert [r["hallucinated"] for r in hhem] == [r["id"] == "faithbench-1-2" for r in hhem]
    assert [r["gold"]["hallucinated"] for r in hhem] == [s["gold"]["hallucinated"] for s in inputs]  # type: ignore[index]
    assert all(r["hallucinated"] is True for r in records("TrueTeacher"))  # 0 = inconsistent
    assert all(r["hallucinated"] is False for r in records("HHEM-2.1-English"))  # 0.5 is not below 0.5
    nli = {r["id"]: r for r in records("TRUE-NLI")}
    assert nli["faithbench-2-3"]["label"] is None and nli["faithbench-2-3"]["errors"]
    agree = subprocess.run([sys.executable, "-m", "rt4chart", "agree", *(str(out / f"{n}.jsonl") for n in DETECTORS),
                            "--json", "--resamples", "10"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert agree.returncode == 0, agree.stderr
    report = json.loads(agree.stdout)
    assert len(report["gold"]) == 8 and report["gold_items"] == len(inputs)
    assert next(d for d in report["distributions"] if d["judge"] == "faithbench:TRUE-NLI")["missing"] == 1
