"""The README's first command: `rt4 verify examples/answers.jsonl` with the default judge, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_default_judge_audits_the_examples_with_no_network(tmp_path: Path) -> None:
    # Any attempt to reach the network goes to a closed local port and fails at once.
    closed = "http://127.0.0.1:9"
    env = {**os.environ, "HTTP_PROXY": closed, "HTTPS_PROXY": closed, "ALL_PROXY": closed, "NO_PROXY": ""}
    env.pop("HF_HUB_OFFLINE", None)
    env["HOME"] = str(tmp_path)  # a fresh user: no cache, no model hub cache, no config
    result = subprocess.run(
        [sys.executable, "-m", "rt4chart", "verify", str(EXAMPLES / "answers.jsonl"), "--quiet"],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )
    assert result.returncode == 1, result.stderr  # some example answers are hallucinated
    records = [json.loads(line) for line in result.stdout.splitlines()]
    inputs = [json.loads(line) for line in (EXAMPLES / "answers.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [s["id"] for s in inputs]
    assert all(r["judge"].startswith("embedded#") and r["label"] is not None and not r["errors"] for r in records)
    by_id = {r["id"]: r for r in records}
    assert by_id["refund-faithful"]["label"] == "entailed"
    assert by_id["refund-wrong-number"]["label"] == "contradicted"
    for record in records:
        context = inputs[record["line"] - 1]["context"]
        joined = context if isinstance(context, str) else "\n\n".join(context)
        for claim in record["claims"]:
            assert all(joined[e["start"] : e["end"]] == e["text"] for e in claim["evidence"])


README = Path(__file__).resolve().parents[1] / "README.md"


def _python_block_with(marker: str) -> str:
    """The README's ```python block that contains ``marker``."""
    blocks = README.read_text(encoding="utf-8").split("```python\n")[1:]
    return next(block.split("```", 1)[0] for block in blocks if marker in block)


def test_the_lower_level_library_example_runs_as_written(tmp_path: Path) -> None:
    code = _python_block_with("rt4chart.Pipeline(stack")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                            cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "contradicted"


def test_rt4_serve_prints_the_judge_string_the_readme_shows() -> None:
    from rt4chart.judges.serve import LocalServer

    server = LocalServer(base_url="http://127.0.0.1:8080", alias="smollm2", model_path=Path("SmolLM2.gguf"))
    assert f"rt4 verify examples/answers.jsonl {server.judge_arguments(2)}" in README.read_text(encoding="utf-8")
