"""Judge profiles, ``--judge`` resolution, provider routing (offline, with litellm's own resolver),
fail-fast on missing keys, and ``rt4 judges``."""

from __future__ import annotations

from pathlib import Path

import litellm
import pytest
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.judges.cascade import CascadeBackend
from rt4chart.judges.litellm import LiteLLMBackend
from rt4chart.judges.openai_compat import OpenAICompatBackend, OpenAICompatSender
from rt4chart.judges.registry import (
    DEFAULT_CASCADE_CONFIDENCE,
    NO_KEY,
    JudgeConfigError,
    JudgeProfile,
    check_judge_serves,
    judge_stack,
    load_profiles,
    parse_cascade,
    resolve_judge,
)
from rt4chart.judges.scripted import ScriptedBackend
from rt4chart.options import AuditOptions
from rt4chart.protocol import Backend

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RULES = str(EXAMPLES / "free_trial.rules.json")
SECRET = "sk-test-0a1b2c3d4e5f60718293"
KEY_VARIABLES = ("OPENAI_API_KEY", "ZAI_API_KEY", "RT4_VLLM_BASE_URL")


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with no key and no vLLM URL in the environment."""
    for variable in KEY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)


def test_shipped_profiles() -> None:
    profiles = load_profiles()
    assert {"gpt-4o-mini", "gpt-4o", "glm-4.7", "qwen-vllm", "embedded"} <= set(profiles)
    assert profiles["gpt-4o-mini"].api_key_env == "OPENAI_API_KEY"
    assert profiles["glm-4.7"].model == "zai/glm-4.7" and profiles["glm-4.7"].api_key_env == "ZAI_API_KEY"
    assert profiles["qwen-vllm"].model is not None and profiles["qwen-vllm"].model.startswith("hosted_vllm/")
    assert profiles["qwen-vllm"].api_base_env == "RT4_VLLM_BASE_URL"
    assert profiles["embedded"].kind == "embedded"


@pytest.mark.parametrize(
    ("profile", "model", "provider", "api_base"),
    [
        ("gpt-4o-mini", "gpt-4o-mini", "openai", None),
        ("gpt-4o", "gpt-4o", "openai", None),
        ("glm-4.7", "glm-4.7", "zai", "https://api.z.ai/api/paas/v4"),
        ("qwen-vllm", "Qwen/Qwen3-8B", "hosted_vllm", None),
    ],
)
def test_provider_routing(profile: str, model: str, provider: str, api_base: str | None) -> None:
    model_string = load_profiles()[profile].model
    assert model_string is not None
    routed_model, routed_provider, _, routed_base = litellm.get_llm_provider(model=model_string)
    assert (routed_model, routed_provider) == (model, provider)
    if api_base is not None:
        assert routed_base == api_base


def test_profile_with_key_builds_a_litellm_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    backend = resolve_judge("gpt-4o-mini", concurrency=3)
    assert isinstance(backend, LiteLLMBackend)
    assert (backend.name, backend.sender.provider, backend.concurrency) == ("gpt-4o-mini", "openai", 3)
    assert backend.sender.structured_output == "json_schema"
    assert SECRET not in repr(backend)


@pytest.mark.parametrize(
    ("spec", "variable"),
    [
        ("gpt-4o-mini", "OPENAI_API_KEY"),
        ("gpt-4o", "OPENAI_API_KEY"),
        ("glm-4.7", "ZAI_API_KEY"),
        ("zai/glm-4.7", "ZAI_API_KEY"),  # a raw model string with a shipped profile uses it
        ("openai/gpt-4.1-nano", "OPENAI_API_KEY"),
        ("qwen-vllm", "RT4_VLLM_BASE_URL"),
        ("hosted_vllm/Qwen/Qwen3-8B", "--api-base"),
        (f"cascade:scripted:{RULES},gpt-4o-mini", "OPENAI_API_KEY"),
    ],
)
def test_missing_configuration_fails_fast_naming_it(spec: str, variable: str) -> None:
    with pytest.raises(JudgeConfigError, match=variable.replace("-", r"\-")):
        resolve_judge(spec)


def test_vllm_profile_takes_its_base_url_from_env_or_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RT4_VLLM_BASE_URL", "http://127.0.0.1:9/v1")
    # A hosted_vllm/ model at a base URL speaks the OpenAI protocol: the lean transport carries it.
    from_env = resolve_judge("qwen-vllm")
    assert isinstance(from_env, OpenAICompatBackend) and isinstance(from_env.sender, OpenAICompatSender)
    assert from_env.sender.api_base == "http://127.0.0.1:9/v1"
    from_flag = resolve_judge("qwen-vllm", api_base="http://127.0.0.1:10/v1")
    assert isinstance(from_flag, OpenAICompatBackend) and isinstance(from_flag.sender, OpenAICompatSender)
    assert from_flag.sender.api_base == "http://127.0.0.1:10/v1"


def test_raw_model_on_own_server_sends_no_environment_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    backend = resolve_judge("openai/my-model", api_base="http://127.0.0.1:9/v1")
    assert isinstance(backend, OpenAICompatBackend) and isinstance(backend.sender, OpenAICompatSender)
    assert backend.sender.model == "my-model" and backend.sender.structured_output == "json_schema"
    assert SECRET not in backend.sender.secrets  # the user's OpenAI key never goes to an arbitrary server
    assert backend.sender._api_key == NO_KEY


def test_unknown_judge_is_a_config_error() -> None:
    with pytest.raises(JudgeConfigError, match="unknown judge 'no-such-judge'"):
        resolve_judge("no-such-judge")
    with pytest.raises(JudgeConfigError, match="rules file"):
        resolve_judge("scripted:")


def test_cascade_spec_parsing() -> None:
    assert parse_cascade("cascade:embedded@0.9,gpt-4o-mini") == [
        ("embedded", 0.9), ("gpt-4o-mini", DEFAULT_CASCADE_CONFIDENCE)
    ]
    # An @ that is not a confidence belongs to the model string.
    assert parse_cascade("cascade:vertex_ai/claude@20240620,b")[0] == (
        "vertex_ai/claude@20240620", DEFAULT_CASCADE_CONFIDENCE
    )
    for bad in ("cascade:embedded", "cascade:a,,b", "cascade:a@0.5,cascade:b"):
        with pytest.raises(JudgeConfigError):
            parse_cascade(bad)


def test_wrap_reaches_every_cascade_stage() -> None:
    wrapped: list[str] = []

    def wrap(leaf: Backend) -> Backend:
        wrapped.append(leaf.name)
        return leaf

    backend = resolve_judge(f"cascade:scripted:{RULES}@0.7,scripted:{RULES}", wrap=wrap)
    assert isinstance(backend, CascadeBackend)
    assert len(wrapped) == 2 and all(name.startswith("scripted:free_trial.rules.json") for name in wrapped)
    assert [stage.confidence for stage in backend.stages] == [0.7, DEFAULT_CASCADE_CONFIDENCE]
    assert isinstance(resolve_judge(f"scripted:{RULES}", wrap=wrap), ScriptedBackend)
    assert len(wrapped) == 3


def test_verify_with_a_keyless_cloud_judge_exits_2_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        app, ["verify", str(EXAMPLES / "free_trial.jsonl"), "--judge", "gpt-4o-mini", "--out", str(out)]
    )
    assert result.exit_code == 2
    assert "OPENAI_API_KEY" in result.output
    assert not out.exists()


def test_rt4_judges_says_which_keys_are_set_and_never_prints_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    result = CliRunner().invoke(app, ["judges"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = {line.split()[1]: line for line in result.output.splitlines() if line.startswith("│")}
    assert "OPENAI_API_KEY set" in lines["gpt-4o-mini"]
    assert "ZAI_API_KEY not set" in lines["glm-4.7"]
    assert "RT4_VLLM_BASE_URL not set" in lines["qwen-vllm"]
    assert {"gpt-4o", "embedded"} <= set(lines)
    assert SECRET not in result.output and SECRET[:10] not in result.output


def calibrated_profile(folder: Path, judge: str, name: str = "calibrated", threshold: float = 0.4) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f'name = "{name}"\nkind = "calibrated"\njudge = "{judge}"\nclaim_threshold = {threshold}\n',
                    encoding="utf-8")
    return path


def test_a_calibrated_profile_is_its_judge_at_a_threshold_with_the_judges_own_cache_keys(tmp_path: Path) -> None:
    profile = calibrated_profile(tmp_path, f"vote:scripted:{RULES},scripted:{RULES}")
    seen: list[str] = []

    def wrap(leaf: Backend) -> Backend:
        seen.append(leaf.name)
        return leaf

    judge = resolve_judge(str(profile), wrap=wrap)
    member = ScriptedBackend.from_file(RULES).name
    assert judge.name == f"vote:{member},{member}+unsupported>=0.4" and judge.capabilities.claim_threshold == 0.4
    assert seen == [member, member]  # the cache and the budget wrap the members, whose calls are unchanged
    assert judge_stack(str(profile)).capabilities.claim_threshold == 0.4  # forwarded by the stack's wrappers
    assert resolve_judge(f"scripted:{RULES}").capabilities.claim_threshold is None


def test_a_calibrated_profile_is_refused_where_it_cannot_act(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="names a judge and a claim_threshold"):
        JudgeProfile(name="x", kind="calibrated", judge="gpt-4o-mini")
    with pytest.raises(ValueError, match="belong to calibrated profiles"):
        JudgeProfile(name="x", model="gpt-4o-mini", claim_threshold=0.5)
    with pytest.raises(ValueError):
        JudgeProfile(name="x", kind="calibrated", judge="gpt-4o-mini", claim_threshold=1.5)
    inner = calibrated_profile(tmp_path, f"scripted:{RULES}", name="inner")
    for judge, why in (
        ("embedded", "claim_thresholds"),
        (f"cascade:scripted:{RULES}@0.9,scripted:{RULES}", "stage that settled each claim"),
        (str(inner), "itself a calibrated profile"),
    ):
        with pytest.raises(JudgeConfigError, match=why):
            resolve_judge(str(calibrated_profile(tmp_path, judge, name="outer")))
    with pytest.raises(JudgeConfigError, match="cannot be a stage of a cascade or a member of a vote"):
        resolve_judge(f"vote:{inner},scripted:{RULES}")
    with pytest.raises(JudgeConfigError, match="--method direct judges no claim"):
        check_judge_serves(resolve_judge(str(inner)), AuditOptions(method="direct"))
