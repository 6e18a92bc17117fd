"""``rt4 models pull`` against a local stand-in of the Hugging Face hub, then the pulled verifier judging
offline (``HF_HUB_OFFLINE=1``, the stand-in gone); a verifier never pulled is exit 2 naming the pull
command; a file whose hash differs from the hub's listing is refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_module

require_module("torch", "torch (the verifiers extra)")
require_module("transformers", "transformers (the verifiers extra)")

from rt4chart.judges.hub import PullRecord, snapshot_dir  # noqa: E402
from rt4chart.judges.registry import load_profiles  # noqa: E402
from tests.hub_standin import hub_standin  # noqa: E402
from tests.test_no_network import guarded  # noqa: E402, F401 - the network guard's fixture
from tests.tiny_verifiers import tiny_roberta  # noqa: E402

PROFILE = "minicheck-roberta-large"
REPO = "lytang/MiniCheck-RoBERTa-Large"
SAMPLE = {"id": "s1", "question": "How tall is the tower?", "context": "The tower is 330 metres tall. It is in Paris.",
          "answer": "The tower is 330 metres tall."}


def rt4(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The models folder under ``tmp_path`` (through XDG_CACHE_HOME), the hub's own cache and token too."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), HF_HOME=str(tmp_path / "hf"), COLUMNS="200", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture
def served(tmp_path: Path) -> Path:
    """A tiny checkpoint of MiniCheck-RoBERTa-Large's classes, as the hub repository holds its files."""
    record = tiny_roberta(tmp_path / "source", "source")
    return snapshot_dir(record.repos[0], tmp_path / "source")


def _models(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "rt4chart" / "verifier-models"


def test_pull_then_judge_offline(tmp_path: Path, served: Path) -> None:
    with hub_standin({REPO: served}) as hub:
        pulled = rt4("models", "pull", PROFILE, env=_env(tmp_path, HF_ENDPOINT=hub.url), cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    pinned = load_profiles()[PROFILE].verifier
    assert pinned is not None
    record = PullRecord.model_validate_json((_models(tmp_path) / "pulled" / f"{PROFILE}.json").read_text())
    (repo,) = record.repos
    assert (repo.repo, repo.commit) == (REPO, pinned.weights.revision)
    assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= set(repo.sha256)
    import hashlib

    for name, digest in repo.sha256.items():
        assert hashlib.sha256((served / name).read_bytes()).hexdigest() == digest
    assert any(request.startswith(f"GET /{REPO}/resolve/{repo.commit}/model.safetensors") for request in hub.requests)

    listing = rt4("judges", env=_env(tmp_path), cwd=tmp_path)
    assert f"{REPO} pulled" in " ".join(listing.stdout.split())

    # The stand-in is gone and the hub is off: the run reads only the pulled files.
    (tmp_path / "in.jsonl").write_text(json.dumps(SAMPLE) + "\n")
    env = _env(tmp_path, HF_HUB_OFFLINE="1", HF_ENDPOINT=hub.url)
    run = rt4("verify", "in.jsonl", "--judge", PROFILE, "--out", "out.jsonl", "--no-cache", env=env, cwd=tmp_path)
    assert run.returncode in (0, 1), run.stderr
    (line,) = (tmp_path / "out.jsonl").read_text().splitlines()
    output = json.loads(line)
    assert output["judge"] == f"{PROFILE}#{repo.commit[:8]}"
    assert output["claims"] and all(claim["label"] in ("entailed", "baseless") for claim in output["claims"])


def test_a_verifier_never_pulled_is_exit_2_naming_the_pull_command(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text(json.dumps(SAMPLE) + "\n")
    run = rt4("verify", "in.jsonl", "--judge", PROFILE, "--no-cache", env=_env(tmp_path), cwd=tmp_path)
    assert run.returncode == 2
    assert f"rt4 models pull {PROFILE}" in " ".join(run.stderr.split())
    assert "Traceback" not in run.stderr
    listing = rt4("judges", env=_env(tmp_path), cwd=tmp_path)
    listed = " ".join(listing.stdout.split())
    assert f"{REPO} not pulled" in listed and "A verifier not pulled: rt4 models pull NAME" in listed


def test_a_file_whose_hash_differs_from_the_hubs_is_refused(tmp_path: Path, served: Path) -> None:
    with hub_standin({REPO: served}, damaged={"model.safetensors"}) as hub:
        pulled = rt4("models", "pull", PROFILE, env=_env(tmp_path, HF_ENDPOINT=hub.url), cwd=tmp_path)
    assert pulled.returncode == 2
    assert "model.safetensors" in pulled.stderr and "differs" in pulled.stderr
    assert not (_models(tmp_path) / "pulled" / f"{PROFILE}.json").exists()


def test_pull_with_the_hub_offline_is_exit_2(tmp_path: Path, served: Path) -> None:
    with hub_standin({REPO: served}) as hub:
        pulled = rt4("models", "pull", PROFILE, env=_env(tmp_path, HF_ENDPOINT=hub.url, HF_HUB_OFFLINE="1"),
                     cwd=tmp_path)
    assert pulled.returncode == 2 and "Traceback" not in pulled.stderr
    assert hub.requests == []


def test_pull_from_an_unreachable_hub_is_exit_2_without_credentials(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://user:secret@127.0.0.1:{port}"
    pulled = rt4("models", "pull", PROFILE, env=_env(tmp_path, HF_ENDPOINT=endpoint), cwd=tmp_path)
    assert pulled.returncode == 2 and "Traceback" not in pulled.stderr
    assert f"127.0.0.1:{port}" in pulled.stderr and "secret" not in pulled.stderr


def test_a_pulled_verifier_reaches_no_host(guarded: tuple[dict[str, str], Path], tmp_path: Path) -> None:  # noqa: F811
    """Under the network guard of tests/test_no_network.py, with no HF_* variable set: loading the
    pulled checkpoint (config, tokenizer, weights) and judging reach nothing."""
    environment, log = guarded
    tiny_roberta(_models(tmp_path), PROFILE)
    environment = {key: value for key, value in environment.items() if not key.startswith("HF_")}
    environment["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    (tmp_path / "in.jsonl").write_text(json.dumps(SAMPLE) + "\n")
    run = rt4("verify", "in.jsonl", "--judge", PROFILE, "--no-cache", "-o", "out.jsonl", env=environment, cwd=tmp_path)
    assert run.returncode in (0, 1), run.stderr
    assert json.loads((tmp_path / "out.jsonl").read_text())["judge"].startswith(f"{PROFILE}#")
    assert log.read_text(encoding="utf-8") == ""
