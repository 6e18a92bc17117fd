"""Context sentences packed, whole and in order, into the windows a verifier reads (a pair classifier's
token windows, a chat verifier's chunks within its server's context length)."""

from __future__ import annotations

from collections.abc import Callable


def pack_sentences(sentences: list[str], budget: int, size: Callable[[str], int]) -> list[tuple[int, ...]]:
    """``sentences`` packed, whole and in order, into chunks whose text joined by spaces measures at most
    ``budget`` by ``size``; a sentence that alone exceeds it is a chunk of its own (cut by the caller)."""
    chunks: list[tuple[int, ...]] = []
    members: list[int] = []
    used = 0
    for position, sentence in enumerate(sentences):
        measured = size(sentence) + (1 if members else 0)  # the space joining it to the chunk
        if members and used + measured > budget:
            chunks.append(tuple(members))
            members, used, measured = [], 0, measured - 1
        members.append(position)
        used += measured
    if members:
        chunks.append(tuple(members))
    return chunks
