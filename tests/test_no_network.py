"""No judge reaches a host outside 127.0.0.1 unless it is named: every judge kind, run through the real
``rt4`` command under a guard that refuses and records any other connection.

The guard is a ``sitecustomize`` module on the subprocess's path: it wraps ``socket.getaddrinfo``
and ``socket.socket.connect`` (what every HTTP client ends in), lets loopback through and fails any
other host, writing it to a log the test reads. litellm's own price-list download is the trap this
catches: it happens at import, before any judge is built.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults import fault_server, judge_every_claim

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RT4 = Path(sys.executable).with_name("rt4")

GUARD = '''
import os, socket

_LOG = os.environ["RT4_TEST_NETWORK_LOG"]
_LOOPBACK = {"127.0.0.1", "localhost", "::1", None}


def _refuse(where):
    with open(_LOG, "a", encoding="utf-8") as log:
        log.write(f"{where}\\n")
    raise OSError(f"network guard: {where} is outside 127.0.0.1")


_getaddrinfo = socket.getaddrinfo


def _guarded_getaddrinfo(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if name not in _LOOPBACK:
        _refuse(f"getaddrinfo {name}")
    return _getaddrinfo(host, *args, **kwargs)


_connect = socket.socket.connect


def _guarded_connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOOPBACK:
        _refuse(f"connect {address[0]}")
    return _connect(self, address)


socket.getaddrinfo = _guarded_getaddrinfo
socket.socket.connect = _guarded_connect
'''

# Variables that would let a judge reach a real provider, or tell litellm to skip its download.
_UNSET = ("LITELLM_LOCAL_MODEL_COST_MAP", "OPENAI_API_KEY", "ZAI_API_KEY", "RT4_VLLM_A", "RT4_VLLM_B",
          "PROVIDER_API_KEY", "RT4_VLLM_BASE_URL", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")


@pytest.fixture
def guarded(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a guarded subprocess and the log of what it tried to reach."""
    guard_dir = tmp_path / "guard"
    guard_dir.mkdir()
    (guard_dir / "sitecustomize.py").write_text(GUARD, encoding="utf-8")
    log = tmp_path / "network.log"
    log.touch()
    environment = {key: value for key, value in os.environ.items() if key not in _UNSET}
    environment["PYTHONPATH"] = os.pathsep.join([str(guard_dir), environment.get("PYTHONPATH", "")])
    environment["RT4_TEST_NETWORK_LOG"] = str(log)
    return environment, log


def _rt4(environment: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RT4), *args], env=environment, capture_output=True, text=True, timeout=600, check=False)


def test_the_guard_catches_a_connection_outside_loopback(guarded: tuple[dict[str, str], Path]) -> None:
    environment, log = guarded
    script = (
        "import urllib.request\ntry:\n    urllib.request.urlopen('http://example.com', timeout=5)\n"
        "except OSError:\n    pass"
    )
    subprocess.run([sys.executable, "-c", script], env=environment, timeout=60, check=True)
    assert "example.com" in log.read_text(encoding="utf-8")


def test_every_judge_kind_stays_on_loopback(guarded: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    environment, log = guarded
    answers, rules = EXAMPLES / "answers.jsonl", EXAMPLES / "answers.rules.json"
    with fault_server(judge_every_claim("entailed")) as server:
        fleet = tmp_path / "local-fleet.toml"
        fleet.write_text(
            'name = "local-fleet"\nmodel = "openai/judge"\n'
            f'[[deployments]]\napi_base = "{server.base_url}"\n[[deployments]]\napi_base = "{server.base_url}"\n',
            encoding="utf-8",
        )
        runs: dict[str, list[str]] = {
            "embedded": [],
            "scripted": ["--judge", f"scripted:{rules}"],
            "litellm string": ["--judge", "openai/judge", "--api-base", server.base_url],
            "hosted_vllm": ["--judge", "hosted_vllm/judge", "--api-base", server.base_url],
            "fleet on loopback": ["--judge", str(fleet)],
            "cascade": ["--judge", f"cascade:embedded@0.99,scripted:{rules}"],
            "vote": ["--judge", f"vote:embedded,scripted:{rules},scripted:{rules}"],
        }
        for kind, judge in runs.items():
            completed = _rt4(environment, "verify", str(answers), *judge, "-o", str(tmp_path / f"{kind}.jsonl"),
                             "--cache-dir", str(tmp_path / "cache" / kind))
            assert completed.returncode in (0, 1), f"{kind}: {completed.stderr}"
            assert log.read_text(encoding="utf-8") == "", kind
        assert server.requests, "the loopback judges were called"
    # Judges whose variables are unset fail before any work, naming the variable, and reach nothing.
    for unset_judge, variable in ((str(EXAMPLES / "fleet.toml"), "RT4_VLLM_A"), ("gpt-4o-mini", "OPENAI_API_KEY")):
        out = tmp_path / "unset.jsonl"
        completed = _rt4(environment, "verify", str(answers), "--judge", unset_judge, "-o", str(out))
        assert completed.returncode == 2, completed.stderr
        assert variable in completed.stderr
        assert not out.exists()
        assert log.read_text(encoding="utf-8") == "", unset_judge
    assert json.loads((tmp_path / "scripted.jsonl").read_text(encoding="utf-8").splitlines()[0])["id"]
