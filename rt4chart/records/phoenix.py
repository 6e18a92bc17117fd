"""RAG turns read from a running Phoenix server over its REST API.

``phoenix://HOST:PORT/PROJECT`` (``phoenix+https://`` for TLS) names a project. Its spans are read page by
page from ``GET /v1/projects/{project}/spans/otlpv1`` (``start_time`` inclusive, ``limit``, then
``cursor`` = the page's ``next_cursor`` until there is none), with ``PHOENIX_API_KEY`` as a bearer token
sent to that server only (redirects are not followed). The spans become items as an OTLP/JSON export's do
(:mod:`rt4chart.records.traces`), one per trace whose root span starts in the window, in root start order.
The ``--since`` window and the watermark (the last root span start audited) work as
:mod:`rt4chart.records.server_reads` says.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from rt4chart.records.server_reads import (
    TIMEOUT_S,
    SourceRead,
    Watermark,
    advanced,
    audited_at_floor,
    get_json,
    window_floor,
)
from rt4chart.records.traces import TraceError, TraceMapping, numbered, spans_of_requests

if TYPE_CHECKING:
    import httpx

PHOENIX_SCHEMES = {"phoenix": "http", "phoenix+https": "https"}
"""Input schemes of a Phoenix project and the protocol each speaks."""
PAGE_SIZE = 1000
"""Spans asked per page."""
MAX_PAGES = 10_000
"""Pages read at most from one source (a server whose cursor never ends cannot hold a run forever)."""


@dataclass(frozen=True)
class PhoenixSource:
    """A Phoenix project to read traces from (and write verdicts back to)."""

    base_url: str
    """``http(s)://HOST:PORT``."""
    project: str
    """The project's name (or id)."""

    @property
    def name(self) -> str:
        """How the source is named in messages and in its watermark."""
        return f"{self.base_url}/projects/{self.project}"


def phoenix_source(text: str) -> PhoenixSource | None:
    """The Phoenix project ``text`` names (``phoenix://HOST:PORT/PROJECT``; a path's collapsed ``phoenix:/``
    reads the same), else ``None``."""
    match = re.fullmatch(r"(phoenix(?:\+https)?):/+([^/\s]+)/(.+)", text)
    if match is None:
        return None
    scheme, host, project = match.groups()
    return PhoenixSource(f"{PHOENIX_SCHEMES[scheme]}://{host}", project.strip("/"))


def phoenix_headers() -> dict[str, str]:
    """The request headers: ``PHOENIX_API_KEY`` as a bearer token when it is set."""
    key = os.environ.get("PHOENIX_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _client(source: PhoenixSource) -> httpx.Client:
    import httpx  # only when a server is read: every rt4 verify asks phoenix_source

    # Never follow a redirect: the key goes to this server only.
    return httpx.Client(base_url=source.base_url, headers=phoenix_headers(), timeout=TIMEOUT_S, follow_redirects=False)


def fetch_spans(source: PhoenixSource, start_ns: int | None) -> list[Any]:
    """Every span of the project that started at or after ``start_ns`` (all of them: ``None``), page by page."""
    path = f"/v1/projects/{quote(source.project, safe='')}/spans/otlpv1"
    params: dict[str, str | int] = {"limit": PAGE_SIZE}
    if start_ns is not None:  # whole microseconds, rounded down (integers: exact): the spans are cut exactly after
        params["start_time"] = (datetime.fromtimestamp(0, UTC) + timedelta(microseconds=start_ns // 1000)).isoformat()
    spans: list[Any] = []
    with _client(source) as client:
        for _ in range(MAX_PAGES):
            page = get_json(client, path, params, f"Phoenix at {source.base_url}", f"project {source.project!r}")
            if not isinstance(page, dict) or not isinstance(page.get("data"), list):
                raise TraceError(f"Phoenix at {source.base_url} answered no span page ({{\"data\": [spans]}})")
            spans.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                return spans
            params["cursor"] = str(cursor)
    raise TraceError(f"Phoenix at {source.base_url}: more than {MAX_PAGES} pages of spans; narrow --since")


def read_phoenix(source: PhoenixSource, since: timedelta | None, watermark: Watermark | None,
                 mapping: TraceMapping | None = None, now: datetime | None = None) -> SourceRead:
    """The traces of ``source`` whose root span started in the window: after ``watermark`` (less the traces
    it names) and within ``since`` of ``now``; :class:`TraceError` when the server cannot be read."""
    floor = window_floor(since, watermark, now)
    spans = fetch_spans(source, floor)
    traces, problems = spans_of_requests([{"data": spans}], source.name)
    done = audited_at_floor(watermark, floor)
    rooted: list[tuple[int, str]] = []
    for trace_id, trace_spans in traces.items():
        ids = {span.span_id for span in trace_spans}
        roots = [span for span in trace_spans if span.parent_id is None or span.parent_id not in ids]
        # A root that names a parent not read began in a trace whose root span is older than the window.
        began_before = any(span.parent_id is not None for span in roots)
        start = min(span.start for span in roots)
        if not (began_before or (floor is not None and start < floor) or trace_id in done):
            rooted.append((start, trace_id))
    rooted.sort()
    items = numbered([(trace_id, traces[trace_id]) for _, trace_id in rooted], problems, mapping or TraceMapping())
    return SourceRead(items, advanced(source, watermark, rooted), len(traces) - len(rooted))

