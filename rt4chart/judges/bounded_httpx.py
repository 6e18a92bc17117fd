"""The reply-reading contract of :mod:`rt4chart.judges.bounded_http` applied to httpx clients.

:class:`BoundedAsyncTransport` wraps any httpx transport: litellm's (every provider's client and the
router's, through :func:`bound_litellm_transports`) and the signals' vLLM client's. It lives apart
from the contract so that the lean OpenAI-compatible transport (aiohttp) never imports httpx.

litellm builds its httpx clients itself and caches them across calls; the limits of the call in
flight reach the transport through a context variable (:func:`~rt4chart.judges.bounded_http.reply_limits`)
that the litellm sender sets around each attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from rt4chart.judges.bounded_http import ACCEPTED_ENCODINGS, DecodedBody, ReplyLimits, current_limits, redirect_target

_BODY_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})
"""Headers that describe the body as sent, not as decoded: dropped from a response rebuilt decoded."""


class BoundedAsyncTransport(httpx.AsyncBaseTransport):
    """An httpx transport that reads each reply whole, under the contract, before the client sees it.

    The reply handed to the client is already decoded (no ``Content-Encoding`` left for httpx to
    expand); a cross-origin redirect is refused before the client could follow it. Limits are
    ``limits`` when given, else those of the call in flight (:func:`current_limits`).
    """

    def __init__(self, inner: httpx.AsyncBaseTransport, limits: ReplyLimits | None = None) -> None:
        self._inner = inner
        self._limits = limits

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        limits = self._limits or current_limits()
        request.headers["Accept-Encoding"] = ACCEPTED_ENCODINGS
        try:
            async with asyncio.timeout(limits.deadline_s):
                response = await self._inner.handle_async_request(request)
                try:
                    redirect_target(str(request.url), response.status_code, response.headers.get("location"))
                    body = DecodedBody(response.headers.get("content-encoding"), limits.max_bytes)
                    async for chunk in response.aiter_raw():
                        body.feed(chunk)
                finally:
                    await response.aclose()
        except TimeoutError:
            raise httpx.ReadTimeout(
                f"no complete reply within the deadline of {limits.deadline_s:g} s", request=request
            ) from None
        headers = [(name, value) for name, value in response.headers.multi_items() if name.lower() not in _BODY_HEADERS]
        return httpx.Response(response.status_code, headers=headers, content=body.finish(), request=request,
                              extensions={"http_version": response.extensions.get("http_version", b"HTTP/1.1")})

    async def aclose(self) -> None:
        await self._inner.aclose()


def bound_litellm_transports() -> None:
    """Make every async httpx client litellm builds from now on read its replies under the contract.

    litellm gives no per-call hook that reaches every provider's client (the OpenAI SDK's, its own
    handler's, the router's), but all of them get their transport from one factory,
    ``AsyncHTTPHandler.create_async_transport``: it is wrapped once, here, so its transports are
    :class:`BoundedAsyncTransport`. Idempotent.
    """
    from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler

    factory: Callable[..., httpx.AsyncBaseTransport | None] = AsyncHTTPHandler.create_async_transport
    if getattr(factory, "_rt4chart_bounded", False):
        return

    def bounded_transport(*args: Any, **kwargs: Any) -> httpx.AsyncBaseTransport:
        return BoundedAsyncTransport(factory(*args, **kwargs) or httpx.AsyncHTTPTransport())

    bounded_transport._rt4chart_bounded = True  # type: ignore[attr-defined]
    AsyncHTTPHandler.create_async_transport = staticmethod(bounded_transport)  # type: ignore[method-assign,assignment]
    AsyncHTTPHandler._create_async_transport = staticmethod(bounded_transport)  # type: ignore[assignment]
