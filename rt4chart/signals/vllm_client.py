"""Teacher-forced log-probabilities from a server speaking vLLM's completions protocol.

vLLM's OpenAI-compatible ``POST /v1/completions`` accepts ``prompt_logprobs=N`` (a vLLM extension)
and answers, per choice, ``prompt_logprobs``: a list with one entry per prompt token, ``null`` for
the first, otherwise an object keyed by token id (a string in JSON) whose values are
``{"logprob": float, "rank": int, "decoded_token": str}``; it always holds the prompt's own token
plus the N most likely others (vLLM's ``PromptLogprobs = list[dict[int, Logprob] | None]``). CSR
needs only the prompt's own tokens, so the client asks ``prompt_logprobs=0`` and ``max_tokens=1``.

Prompts are sent as token ids (the completions API accepts a list of id lists, one choice each,
matched back by ``index``), tokenized locally by the model's own tokenizer: both paths then score
exactly the same tokens, and the offsets come from the local fast tokenizer. The server must
serve the same model as the tokenizer; its identity in records and cache keys is
``vllm:<served model>@<base URL>`` plus the tokenizer's content hash.

llama.cpp's server (``rt4 serve``, xllamacpp) cannot be this server: it returns log-probabilities
of generated tokens only and rejects ``echo`` (llama.cpp issue #27174, PRs #15189 and #17935
unmerged). The tests run this client against ``tests/prompt_logprobs_server.py``, a small server
that answers vLLM's format from the transformers backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from rt4chart.signals.base import ScoreRequest, SignalError, TokenizedText, Tokenizer

REQUESTS_PER_CALL = 16
"""Prompts sent in one HTTP request (the server batches them)."""


class VllmPromptLogprobsBackend:
    """A vLLM (or vLLM-compatible) server as a :class:`~rt4chart.signals.base.LogprobBackend`."""

    def __init__(
        self,
        base_url: str,
        tokenizer: Tokenizer,
        tokenizer_identity: str,
        *,
        model: str | None = None,
        max_positions: int | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.tokenizer = tokenizer
        self._client = httpx.Client(timeout=timeout_s)
        self.model = model or self._served_model()
        self._identity = f"vllm:{self.model}@{self.base_url}#{tokenizer_identity}"
        self._max_positions = max_positions

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def max_positions(self) -> int | None:
        return self._max_positions

    def encode(self, text: str) -> TokenizedText:
        return self.tokenizer.encode(text)

    def _served_model(self) -> str:
        body = self._call("GET", "/models")
        try:
            return str(body["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise SignalError(f"{self.base_url}/models lists no model") from None

    def _call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        try:
            response = self._client.request(method, self.base_url + path, json=payload)
            response.raise_for_status()
            return response.json()
        except httpx.HTTPStatusError as error:
            raise SignalError(f"{self.base_url}{path} answered {error.response.status_code}") from None
        except (httpx.HTTPError, ValueError) as error:
            raise SignalError(f"{self.base_url}{path}: {type(error).__name__}: {error}") from None

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        results: list[list[float]] = []
        for begin in range(0, len(requests), REQUESTS_PER_CALL):
            group = requests[begin : begin + REQUESTS_PER_CALL]
            body = self._call(
                "POST",
                "/completions",
                {
                    "model": self.model,
                    "prompt": [request.ids for request in group],
                    "max_tokens": 1,
                    "temperature": 0.0,
                    "prompt_logprobs": 0,
                },
            )
            results.extend(parse_prompt_logprobs(body, group))
        return results


def parse_prompt_logprobs(body: Any, requests: Sequence[ScoreRequest]) -> list[list[float]]:
    """Each request's scored tokens' log-probabilities from a completions response."""
    try:
        choices = sorted(body["choices"], key=lambda choice: int(choice["index"]))
    except (KeyError, TypeError, ValueError):
        raise SignalError("the server's reply has no indexed choices") from None
    if len(choices) != len(requests):
        raise SignalError(f"the server returned {len(choices)} choices for {len(requests)} prompts")
    results = []
    for choice, request in zip(choices, requests, strict=True):
        entries = choice.get("prompt_logprobs")
        if not isinstance(entries, list) or len(entries) != len(request.ids):
            raise SignalError("the server's reply lacks prompt_logprobs for every prompt token (is it vLLM?)")
        values = []
        for position in range(request.first, len(request.ids)):
            entry = entries[position]
            token = str(request.ids[position])
            if not isinstance(entry, dict) or token not in entry:
                raise SignalError(f"prompt_logprobs has no value for token {token} at position {position}")
            values.append(float(entry[token]["logprob"]))
        results.append(values)
    return results
