"""The verdict in a judge's reply text, and how a reply that holds none is asked again.

The verdict comes only from a reply object that validates against the request's pydantic schema:
the last such object of the reply that is not copied from the prompt. Text around it (prose, code
fences, ``<think>`` blocks) is stripped, and a model's separate reasoning is never read, so a
verdict-shaped string that a model merely thinks about, or quotes from the answer or context under
audit, is never taken as the verdict.

One reply model is read otherwise: :class:`FirstTokenChoices`, a one-token answer (a verifier's Yes or
No) whose verdict is the first token's log probabilities, which the senders ask for and hand over
(:func:`first_token_candidates`) and :func:`parse_first_token` checks.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import BaseModel, Field, ValidationError

from rt4chart.protocol import Message

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
REPLY_LIMIT = 500
"""Characters of a validation error quoted back to a model (and into errors)."""


_OBJECT_START = re.compile(r'\{\s*["}]')
"""Where a JSON object can start: a brace, then a key's quote or the closing brace. Braces of prose
and of template placeholders are passed over without a decoding attempt (each failed one raises)."""


def _json_objects(text: str, *, nested: bool) -> list[str]:
    """Complete JSON objects in ``text`` in order: top-level ones, or with ``nested`` every one."""
    decoder = json.JSONDecoder()
    found: list[str] = []
    resume = 0  # top-level objects only: no start inside the last one found
    for start in _OBJECT_START.finditer(text):
        position = start.start()
        if position < resume:
            continue
        try:
            _, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            continue
        found.append(text[position:end])
        if not nested:
            resume = end
    return found


def _canonical(candidate: str) -> str:
    return json.dumps(json.loads(candidate), sort_keys=True, ensure_ascii=False)


@functools.lru_cache(maxsize=32)
def _quoted_objects(part: str) -> frozenset[str]:
    """The canonical forms of every JSON object in one prompt text. Cached: the calls of a run share
    their instructions (and a sample's calls its context), and the search decodes every brace."""
    return frozenset(_canonical(found) for found in _json_objects(part, nested=True))


def _json_candidates(text: str) -> list[str]:
    """Complete top-level JSON objects in ``text``, outside ``<think>`` blocks, in order.

    Code fences are not special: a fenced object is found where it stands, so a verdict the model
    merely quotes (from the answer under audit) before its own does not win by being fenced.
    """
    if "</think>" in text.lower():
        # Some chat templates open the think block in the prompt, so only its end is in the reply.
        text = re.split(r"</think>", _THINK_BLOCK.sub("", text), flags=re.IGNORECASE)[-1]
    return _json_objects(text, nested=False)


def parse_reply(
    text: str, schema: type[BaseModel], prompt: Iterable[str] = ()
) -> tuple[BaseModel | None, str | None]:
    """The model's own verdict in a reply, or why there is none.

    The verdict is the last complete schema-valid object of the reply (a model that restates or
    quotes objects before answering puts its answer last), skipping any object that occurs in
    ``prompt`` (the texts of the request's messages): an object copied from the prompt, such as
    the template's example or a verdict planted in the text under audit, is not the model's own.
    """
    candidates = _json_candidates(text)
    if not candidates:
        return None, "the reply holds no JSON object"
    # The prompt is searched only once a candidate validates: a reply with none needs no search.
    quoted: frozenset[str] | None = None
    first_error: ValidationError | None = None  # the earliest candidate's, the one the reason quotes
    copied = 0
    for candidate in reversed(candidates):
        try:
            parsed = schema.model_validate_json(candidate)
        except ValidationError as error:
            first_error = error
            continue
        if quoted is None:
            quoted = frozenset().union(*(_quoted_objects(part) for part in prompt))
        if quoted and _canonical(candidate) in quoted:
            copied += 1
            continue
        return parsed, None
    if copied:
        return None, f"the reply only repeats {schema.__name__} objects of the prompt"
    assert first_error is not None  # every candidate failed validation
    return None, f"the reply does not match the {schema.__name__} schema: {str(first_error)[:REPLY_LIMIT]}"


class TokenLogprob(BaseModel):
    """One candidate for a completion token, with its log probability."""

    token: str
    """The token as the server decodes it."""
    logprob: float = Field(le=0.0)
    """Its natural-log probability."""


class FirstTokenChoices(BaseModel):
    """A one-token reply read from its log probabilities, not its text: the reply model of a request
    whose verdict is the distribution of the first completion token (a verifier that answers Yes or No,
    such as Bespoke-MiniCheck). A request with this reply model is sent asking for ``logprobs`` and no
    ``response_format`` (the reply is a bare token); every other request is read as JSON."""

    TOP_LOGPROBS: ClassVar[int] = 5
    """Candidates asked for the first token (``top_logprobs``; MiniCheck's authors ask 5)."""
    NEEDS_LOGPROBS: ClassVar[bool] = True
    """Whether a reply without log probabilities is unusable; a model whose text also states its verdict
    (Granite Guardian's ``<score>`` tag) reads the text instead."""

    text: str
    """The reply's text (the sampled token)."""
    top_logprobs: list[TokenLogprob] = Field(min_length=1)
    """The first token's most likely candidates, most likely first."""


def reads_logprobs(schema: type[BaseModel]) -> bool:
    """Whether a request with reply model ``schema`` is read from the first token's log probabilities."""
    return issubclass(schema, FirstTokenChoices)


def first_token_candidates(logprobs: Any, schema: type[BaseModel]) -> list[dict[str, object]] | None:
    """The first token's ``top_logprobs`` of a choice's ``logprobs`` (OpenAI's and vLLM's shape:
    ``{"content": [{"token", "logprob", "top_logprobs": [{"token", "logprob"}, ...]}, ...]}``) when a
    request with reply model ``schema`` asked for them; ``None`` when it did not or the choice holds
    none (what they hold is checked where the reply is read, :func:`parse_first_token`)."""
    if not reads_logprobs(schema):
        return None
    if isinstance(logprobs, BaseModel):  # litellm's response objects
        logprobs = logprobs.model_dump()
    try:
        candidates = logprobs["content"][0]["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        return None
    return list(candidates) if isinstance(candidates, list) else None


def parse_first_token(
    text: str, top_logprobs: list[dict[str, object]] | None, schema: type[BaseModel]
) -> tuple[BaseModel | None, str | None]:
    """The first token's candidates as ``schema`` (a :class:`FirstTokenChoices`), or why there are none."""
    needs_logprobs = issubclass(schema, FirstTokenChoices) and schema.NEEDS_LOGPROBS
    if not top_logprobs and needs_logprobs:
        return None, "the reply holds no log probabilities (does the server return logprobs?)"
    try:
        return schema.model_validate({"text": text, "top_logprobs": top_logprobs or []}), None
    except ValidationError as error:
        return None, f"the reply is not usable: {str(error)[:REPLY_LIMIT]}"


_TEMPLATE_TOKENS_PER_MESSAGE = 16
"""Tokens a chat template may add around one message (role markers, separators): generous."""

REASK_TOKENS = 4 * (REPLY_LIMIT + 300) + 2 * _TEMPLATE_TOKENS_PER_MESSAGE
"""Bound on what a re-ask adds besides the bad reply: its instruction and the reason (UTF-8 bytes)."""


def prompt_token_bound(messages: Iterable[Message]) -> int:
    """Prompt tokens no tokenizer can exceed: the UTF-8 bytes of the messages (every byte-level BPE
    or byte-fallback token holds at least one byte) plus the chat template's tokens."""
    bound = _TEMPLATE_TOKENS_PER_MESSAGE
    for message in messages:
        bound += len(message.content.encode("utf-8")) + _TEMPLATE_TOKENS_PER_MESSAGE
    return bound


def reask_messages(original: list[Message], raw: str, reason: str) -> list[dict[str, str]]:
    """The original prompt, the bad reply, and what was wrong with it."""
    return [m.model_dump() for m in original] + [
        {"role": "assistant", "content": raw[:4000]},
        {
            "role": "user",
            "content": (
                f"Your reply could not be used: {reason[:REPLY_LIMIT]}. Reply again with only "
                "the JSON object of the requested shape, nothing before or after it."
            ),
        },
    ]
