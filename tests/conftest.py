"""Shared fixtures: one real llama.cpp server per test session, and judge requests rendered from
the shipped prompts by the task registry, exactly as the pipeline renders them."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

# Test modules import litellm directly; without this it would fetch its price list from the network.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import pytest

from rt4chart.backends.base import GenerationParams, JudgeRequest
from rt4chart.serve import LocalServer, start_server
from rt4chart.tasks import DecomposeInput, VerifyInput, build_request, load_prompts
from rt4chart.text import segment_context
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


@pytest.fixture(scope="session")
def llamacpp() -> Iterator[LocalServer]:
    """llama.cpp serving SmolLM2-135M-Instruct on 127.0.0.1 for the whole session.

    One decoding thread: ggml's threads spin while waiting, and on a 2-core CI runner that is
    also running pytest, two threads decode many times slower than one.
    """
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
