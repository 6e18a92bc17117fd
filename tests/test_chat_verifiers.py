"""Chat verifiers over the OpenAI-compatible transport, against the fault-injecting server: Lynx asked
each claim in its own prompt, its PASS/FAIL JSON read back as verdicts, alone and as a cascade stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.faults import Fault, fault_server

SAMPLE = {"id": "s1", "question": "How tall is the tower?",
          "context": "The tower is 330 metres tall. It stands in Paris.",
          "answer": "The tower is 330 metres tall. It was built in 1850."}
LYNX_OPENING = "Given the following QUESTION, DOCUMENT and ANSWER"


def lynx(body: dict[str, Any]) -> str:
    """Lynx's reply: PASS when the claim (the ANSWER) holds 330, FAIL otherwise."""
    (message,) = body["messages"]
    answer = message["content"].split("ANSWER:\n", 1)[1].split("\n\n--", 1)[0]
    score = "PASS" if "330" in answer else "FAIL"
    return json.dumps({"REASONING": [f"- the answer says {answer!r}"], "SCORE": score})


def rt4(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def _setup(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text(json.dumps(SAMPLE) + "\n")
    (tmp_path / "lynx.toml").write_text('name = "lynx"\nmodel = "openai/lynx"\nadapter = "lynx"\n')


def _claims(path: Path) -> dict[str, str]:
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    return {claim["text"]: claim["label"] for claim in record["claims"]}


def test_lynx_judges_each_claim_in_its_own_prompt(tmp_path: Path) -> None:
    _setup(tmp_path)
    with fault_server(lynx) as server:
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", "lynx.toml", "--api-base", server.base_url,
                  "--decomposer", "rules", "--no-cache", "--out", "out.jsonl")
    assert run.returncode == 1, run.stderr  # one claim is not supported
    labels = _claims(tmp_path / "out.jsonl")
    assert labels == {"The tower is 330 metres tall.": "entailed", "It was built in 1850.": "baseless"}
    record = json.loads((tmp_path / "out.jsonl").read_text())
    assert record["judge"].startswith(f"lynx@{server.base_url}+lynx#")
    asked = set()
    for body in server.requests:
        (message,) = body["messages"]  # Lynx's prompt: one user message, no system prompt
        assert message["role"] == "user" and message["content"].startswith(LYNX_OPENING)
        assert "QUESTION (THIS DOES NOT COUNT AS BACKGROUND INFORMATION):\nHow tall is the tower?" in message["content"]
        assert "DOCUMENT:\nThe tower is 330 metres tall. It stands in Paris." in message["content"]
        asked.add(message["content"].split("ANSWER:\n", 1)[1].split("\n\n--", 1)[0])
    assert asked == set(labels)


def test_lynx_as_a_cascade_stage_and_its_failures_as_errors(tmp_path: Path) -> None:
    _setup(tmp_path)
    rules = tmp_path / "rules.json"
    # A first stage that settles nothing (confidence 0.5 under the stage's 0.9): Lynx decides every claim.
    rules.write_text(json.dumps({"verify": [{"claim": "", "label": "baseless", "confidence": 0.5}]}))
    with fault_server(lynx) as server:
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", f"cascade:scripted:{rules}@0.9,lynx.toml",
                  "--api-base", server.base_url, "--decomposer", "rules", "--no-cache", "--out", "out.jsonl")
    assert run.returncode == 1, run.stderr
    assert _claims(tmp_path / "out.jsonl")["The tower is 330 metres tall."] == "entailed"
    assert server.requests
    # Replies that are not Lynx's JSON: the claims get errors and no verdict (exit 4), never a guess.
    with fault_server(lynx, default=Fault("invalid_json")) as server:
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", "lynx.toml", "--api-base", server.base_url,
                  "--decomposer", "rules", "--no-cache", "--out", "failed.jsonl")
    assert run.returncode == 4, run.stderr
    record = json.loads((tmp_path / "failed.jsonl").read_text())
    assert all(claim["label"] is None for claim in record["claims"])
