"""A real OpenAI-compatible chat-completions server on 127.0.0.1 that misbehaves on purpose.

Each request is answered by the next :class:`Fault` of the script (then by ``default``), so a test
says exactly which failures a client meets, in which order. The server records every request and
the largest number of requests it held at once, so retries and concurrency limits can be checked
from the server's side of the wire.
"""

from __future__ import annotations

import functools
import json
import math
import re
import socket
import struct
import sys
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

Behaviour = Literal[
    "ok",  # the reply as plain content
    "rate_limit",  # 429 with a Retry-After header (and what a RateLimit sends, when it refused)
    "server_error",  # 500
    "hang",  # no answer for `hang_s` seconds (the client should time out first)
    "drop",  # close the connection without answering
    "invalid_json",  # 200 with content that is not JSON
    "prose",  # the reply wrapped in prose
    "fence",  # the reply in a ```json code fence
    "think",  # a <think>...</think> block (holding a decoy verdict) before the reply
    "reasoning",  # the reply with a `reasoning_content` field holding a decoy verdict
    "echo_key",  # 401 whose message echoes the Authorization header, as some providers do
    "gzip_bomb",  # 200, Content-Encoding gzip: about 1 MB that inflates to GZIP_BOMB_BYTES
    "endless_body",  # 200, chunked: the start of a completion, then spaces that never end
    "trickle_headers",  # a status line, then one header byte every `trickle_s`, never ending
    "trickle_body",  # headers promising a large body, then one byte of it every `trickle_s`
    "redirect",  # 307 to `location` (a path of this server, or another server's URL)
    "nan_logprobs",  # /completions: prompt_logprobs whose values are NaN
    "bare_logprobs",  # /completions: prompt_logprobs entries holding a bare number, not an object
]

GZIP_BOMB_BYTES = 1 << 30
"""What the ``gzip_bomb`` reply inflates to: 1 GiB of zeros from about 1 MB on the wire."""

DECOY = '{"judgements": [{"claim": 0, "label": "contradicted"}]}'
"""A verdict-shaped string placed where a verdict must never be taken from."""


@dataclass
class Fault:
    """How to answer one request."""

    behaviour: Behaviour = "ok"
    """What the server does."""
    retry_after_s: int = 0
    """Retry-After header value for ``rate_limit``."""
    hang_s: float = 5.0
    """How long ``hang`` keeps the client waiting."""
    trickle_s: float = 0.2
    """Seconds between the bytes of ``trickle_headers`` and ``trickle_body``."""
    location: str = ""
    """Where ``redirect`` sends the client."""


@dataclass
class RateLimit:
    """A provider's rate limit, enforced per fixed window as OpenAI documents it: a request is
    admitted while its window has a request left and room for its prompt tokens plus its
    ``max_tokens``; else 429 with ``Retry-After`` (whole seconds), ``retry-after-ms`` and the
    ``x-ratelimit-*`` headers that every answer carries."""

    requests: int
    """Requests admitted per window."""
    tokens: int
    """Tokens (prompt + ``max_tokens``) admitted per window."""
    window_s: float = 60.0
    """The window's length (a minute at a provider; shorter in tests)."""
    started: float = field(default_factory=time.monotonic)
    """When the first window began."""
    window: int = 0
    """The current window's number."""
    requests_used: int = 0
    """Requests admitted in the current window."""
    tokens_used: int = 0
    """Tokens admitted in the current window."""
    admitted: int = 0
    """Requests admitted, all windows together."""
    tokens_admitted: int = 0
    """Tokens admitted, all windows together."""
    refused: int = 0
    """Requests answered with 429, all windows together."""
    admitted_per_window: dict[int, int] = field(default_factory=dict)
    """Requests admitted in each window, by window number."""

    def admit(self, tokens: int) -> tuple[bool, dict[str, str]]:
        """Whether a request of ``tokens`` is admitted now, and the rate-limit headers of its answer."""
        elapsed = time.monotonic() - self.started
        window = int(elapsed // self.window_s)
        if window != self.window:
            self.window, self.requests_used, self.tokens_used = window, 0, 0
        reset_s = (window + 1) * self.window_s - elapsed
        admitted = self.requests_used < self.requests and self.tokens_used + tokens <= self.tokens
        if admitted:
            self.requests_used += 1
            self.tokens_used += tokens
            self.admitted += 1
            self.tokens_admitted += tokens
            self.admitted_per_window[window] = self.admitted_per_window.get(window, 0) + 1
        else:
            self.refused += 1
        reset = f"{round(reset_s * 1000)}ms"
        headers = {
            "x-ratelimit-limit-requests": str(self.requests),
            "x-ratelimit-limit-tokens": str(self.tokens),
            "x-ratelimit-remaining-requests": str(self.requests - self.requests_used),
            "x-ratelimit-remaining-tokens": str(self.tokens - self.tokens_used),
            "x-ratelimit-reset-requests": reset,
            "x-ratelimit-reset-tokens": reset,
        }
        if not admitted:
            headers |= {"Retry-After": str(math.ceil(reset_s)), "retry-after-ms": str(round(reset_s * 1000))}
        return admitted, headers


@dataclass
class FaultServer:
    """State shared with the handler threads."""

    reply: str | Callable[[dict[str, Any]], str]
    """The valid JSON content every non-failing answer carries, or a function of the request body
    that writes it."""
    script: deque[Fault] = field(default_factory=deque)
    """Faults for the next requests, in order."""
    default: Fault = field(default_factory=Fault)
    """Answer once the script is used up."""
    latency_s: float = 0.0
    """Delay before every answer (makes concurrent requests overlap)."""
    prompt_tokens: Callable[[dict[str, Any]], int] = lambda body: 50
    """The prompt tokens a reply reports, as a function of the request body."""
    cached_tokens: Callable[[dict[str, Any]], int] = lambda body: 0
    """Of the prompt tokens, those a reply reports read from a prompt cache
    (``usage.prompt_tokens_details.cached_tokens``; 0: the field is left out)."""
    completion_tokens: int | Callable[[str], int] = 20
    """The completion tokens a reply reports (at most the request's ``max_tokens``), or a function
    of the reply's content that counts them."""
    token_logprobs: Callable[[dict[str, Any]], dict[str, float]] | None = None
    """The first token's candidates (token -> log probability) that a request asking for ``logprobs``
    gets, as a function of its body, in OpenAI's ``choices[0].logprobs`` shape (the content is then the
    likeliest token); ``None``: no log probabilities in any reply, as from a server that offers none."""
    refused_formats: frozenset[str | None] = frozenset()
    """``response_format`` types (``json_schema``, ``json_object``; ``None``: a request without one)
    answered with 400, as by a server that does not offer that structured-output mode."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    """Bodies of the requests received, in arrival order."""
    headers: list[dict[str, str]] = field(default_factory=list)
    """Headers of the requests received (names in lower case)."""
    paths: list[str] = field(default_factory=list)
    """Paths of the requests received, in arrival order."""
    bytes_streamed: int = 0
    """Body bytes sent by ``endless_body`` and the trickles, all requests together."""
    stopped: threading.Event = field(default_factory=threading.Event)
    """Set when the server shuts down: replies that never end stop then."""
    in_flight: int = 0
    """Requests being answered now."""
    max_in_flight: int = 0
    """Most requests answered at once."""
    base_url: str = ""
    """``http://127.0.0.1:PORT/v1`` once started."""
    gate: threading.Event = field(default_factory=threading.Event)
    """Requests are answered only while it is set (it starts set); clearing it holds every answer
    until the test sets it again, so a client can be caught mid-run without timing guesses."""
    rate_limit: RateLimit | None = None
    """A requests- and tokens-per-window limit every request meets first (``None``: no limit)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_fault(self) -> Fault:
        with self.lock:
            return self.script.popleft() if self.script else self.default

    def content_for(self, behaviour: Behaviour, body: dict[str, Any]) -> str:
        reply = self.reply(body) if callable(self.reply) else self.reply
        if behaviour == "invalid_json":
            return "I think the claims are mostly fine, but I cannot say for sure."
        if behaviour == "prose":
            return f"Here is my verdict as requested:\n{reply}\nLet me know if you need more."
        if behaviour == "fence":
            return f"```json\n{reply}\n```"
        if behaviour == "think":
            return f"<think>At first I thought {DECOY} but no.</think>\n{reply}"
        return reply

    def usage(self, body: dict[str, Any], content: str) -> tuple[int, int]:
        """The prompt and completion tokens a reply of ``content`` to ``body`` reports."""
        counted = self.completion_tokens
        tokens = counted(content) if callable(counted) else counted
        return self.prompt_tokens(body), min(tokens, int(body.get("max_tokens") or tokens))

    def completion(self, body: dict[str, Any], behaviour: Behaviour = "ok") -> dict[str, Any]:
        """The chat completion a request ``body`` gets when it is answered (``behaviour``: a
        content variant such as ``ok``, ``prose`` or ``invalid_json``): what the server sends online,
        and what the Batch API stand-in (tests/batch_server.py) writes into its output file."""
        content = self.content_for(behaviour, body)
        usage = self.usage(body, content)
        logprobs = self.token_logprobs
        candidates = logprobs(body) if logprobs is not None and body.get("logprobs") is True else None
        return _completion(str(body.get("model", "fault")), content, None, usage, self.cached_tokens(body), candidates)


def _completion(
    model: str, content: str, reasoning: str | None, usage: tuple[int, int] = (50, 20), cached: int = 0,
    candidates: dict[str, float] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    counts: dict[str, Any] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    if cached:
        counts["prompt_tokens_details"] = {"cached_tokens": cached}
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop", "message": message}
    if candidates:
        ranked = sorted(candidates.items(), key=lambda item: -item[1])
        message["content"] = ranked[0][0]
        top = [{"token": token, "logprob": logprob, "bytes": list(token.encode())} for token, logprob in ranked]
        choice["logprobs"] = {"content": [{**top[0], "top_logprobs": top}]}
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": counts,
    }


def _prompt_logprobs(body: dict[str, Any], behaviour: Behaviour) -> dict[str, Any]:
    """A vLLM completions reply to ``body`` (prompts as token-id lists) with ``prompt_logprobs``:
    -1.0 for every token, or NaN values, or bare numbers in place of vLLM's objects."""
    value: Any
    choices = []
    for index, ids in enumerate(body.get("prompt") or []):
        entries: list[Any] = [None]
        for token in ids[1:]:
            if behaviour == "bare_logprobs":
                value = -1.0
            else:
                value = {"logprob": math.nan if behaviour == "nan_logprobs" else -1.0, "rank": 1, "decoded_token": "x"}
            entries.append({str(token): value})
        choices.append({"index": index, "text": "", "prompt_logprobs": entries})
    return {"id": "cmpl-fault", "object": "text_completion", "choices": choices}


@functools.cache
def gzip_bomb() -> bytes:
    """A gzip stream of :data:`GZIP_BOMB_BYTES` zeros, built from one compressed 16 MiB segment
    repeated (a full flush makes each segment independent), so it costs seconds, not minutes."""
    block = bytes(1 << 24)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    segment = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    count = GZIP_BOMB_BYTES // len(block)
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(block, crc)
    end = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS).flush()
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + segment * count + end + struct.pack("<II", crc, GZIP_BOMB_BYTES & 0xFFFFFFFF)


def _handler(state: FaultServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body leave in two writes; with Nagle's algorithm the body would wait for the
        # client's delayed ACK of the headers (tens of ms on every keep-alive response).
        disable_nagle_algorithm = True
        rate_headers: dict[str, str] = {}  # noqa: RUF012 (set per request, never mutated)
        """The rate limit's headers for the request being answered."""

        def log_message(self, format: str, *args: Any) -> None:
            """Keep test output quiet."""

        def _send(self, status: int, body: dict[str, Any], extra: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (self.rate_headers | (extra or {})).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            fault = state.next_fault()
            self.rate_headers = {}
            admitted = True
            with state.lock:
                if state.rate_limit is not None:
                    tokens = state.prompt_tokens(body) + int(body.get("max_tokens") or 0)
                    admitted, self.rate_headers = state.rate_limit.admit(tokens)
                    if not admitted:
                        fault = Fault("rate_limit")
                state.requests.append(body)
                state.paths.append(self.path)
                state.headers.append({name.lower(): value for name, value in self.headers.items()})
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                state.gate.wait()
                if admitted:  # a provider refuses over its limit at once
                    time.sleep(state.latency_s)
                self._answer(fault, body)
            finally:
                with state.lock:
                    state.in_flight -= 1

        def _answer(self, fault: Fault, body: dict[str, Any]) -> None:
            model = str(body.get("model", "fault"))
            behaviour = fault.behaviour
            if behaviour in _STREAMED:
                self._stream(fault)
            elif behaviour == "redirect":
                self.send_response(307)
                self.send_header("Location", fault.location)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif _vllm_completions(self.path):
                self._send(200, _prompt_logprobs(body, behaviour))
            elif (body.get("response_format") or {}).get("type") in state.refused_formats:
                error = {"error": {"message": "response_format is not supported", "type": "invalid_request_error"}}
                self._send(400, error)
            elif behaviour == "rate_limit":
                error = {"error": {"message": "rate limited", "type": "rate_limit_error"}}
                self._send(429, error, self.rate_headers or {"Retry-After": str(fault.retry_after_s)})
            elif behaviour == "server_error":
                self._send(500, {"error": {"message": "internal error", "type": "server_error"}})
            elif behaviour == "hang":
                time.sleep(fault.hang_s)
                self.close_connection = True
            elif behaviour == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            elif behaviour == "echo_key":
                header = self.headers.get("Authorization", "")
                message = f"Incorrect API key provided: {header}. You sent {header!r}."
                self._send(401, {"error": {"message": message, "type": "invalid_request_error"}})
            elif behaviour == "reasoning":
                reasoning = f"Maybe {DECOY}? Let me check."
                content = state.content_for(behaviour, body)
                self._send(200, _completion(model, content, reasoning, state.usage(body, content),
                                            state.cached_tokens(body)))
            else:
                self._send(200, state.completion(body, behaviour))

        def _stream(self, fault: Fault) -> None:
            """A reply too large, too slow or endless, until the client hangs up or the server stops."""
            self.close_connection = True
            try:
                if fault.behaviour == "gzip_bomb":
                    bomb = gzip_bomb()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(bomb)))
                    self.end_headers()
                    self.wfile.write(bomb)
                elif fault.behaviour == "trickle_headers":
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                    while not state.stopped.wait(fault.trickle_s):
                        self.wfile.write(b"a")
                        self._count(1)
                elif fault.behaviour == "trickle_body":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(1 << 30))
                    self.end_headers()
                    while not state.stopped.wait(fault.trickle_s):
                        self.wfile.write(b" ")
                        self._count(1)
                else:  # endless_body
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    chunk = b" " * 65_536
                    framed = b"%x\r\n%s\r\n" % (len(chunk), chunk)
                    opening = b'{"choices":[{"message":{"content":"'
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(opening), opening))
                    while not state.stopped.is_set():
                        self.wfile.write(framed)
                        self._count(len(chunk))
            except OSError:
                pass  # the client hung up: what these replies wait for

        def _count(self, sent: int) -> None:
            with state.lock:
                state.bytes_streamed += sent

    return Handler


_STREAMED = frozenset({"gzip_bomb", "endless_body", "trickle_headers", "trickle_body"})
"""Behaviours whose reply is written by ``_stream``."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 drops the SYNs of a burst of new connections, and each
    # dropped one is retried a full second later.
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out on a hung request resets the connection: expected, not news.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _vllm_completions(target: str) -> bool:
    """Whether a request target is vLLM's ``/completions`` (the prompt log-probs endpoint): by its
    path alone, so a client that appends ``chat/completions`` after a base URL's query string still
    reaches the chat reply, as it did before the server had a second endpoint."""
    path = urlsplit(target).path
    return path.endswith("/completions") and not path.endswith("/chat/completions")


@contextmanager
def fault_server(
    reply: str | Callable[[dict[str, Any]], str], *faults: Fault, default: Fault | None = None,
    token_logprobs: Callable[[dict[str, Any]], dict[str, float]] | None = None,
) -> Iterator[FaultServer]:
    """Serve on a free port of 127.0.0.1 until the block ends."""
    state = FaultServer(reply=reply, script=deque(faults), default=default or Fault(), token_logprobs=token_logprobs)
    state.gate.set()
    server = _Server(("127.0.0.1", 0), _handler(state))
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.gate.set()
        state.stopped.set()
        server.shutdown()
        server.server_close()
        thread.join()


def claims_in(body: dict[str, Any]) -> list[str]:
    """The claims a verify request lists after ``Claims:`` in its first user message."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    listing = user.rsplit("Claims:\n", 1)[-1]
    return [line.split("] ", 1)[1] for line in listing.splitlines() if line.startswith("[") and "] " in line]


def judge_every_claim(label: str) -> Callable[[dict[str, Any]], str]:
    """A reply function: one ``label`` judgement (no evidence) per claim the request lists."""

    def reply(body: dict[str, Any]) -> str:
        judgements = [
            {"claim": position, "label": label, "evidence": [], "rationale": "fault server", "confidence": 0.5}
            for position in range(len(claims_in(body)))
        ]
        return json.dumps({"judgements": judgements})

    return reply


def grounded(body: dict[str, Any]) -> str:
    """A reply function: entailed, quoting the claim, where the context holds the claim word for
    word; else baseless. Grounded verdicts need no re-ask, so one call per request."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    context = user.rsplit("Claims:\n", 1)[0]
    judgements = [
        {"claim": n, "label": "entailed", "evidence": [claim], "rationale": "quoted", "confidence": 0.9}
        if claim in context
        else {"claim": n, "label": "baseless", "evidence": [], "rationale": "not found", "confidence": 0.9}
        for n, claim in enumerate(claims_in(body))
    ]
    return json.dumps({"judgements": judgements})


def sentences_as_claims_grounded(body: dict[str, Any]) -> str:
    """A reply function for the whole method: a decomposition request gets each answer sentence as
    its one claim, a verification request :func:`grounded`'s verdicts."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if "Claims:\n" in user:
        return grounded(body)
    listing = user.rsplit("Answer sentences:\n", 1)[-1]
    sentences = re.findall(r"^\[(\d+)\] (.*)$", listing, flags=re.MULTILINE)
    if '{"sentences": [' not in user:  # one sentence asked alone
        return json.dumps({"claims": [sentences[0][1]] if sentences else []})
    return json.dumps({"sentences": [{"sentence": int(n), "claims": [text]} for n, text in sentences]})
