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

import asyncio
import json
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from rt4chart.judges.bounded_http import ReplyLimits, ReplyRefused
from rt4chart.judges.bounded_httpx import BoundedAsyncTransport
from rt4chart.signals.base import ScoreRequest, SignalError, TokenizedText, Tokenizer

REQUESTS_PER_CALL = 16
"""Prompts sent in one HTTP request (the server batches them)."""

REPLY_BYTES_PER_PROMPT_TOKEN = 1024
"""Reply bytes one prompt token may take (its entry: the token's own log-probability and the most
likely one's, each with its decoded text); a longer reply is no vLLM answer and is not read."""

REPLY_SLACK_BYTES = 65_536
"""Reply bytes beyond the prompt tokens' entries (the choices' other fields), and the cap of ``/models``."""


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
        self._timeout_s = timeout_s
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
        body = self._call("GET", "/models", None, REPLY_SLACK_BYTES)
        try:
            return str(body["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise SignalError(f"{self.base_url}/models lists no model") from None

    def _call(self, method: str, path: str, payload: dict[str, Any] | None, max_bytes: int) -> Any:
        """One request, its reply read under the reply contract (:mod:`rt4chart.judges.bounded_http`):
        at most ``max_bytes`` decoded, the whole exchange within ``timeout_s``, no redirect to
        another origin. Sent from a thread of its own with its own event loop, so a caller inside a
        running loop (a notebook) can call it too."""
        limits = ReplyLimits(max_bytes=max_bytes, deadline_s=self._timeout_s)
        with ThreadPoolExecutor(max_workers=1) as worker:
            return worker.submit(asyncio.run, self._request(method, path, payload, limits)).result()

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None, limits: ReplyLimits) -> Any:
        transport = BoundedAsyncTransport(httpx.AsyncHTTPTransport(), limits)
        try:
            async with httpx.AsyncClient(transport=transport, timeout=self._timeout_s, follow_redirects=True) as client:
                response = await client.request(method, self.base_url + path, json=payload)
            response.raise_for_status()
            return json.loads(response.content)
        except httpx.HTTPStatusError as error:
            raise SignalError(f"{self.base_url}{path} answered {error.response.status_code}") from None
        except ReplyRefused as error:
            raise SignalError(f"{self.base_url}{path}: {error}") from None
        except (httpx.HTTPError, ValueError) as error:
            raise SignalError(f"{self.base_url}{path}: {type(error).__name__}: {error}") from None

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        results: list[list[float]] = []
        for begin in range(0, len(requests), REQUESTS_PER_CALL):
            group = requests[begin : begin + REQUESTS_PER_CALL]
            payload = {
                "model": self.model,
                "prompt": [request.ids for request in group],
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 0,
            }
            cap = REPLY_SLACK_BYTES + REPLY_BYTES_PER_PROMPT_TOKEN * sum(len(request.ids) for request in group)
            results.extend(parse_prompt_logprobs(self._call("POST", "/completions", payload, cap), group))
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
            values.append(_logprob(entry[token], token, position))
        results.append(values)
    return results


def _logprob(value: Any, token: str, position: int) -> float:
    """The log-probability in a prompt_logprobs value (``{"logprob": float, ...}``), or a
    :class:`SignalError` naming the token: a value of another shape, or one that is no log-probability
    (NaN, +inf), would otherwise crash the run or be read as a score."""
    logprob = value.get("logprob") if isinstance(value, dict) else None
    if isinstance(logprob, bool) or not isinstance(logprob, int | float):
        raise SignalError(
            f"prompt_logprobs for token {token} at position {position} is not an object with a numeric logprob: "
            f"{json.dumps(value)[:200]}"
        )
    if math.isnan(logprob) or logprob == math.inf:
        raise SignalError(f"prompt_logprobs for token {token} at position {position} is {logprob}: no log-probability")
    return float(logprob)
