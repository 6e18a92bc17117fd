"""The scrubber's fast path: :func:`might_hold_secret` says ``False`` only for text that the full
scrub leaves as it is, over texts built to come close (fragments of the secret, marks, escapes)."""

from __future__ import annotations

import json
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rt4chart import scrubbing
from rt4chart.scrubbing import fragment_length, might_hold_secret, scrub

KEY_CHARACTERS = string.ascii_letters + string.digits + "-_/"
secrets = st.text(alphabet=KEY_CHARACTERS, min_size=1, max_size=48)
noise = st.text(alphabet=string.ascii_letters + string.digits + " _-:/=?&@\\\"'.", max_size=60)


def full_scrub(text: str, secret: str) -> str:
    """:func:`scrub` with its fast path turned off: every pass runs."""
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(scrubbing, "might_hold_secret", lambda text, secrets: True)
        return scrub(text, (secret,))


@settings(max_examples=400, deadline=None)
@given(secret=secrets, before=noise, after=noise, start=st.integers(0, 47), extra=st.integers(0, 47),
       planted=st.booleans())
def test_a_text_the_fast_path_lets_through_is_one_the_full_scrub_leaves_alone(
    secret: str, before: str, after: str, start: int, extra: int, planted: bool
) -> None:
    size = fragment_length(secret)
    start = min(start, len(secret) - size)
    # A run of the secret at least a fragment long (what the scrub removes), or noise alone.
    text = before + (secret[start : start + size + extra] if planted else "") + after
    if planted:
        assert might_hold_secret(text, (secret,))
    if not might_hold_secret(text, (secret,)):
        assert full_scrub(text, secret) == text


def test_every_form_the_scrub_removes_is_caught_by_the_fast_path() -> None:
    secret = "sk-proj-Z9y8X7w6V5u4T3s2R1q0"
    forms = [
        f"the key is {secret}",
        '{"rationale": "' + "".join(f"\\u{ord(c):04x}" for c in secret) + '"}',  # as a model escapes it
        f"first half {secret[:12]} and later {secret[12:]}",
        "Authorization: Bearer abc.def-ghi",
        "x-api-key: zzzzzz",
        "https://user:hunter2@example.org/v1",
        "https://example.org/v1?token=abc123",
    ]
    for text in forms:
        assert full_scrub(text, secret) != text, text
        assert might_hold_secret(text, (secret,)), text
        assert scrub(text, (secret,)) == full_scrub(text, secret)
    plain = json.dumps({"judgements": [{"claim": 0, "label": "baseless", "rationale": "not in the context"}]})
    assert not might_hold_secret(plain, (secret,))
    assert scrub(plain, (secret,)) == plain
