"""A mistyped ``--judge`` is rejected before litellm is imported (issue 46: it took seconds to say
so), and that quick decision never rejects a name litellm itself routes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rt4chart.judges.model_names import surely_no_model
from rt4chart.runs.run import EXIT_USAGE

ROOT = Path(__file__).resolve().parents[1]


def test_a_mistyped_judge_is_a_usage_error_without_importing_litellm() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rt4chart", "verify", "examples/answers.jsonl", "--judge",
         "gpt4o-mini"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"}, check=False,
    )
    assert done.returncode == EXIT_USAGE
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "rt4chart.cli.audit" in imported, "the probe sees the command's imports"
    assert not {name for name in imported if name.split(".")[0] == "litellm"}
    message = " ".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))
    message = " ".join(message.split())
    assert "unknown judge 'gpt4o-mini'" in message and "did you mean 'gpt-4o-mini'?" in message
    assert "Traceback" not in done.stderr


def test_the_quick_rejection_never_refuses_a_name_litellm_routes() -> None:
    import litellm

    # Every bare name litellm knows from its own lists and tables, and its providers' names.
    candidates = {name for value in vars(litellm).values() if isinstance(value, list | set | frozenset)
                  for name in value if isinstance(name, str) and "/" not in name}
    candidates |= {key for key in litellm.model_cost if "/" not in key}
    assert len(candidates) > 100, "litellm's lists were found"
    rejected = [name for name in sorted(candidates) if surely_no_model(name)]
    routed = []
    for name in rejected:
        try:
            litellm.get_llm_provider(model=name)
        except Exception:  # litellm's BadRequestError: the name is no model
            continue
        routed.append(name)
    assert routed == []
    assert surely_no_model("gpt4o-mini") and not surely_no_model("gpt-4o-mini")
    assert not surely_no_model("openai/anything") and not surely_no_model("anthropic.claude-v2")
