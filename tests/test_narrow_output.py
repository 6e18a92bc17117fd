"""Output readable in an 80-column CI log (issue 46): tables that do not fit become lists, and no
name, figure or path is split across lines. The real CLI, as its own process, at ``COLUMNS=80``."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

from tests.test_agree_cli import run_records, write_records

ROOT = Path(__file__).resolve().parents[1]


def _rt4(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "80"}, check=False)


def _whole(text: str, token: str) -> bool:
    """Whether ``token`` appears within one line of ``text``."""
    return any(token in line for line in text.splitlines())


def test_rt4_judges_splits_no_name_at_80_columns() -> None:
    done = _rt4("judges")
    assert done.returncode == 0, done.stderr
    for token in ("embedded", "gpt-4o-mini", "OPENAI_API_KEY", "ZAI_API_KEY", "hosted_vllm/Qwen/Qwen3-8B",
                  "RT4_VLLM_BASE_URL", "openai/smollm2", "calls in flight", "$/1M tok in/out"):
        assert _whole(done.stdout, token), f"{token!r} is split: {done.stdout}"


def test_rt4_agree_runs_splits_no_figure_at_80_columns(tmp_path: Path) -> None:
    rng = random.Random(0)
    gold = [rng.random() < 0.5 for _ in range(40)]
    judges = ("scripted:first-judge-rules.json#0a1b2c3d", "scripted:second-judge-rules.json#4e5f6a7b")
    files = [str(write_records(tmp_path / f"{index}-{run}.jsonl", run_records(judge, gold, accuracy, rng)))
             for index, (judge, accuracy) in enumerate(zip(judges, (0.9, 0.6), strict=True)) for run in range(3)]
    done = _rt4("agree", *files, "--runs", "--resamples", "50")
    assert done.returncode == 0, done.stderr
    for token in (*judges, "balanced accuracy", "balanced_accuracy", "answer F1"):
        assert _whole(done.stdout, token), f"{token!r} is split: {done.stdout}"
    spread = re.findall(r"\d\.\d{3} ± \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", done.stdout)
    assert len(spread) == 4, f"two judges' F1 and balanced accuracy, each on one line: {done.stdout}"


def test_wrote_lines_never_split_a_path_at_80_columns(tmp_path: Path) -> None:
    folder = tmp_path / "a-folder-name-long-enough-that-its-path-passes-eighty-columns-in-a-ci-log"
    folder.mkdir()
    sample = {"id": "a", "context": "The trial lasts 14 days.", "answer": "The trial lasts 14 days."}
    (folder / "in.jsonl").write_text(json.dumps(sample) + "\n", encoding="utf-8")
    rules = folder / "rules.json"
    rules.write_text(json.dumps({"verify": [], "default": "baseless"}), encoding="utf-8")
    records = folder / "records.jsonl"
    audited = _rt4("verify", str(folder / "in.jsonl"), "--judge", f"scripted:{rules}", "--out", str(records),
                   "--no-cache", "-q")
    assert audited.returncode == 1 and records.is_file(), audited.stderr  # a baseless answer
    html = folder / "the-html-report-of-this-audit.html"
    done = _rt4("report", str(records), "--html", str(html), "--junit", str(folder / "junit.xml"))
    assert html.is_file(), done.stderr
    assert len(str(html)) > 80
    assert _whole(done.stderr, f"wrote {html}, {folder / 'junit.xml'}"), done.stderr


def test_rt4_agree_splits_no_judge_name_at_80_columns(tmp_path: Path) -> None:
    # The kappa matrix, the pairs, the labels per judge and the against-gold table of three judges with
    # long names are wider than 80 columns: each becomes a list, and every name stays on one line.
    rng = random.Random(1)
    gold = [rng.random() < 0.5 for _ in range(30)]
    judges = ("scripted:a-first-judge-with-a-long-rules-file.json#0a1b2c3d",
              "scripted:a-second-judge-with-a-long-rules-file.json#4e5f6a7b",
              "hosted_vllm/Qwen/Qwen3-8B-Instruct-served-on-a-local-vllm#9c8d7e6f")
    files = [str(write_records(tmp_path / f"{index}.jsonl", run_records(judge, gold, 0.8, rng)))
             for index, judge in enumerate(judges)]
    done = _rt4("agree", *files, "--resamples", "50")
    assert done.returncode == 0, done.stderr
    for token in (*judges, "balanced acc.", "kappa 95% CI"):
        assert _whole(done.stdout, token), f"{token!r} is split: {done.stdout}"
    assert all(len(line) <= 80 or any(judge in line for judge in judges) for line in done.stdout.splitlines()), (
        f"only a line holding a whole name may pass 80 columns: {done.stdout}"
    )
