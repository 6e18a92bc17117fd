"""The default judge without torch, its model loaded only once a run starts, and the README naming
the judge that ships (issue 46)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLES, require_embedded

from rt4chart.judges.embedded.verifier import VERSION

REPOSITORY = Path(__file__).resolve().parent.parent
BLOCKED_IMPORTS = Path(__file__).resolve().parent / "blocked_imports.py"


def rt4_with_blocked(blocked: list[str], arguments: list[str], log: Path) -> subprocess.CompletedProcess[str]:
    """The real ``rt4`` command in a process where ``blocked`` modules cannot be imported."""
    environment = {**os.environ, "RT4_BLOCKED_LOG": str(log), "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, str(BLOCKED_IMPORTS), ",".join(blocked), "--", *arguments],
        capture_output=True, text=True, timeout=600, check=False, cwd=REPOSITORY, env=environment,
    )


def test_the_default_judge_audits_with_torch_and_transformers_unimportable(tmp_path: Path) -> None:
    require_embedded()
    log = tmp_path / "blocked.log"
    result = rt4_with_blocked(
        ["torch", "transformers", "sentence_transformers"],
        ["verify", str(EXAMPLES / "answers.jsonl"), "--format", "jsonl", "--no-cache"],
        log,
    )
    assert result.returncode == 1, result.stderr  # some example answers are hallucinated
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [record["label"] for record in records] == ["entailed", "contradicted", "baseless", "contradicted"]
    assert {record["judge"] for record in records} == {f"embedded#{VERSION}"}
    assert not any(claim["errors"] for record in records for claim in record["claims"])


def test_a_refused_judge_is_refused_before_the_encoder_is_loaded(tmp_path: Path) -> None:
    """The cascade's first stage, the embedded judge, is built; its second stage is a typo. The run is
    refused (exit 2, naming the typo) and the encoder's module was never even asked for."""
    require_embedded()
    log = tmp_path / "blocked.log"
    result = rt4_with_blocked(
        ["rt4chart.judges.embedded.minilm"],
        ["verify", str(EXAMPLES / "answers.jsonl"), "--judge", "cascade:embedded@0.6,gpt4o-mini"],
        log,
    )
    assert result.returncode == 2, result.stderr
    assert "unknown judge 'gpt4o-mini'" in result.stderr
    assert not log.exists(), f"the encoder was loaded for a refused run: {log.read_text()}"


def _summary_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("evals_summary", REPOSITORY / "evals" / "summary.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_names_the_judge_that_ships() -> None:
    """The headline table is the one ``python evals/summary.py`` writes for ``embedded#VERSION`` from
    its result files; every command output the README shows names that judge; any other
    ``embedded#`` hash is a past measurement whose results are in evals/results."""
    summary = _summary_module()
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    shipped = f"embedded#{VERSION}"
    block = readme.split(summary.HEADLINE_START)[1].split(summary.HEADLINE_END)[0]
    assert block == "\n" + summary.embedded_headline(shipped)
    assert "not run" not in block
    in_code = {
        judge for code in re.findall(r"```.*?```", readme, flags=re.DOTALL)
        for judge in re.findall(r"embedded#[0-9a-f]{8}", code)
    }
    assert in_code <= {shipped}
    results = "\n".join(path.read_text(encoding="utf-8") for path in (REPOSITORY / "evals" / "results").rglob("*.json"))
    for judge in set(re.findall(r"embedded#[0-9a-f]{8}", readme)) - {shipped}:
        assert judge in results, f"README names {judge}, neither the shipped judge nor one with results"


def test_a_missing_part_of_the_embedded_extra_is_a_usage_error_before_the_run(tmp_path: Path) -> None:
    """The encoder loads late, but what it needs is looked for when the judge is built: exit 2 naming
    the part, no record with an error in it."""
    result = rt4_with_blocked(
        ["safetensors"], ["verify", str(EXAMPLES / "answers.jsonl"), "--format", "jsonl"], tmp_path / "blocked.log"
    )
    assert result.returncode == 2, result.stderr
    assert "cannot load the embedded verifier" in result.stderr and "safetensors" in result.stderr
    assert result.stdout == ""
