"""A credential in ``--api-base`` whose parameter name is percent-encoded (``?api%5Fkey=``, issue 40)
was recorded as given: the name is compared decoded, as the server reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from audit_fixtures import write_samples
from conftest import judge_over
from faults import fault_server
from test_secrets import echoing_reply, files_holding, rt4

from rt4chart.scrubbing import redact_url, scrub


@pytest.mark.parametrize("name", ["api%5Fkey", "API%5fKEY", "%61pi_key", "access%2Dtoken", "pass%77ord"])
def test_a_percent_encoded_credential_parameter_is_redacted(name: str) -> None:
    url = f"http://127.0.0.1:8000/v1?model=x&{name}=ENCODEDSECRET7&page=2"
    assert redact_url(url) == f"http://127.0.0.1:8000/v1?model=x&{name}=***&page=2"
    assert "ENCODEDSECRET7" not in scrub(f"calling {url} failed", [])


def test_an_ordinary_parameter_is_kept() -> None:
    url = "http://127.0.0.1:8000/v1?model=x&monkey%20business=1&keyboard=2"
    assert redact_url(url) == url


def test_an_encoded_credential_in_the_base_url_is_in_no_record_report_or_message(
    tmp_path: Path, transport: str
) -> None:
    write_samples(tmp_path / "in.jsonl", 2)
    with fault_server(echoing_reply) as server:
        done = rt4("verify", "in.jsonl", "--judge", judge_over(transport, "openai/fault", tmp_path), "--api-base",
                   f"{server.base_url}?api%5Fkey=QUERYSECRET42&model=x", "--decomposer", "rules", "--no-cache",
                   "--out", "out.jsonl", "--report", "report.html", "--junit", "junit.xml", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    (tmp_path / "run.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    record = json.loads((tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert record["judge"].endswith("?api%5Fkey=***&model=x")
    assert files_holding(tmp_path, "QUERYSECRET42") == []
