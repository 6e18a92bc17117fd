"""Anthropic's prompt cache: explicit ``cache_control`` breakpoints on what a sample's calls share.

Anthropic caches a prompt's prefix only up to a block marked ``"cache_control": {"type": "ephemeral"}``
(reads at 0.1x the input price, writes at 1.25x). rt4chart's prompts put what the calls of one sample
share first: the system message, then the user message's instructions and its first data block (the
context window, or the full context of the global stage; :func:`rt4chart.method.prompts.delimit`
wraps every value in ``<data-H>`` lines). What differs between the calls (the question, the location
hint, the claims) comes after it. The user message is therefore sent as two text blocks: the shared
head, marked, then the rest, unmarked, so the claims never sit inside the cached prefix. The system
message is marked as well: it is shared by every call of a task, across samples. A prompt shorter
than the model's minimum cacheable length is simply not cached (Anthropic charges no write for it).

Both ways of calling an Anthropic judge send these blocks: the Message Batches sender
(:mod:`rt4chart.judges.anthropic_batch`) as the request's ``system`` and ``messages``, and the online
litellm sender as OpenAI-style content lists, which litellm hands to Anthropic with their
``cache_control`` unchanged.
"""

from __future__ import annotations

import re
from typing import Any

CACHE_CONTROL = {"type": "ephemeral"}
"""The breakpoint Anthropic caches a prompt's prefix up to (five minutes, refreshed on each read)."""

CACHE_READ_FACTOR = 0.1
"""Anthropic's price of a prompt token read from its cache, as a share of the input price."""

CACHE_WRITE_FACTOR = 1.25
"""Anthropic's price of a prompt token written to its cache, as a share of the input price."""

_FIRST_DATA_BLOCK_END = re.compile(r"\n</data-[0-9a-f]{16}>\n?")
"""The closing line of a prompt's first delimited value (:func:`rt4chart.method.prompts.delimit`)."""


def split_shared_head(text: str) -> tuple[str, str]:
    """``text`` (a user message) cut after its first data block: the shared head (instructions and
    the context) and the rest (question, hint, claims). A message without a data block is all head."""
    found = _FIRST_DATA_BLOCK_END.search(text)
    if found is None:
        return text, ""
    return text[: found.end()], text[found.end() :]


def cache_marked_messages(messages: list[dict[str, str]]) -> list[dict[str, Any]]:
    """``messages`` with content blocks: the system message and the head of the first user message
    marked with :data:`CACHE_CONTROL`, the rest of that message in an unmarked block after it. Later
    turns (a re-ask's reply and reason) are left as they are: the prefix they extend is cached."""
    marked: list[dict[str, Any]] = []
    first_user = True
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "system":
            block = {"type": "text", "text": content, "cache_control": CACHE_CONTROL}
            marked.append({"role": role, "content": [block]})
        elif role == "user" and first_user:
            first_user = False
            head, rest = split_shared_head(content)
            blocks: list[dict[str, Any]] = [{"type": "text", "text": head, "cache_control": CACHE_CONTROL}]
            if rest:
                blocks.append({"type": "text", "text": rest})
            marked.append({"role": role, "content": blocks})
        else:
            marked.append(dict(message))
    return marked
