"""The one contract for reading an HTTP reply, on every path that calls a server.

A judge's or a signal server's reply is read under four bounds, whatever client sends the request
(aiohttp for the OpenAI-compatible transport, httpx under litellm and its fleets' router, httpx for
the signals' vLLM client):

- **a cap on the decoded body** (:class:`DecodedBody`): bytes are counted after decompression and
  reading stops at the first byte over :attr:`ReplyLimits.max_bytes`; a body that never ends is
  cut there too;
- **bounded decompression**: ``gzip`` and ``deflate`` are inflated chunk by chunk, never more than
  the bytes still allowed at a time, so a small compressed reply cannot expand in memory (a gzip
  bomb); any other ``Content-Encoding`` (or a stack of them) is refused, and requests only offer
  :data:`ACCEPTED_ENCODINGS`;
- **a total-time deadline** (:attr:`ReplyLimits.deadline_s`) over the whole exchange: connecting,
  headers and body together, so a server that trickles a byte at a time cannot keep a call alive
  past it (per-read timeouts alone never fire on such a server);
- **redirects to another origin refused** (:func:`redirect_target`): the request body is the
  audited text, and a verdict from another host would be recorded under this judge; a redirect
  within the origin (scheme, host and port) may be followed.

A reply refused for its size, its encoding or its redirect raises a :class:`ReplyRefused`, which
the transport policy never retries (the same server would send the same thing); the deadline
raises a timeout (``TimeoutError`` on aiohttp, ``httpx.ReadTimeout`` on the httpx paths), which the policy treats as any
timeout.

This module holds the contract and needs no HTTP client (the lean transport imports no httpx);
:mod:`rt4chart.judges.bounded_httpx` applies it to httpx clients: litellm's, its router's and the
vLLM client's.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

ACCEPTED_ENCODINGS = "gzip, deflate"
"""The ``Accept-Encoding`` every request sends: the encodings :class:`DecodedBody` inflates under its cap."""

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
"""Statuses whose ``Location`` a client may follow."""

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
"""The decoded-body cap of a call that set no limits of its own (litellm reached outside a judge call)."""

DEFAULT_DEADLINE_S = 600.0
"""The deadline of such a call."""



@dataclass(frozen=True)
class ReplyLimits:
    """The bounds one HTTP exchange is read under."""

    max_bytes: int
    """Most bytes of decoded body read; one more is a :class:`ReplyTooLarge`."""
    deadline_s: float
    """Seconds the whole exchange may take, connection, headers and body together."""


class ReplyRefused(Exception):
    """A reply the contract will not read: never retried, the same server would send it again."""


class ReplyTooLarge(ReplyRefused):
    """A decoded body over :attr:`ReplyLimits.max_bytes` (a flood, a body that never ends, a gzip bomb)."""


class UnsupportedEncoding(ReplyRefused):
    """A ``Content-Encoding`` outside :data:`ACCEPTED_ENCODINGS`, which no request offered."""


class RedirectRefused(ReplyRefused):
    """A redirect to another origin, which would carry the audited text to another host."""


def origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port of ``url`` (the port made explicit for http and https)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def redirect_target(url: str, status: int, location: str | None) -> str | None:
    """Where the reply to a request for ``url`` redirects, when it is a redirect; ``None`` otherwise.

    Raises :class:`RedirectRefused` for a redirect to another origin, before anything is sent there.
    """
    if status not in REDIRECT_STATUSES or not location:
        return None
    target = urljoin(url, location)
    if origin(target) != origin(url):
        shown = "{}://{}:{}".format(*origin(target))
        raise RedirectRefused(f"HTTP {status} redirects to another origin ({shown}): not followed")
    return target


class DecodedBody:
    """A reply body read chunk by chunk, decoded under the cap (see the module docstring)."""

    def __init__(self, content_encoding: str | None, max_bytes: int) -> None:
        encoding = (content_encoding or "identity").strip().lower()
        self._max_bytes = max_bytes
        self._chunks: list[bytes] = []
        self._size = 0
        self._inflater: Any = None
        if encoding in ("gzip", "x-gzip"):
            self._inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        elif encoding == "deflate":
            # HTTP's deflate is zlib-wrapped; the zlib header is detected, as by most clients.
            self._inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)
        elif encoding != "identity":
            raise UnsupportedEncoding(f"a reply in Content-Encoding {encoding!r}, which was not asked for")

    def feed(self, chunk: bytes) -> None:
        """Add ``chunk`` as received; raises :class:`ReplyTooLarge` at the first byte over the cap."""
        if self._inflater is None:
            self._keep(chunk)
            return
        pending = chunk
        while pending:
            # Never more out than the cap allows, plus one byte to know it is over.
            try:
                out = self._inflater.decompress(pending, self._max_bytes - self._size + 1)
            except zlib.error as error:
                raise ReplyRefused(f"a reply body that does not decompress: {error}") from None
            self._keep(out)
            pending = self._inflater.unconsumed_tail
            if not out and pending:
                break

    def _keep(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._max_bytes:
            raise ReplyTooLarge(f"a reply body of over {self._max_bytes:,} bytes (decoded), over the cap")
        if data:
            self._chunks.append(data)

    def finish(self) -> bytes:
        """The whole decoded body."""
        if self._inflater is not None:
            self._keep(self._inflater.flush())
        return b"".join(self._chunks)


_CALL_LIMITS: ContextVar[ReplyLimits | None] = ContextVar("rt4chart_reply_limits", default=None)
"""The limits of the call in flight in this task (set by the litellm sender around an attempt)."""


@contextmanager
def reply_limits(limits: ReplyLimits) -> Iterator[None]:
    """Read every HTTP reply within the block under ``limits`` (on transports that read them from here)."""
    token = _CALL_LIMITS.set(limits)
    try:
        yield
    finally:
        _CALL_LIMITS.reset(token)


def current_limits() -> ReplyLimits:
    """The limits of the call in flight, or the defaults when none were set."""
    return _CALL_LIMITS.get() or ReplyLimits(max_bytes=DEFAULT_MAX_BYTES, deadline_s=DEFAULT_DEADLINE_S)
