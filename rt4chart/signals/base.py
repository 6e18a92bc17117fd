"""The contract of the signals layer: what a model must offer so that token signals can be computed.

A signal backend tokenizes text with character offsets and returns teacher-forced log-probabilities:
for a token sequence and a first target position ``first``, the list
``[log p(ids[j] | ids[:j]) for j in range(first, len(ids))]``. Two backends implement it: an
in-process Hugging Face transformers model (:mod:`rt4chart.signals.transformers_backend`) and a
client of a server that speaks vLLM's completions protocol with ``prompt_logprobs``
(:mod:`rt4chart.signals.vllm_client`). Signals (:mod:`rt4chart.signals.csr`) are computed from
this contract alone, so they are the same whichever backend answers.

This module imports neither torch nor transformers: the CLI reads it to explain a missing extra.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

EXTRA_MODULES = ("torch", "transformers")
"""What the ``signals`` extra provides for any model."""
GGUF_MODULES = ("gguf", "accelerate")
"""Also in the extra, needed only to load a GGUF file (transformers requires both for that)."""


class SignalError(RuntimeError):
    """A signal cannot be computed: a missing extra, an unreadable model, a bad server reply."""


def missing_extra(model_path: Path | None = None) -> list[str]:
    """Modules of the ``signals`` extra that are not installed (GGUF readers only for a GGUF model)."""
    needed = list(EXTRA_MODULES)
    if model_path is not None and model_path.suffix == ".gguf":
        needed.extend(GGUF_MODULES)
    return [name for name in needed if importlib.util.find_spec(name) is None]


@dataclass(frozen=True)
class TokenizedText:
    """Token ids of a text with each token's character range in it (end exclusive)."""

    ids: list[int]
    offsets: list[tuple[int, int]]


@dataclass(frozen=True)
class ScoreRequest:
    """One teacher-forced sequence: score ``ids[first:]``, each given everything before it."""

    ids: list[int]
    first: int


class Tokenizer(Protocol):
    """Turns text into token ids with offsets (a fast tokenizer's offset mapping)."""

    def encode(self, text: str) -> TokenizedText: ...


class LogprobBackend(Tokenizer, Protocol):
    """A model that returns teacher-forced log-probabilities of given tokens."""

    @property
    def identity(self) -> str:
        """Model identity for records and cache keys: name plus a hash of the weights or server."""
        ...

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the model accepts, when known."""
        ...

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        """Per request, ``log p(ids[j] | ids[:j])`` for ``j`` from ``first`` to the end."""
        ...
