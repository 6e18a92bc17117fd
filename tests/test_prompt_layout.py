"""Prompts laid out for prefix caches: a sample's verification calls share everything up to the end of
the context (instructions, then the context), and what differs between them (what the context is,
the location hint, the claims with their first-pass labels) comes after it, the claims last."""

from __future__ import annotations

import pytest

from rt4chart.method.tasks import VerifyInput, build_request, load_prompts, render_claims, render_context
from rt4chart.method.text import segment_context
from rt4chart.protocol import GenerationParams, JudgeRequest
from rt4chart.types import Label, Sample

CLAIMS = ["The trial lasts 14 days.", "The trial is free."]


def sent_text(request: JudgeRequest) -> str:
    """The request's messages as a server's prefix cache sees them: in order, role by role."""
    return "".join(f"<{message.role}>{message.content}" for message in request.messages)


def shared_prefix(first: str, second: str) -> int:
    length = 0
    for one, other in zip(first, second, strict=False):
        if one != other:
            break
        length += 1
    return length


@pytest.fixture
def requests(free_trial: Sample) -> dict[str, JudgeRequest]:
    """One sample's local call and its global calls (no hint, and with the deciding window as hint),
    over a context that is one window, so the local call sees all of it."""
    _, sentences = segment_context(free_trial.context)
    prompts, params = load_prompts(), GenerationParams(max_tokens=512)
    labels: list[Label | None] = [Label.BASELESS, Label.ENTAILED]
    shared = {"claims": CLAIMS, "sentences": sentences, "question": free_trial.question}
    payloads = {
        "local": VerifyInput(stage="local", chunk=0, **shared),
        "global": VerifyInput(stage="global", local_labels=labels, **shared),
        "global with hint": VerifyInput(stage="global", local_labels=labels, hint=[s.index for s in sentences[:2]],
                                        **shared),
    }
    return {name: build_request(payload, prompts, params) for name, payload in payloads.items()}


def test_a_samples_verification_calls_share_their_prefix_through_the_whole_context(
    requests: dict[str, JudgeRequest]
) -> None:
    texts = {name: sent_text(request) for name, request in requests.items()}
    local = requests["local"].payload
    assert isinstance(local, VerifyInput)
    context = render_context(local.sentences)
    end_of_context = texts["local"].index(context) + len(context)
    for name in ("global", "global with hint"):
        assert shared_prefix(texts["local"], texts[name]) >= end_of_context, f"{name} shares the local call's prefix"


def test_the_claims_come_last_in_every_verification_prompt(requests: dict[str, JudgeRequest]) -> None:
    for name, request in requests.items():
        payload = request.payload
        assert isinstance(payload, VerifyInput)
        claims = render_claims(payload.claims, payload.local_labels)
        content = request.messages[-1].content
        after = content[content.rindex(claims) + len(claims) :].strip()
        # Only the closing line of the claims' data block follows them (prompts.py fences each value).
        assert content.index(render_context(payload.sentences)) < content.rindex(claims), name
        assert after.startswith("</data-") and "\n" not in after, f"{name}: the claims last"
