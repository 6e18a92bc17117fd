"""``rt4 guard``'s choices per service and per request: the decomposer (``--decomposer``), a latency
budget asked by a proxied chat request, the shape of streamed verdict events, and what a call cut at
the budget's deadline costs. Real servers on free 127.0.0.1 ports, real HTTP clients; no assertion on
wall-clock time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from typing import Any

from test_guard import JUDGE
from test_guard_limits import TRIAL_ANSWER, TRIAL_CONTEXT
from typer.testing import CliRunner

from rt4chart.cli.app import app as cli_app


def claims_through_the_cli(*flags: str) -> list[str]:
    """The claim texts of TRIAL_ANSWER's record from a real ``rt4 guard`` started with ``flags``."""
    command = [sys.executable, "-m", "rt4chart", "guard", "--port", "0", "--judge", JUDGE, *flags]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "RT4_GUARD_TOKEN": ""})
    try:
        assert process.stderr is not None
        ready = process.stderr.readline()
        assert "serving on http://127.0.0.1:" in ready, ready + process.stderr.read()
        url = ready.split("serving on ")[1].split()[0]
        body = json.dumps({"context": TRIAL_CONTEXT, "answer": TRIAL_ANSWER}).encode()
        request = urllib.request.Request(url + "/v1/verify", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as response:
            reply: dict[str, Any] = json.loads(response.read())
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
    return [claim["text"] for claim in reply["record"]["claims"]]


def test_the_decomposer_is_chosen_by_flag() -> None:
    # The example rules decompose each trial sentence into two claims; by rules a sentence is a claim.
    assert len(claims_through_the_cli()) == 4
    by_rules = claims_through_the_cli("--decomposer", "rules")
    assert by_rules == [
        "All users, including existing customers, can start the free trial.",
        "The trial lasts 14 days, and a verified new user can use it for up to 21 days in total.",
    ]


def test_an_unknown_decomposer_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli_app, ["guard", "--decomposer", "magic"])
    assert result.exit_code == 2
    assert "--decomposer must be" in result.output and "'magic'" in result.output
