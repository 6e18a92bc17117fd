"""The published-figure harness (evals/verifiers/published.py) on tiny random models of the real classes:
both rows for each pulled verifier, the pull command for the others, exit 0. Structure only: a random
model's figures mean nothing, so none is asserted."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.conftest import require_module

require_module("torch", "torch (the verifiers extra)")
require_module("transformers", "transformers (the verifiers extra)")

from rt4chart.judges.hub import models_dir  # noqa: E402
from tests.tiny_verifiers import tiny_lettucedetect, tiny_roberta  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "evals" / "verifiers"))
import published  # noqa: E402

PULLED = ("lettucedetect-base", "minicheck-roberta-large")


def test_each_pulled_verifier_gets_both_rows_and_the_others_their_pull_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("RT4_DATA_DIR", str(ROOT / "tests" / "fixtures" / "datasets"))
    tiny_lettucedetect(models_dir(), "lettucedetect-base")
    tiny_roberta(models_dir(), "minicheck-roberta-large", max_positions=512)  # the profile reads 512 tokens
    assert published.main(["--split", "test", "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for profile in published.verifier_profiles():
        mine = [line for line in lines if line.startswith(f"{profile} ")]
        if profile in PULLED:
            assert [line.split(":")[0] for line in mine] == [f"{profile} alone", f"{profile} method"]
            for line in mine:
                assert re.search(r"answer F1 \d\.\d{3}, BA (\d\.\d{3}|n/a) \(\d+ answers; python evals/verifiers/"
                                 rf"published\.py --split test --limit 2 --profile {profile}\)$", line), line
        else:
            assert lines.count(f"{profile}: weights not present: rt4 models pull {profile}") == 1
    assert any(line.startswith("LLM-AggreFact: not in RT4_DATA_DIR") for line in lines)
