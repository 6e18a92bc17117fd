"""RAG turns read from a running Phoenix server over its REST API, and the watermark that makes the next
audit read only what is new.

``phoenix://HOST:PORT/PROJECT`` (``phoenix+https://`` for TLS) names a project. Its spans are read page by
page from ``GET /v1/projects/{project}/spans/otlpv1`` (``start_time`` inclusive, ``limit``, then
``cursor`` = the page's ``next_cursor`` until there is none), with ``PHOENIX_API_KEY`` as a bearer token
sent to that server only (redirects are not followed). The spans become items as an OTLP/JSON export's do
(:mod:`rt4chart.records.traces`), one per trace whose root span starts in the window, in root start order.

A :class:`Watermark` remembers, per source, the start of the last audited trace's root span and the traces
that started at that very nanosecond: the next read asks from there and skips them, so a nightly job audits
each trace once. Traces whose root span started before the window (the watermark or ``--since``) are not
read, and counted (:attr:`PhoenixRead.before_window`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict

from rt4chart.records.io import InputLine
from rt4chart.records.traces import TraceError, TraceMapping, numbered, spans_of_requests

if TYPE_CHECKING:
    import httpx

PHOENIX_SCHEMES = {"phoenix": "http", "phoenix+https": "https"}
"""Input schemes of a Phoenix project and the protocol each speaks."""
PAGE_SIZE = 1000
"""Spans asked per page."""
MAX_PAGES = 10_000
"""Pages read at most from one source (a server whose cursor never ends cannot hold a run forever)."""
MAX_PAGE_BYTES = 256 * 2**20
"""The most bytes one page's body may hold once decoded (1,000 spans with their documents fit in far less)."""
TIMEOUT_S = 60.0
"""One request's deadline."""


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


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``24h``, ``7d`` as a duration; :class:`ValueError` otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 30m, 24h, 7d)")
    amount, unit = float(match.group(1)), match.group(2)
    return timedelta(seconds=amount * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit])


class Watermark(BaseModel):
    """How far a source has been audited."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    source: str
    """The source (:attr:`PhoenixSource.name`)."""
    root_start_ns: int
    """Start time (Unix nanoseconds) of the latest root span audited."""
    trace_ids: list[str]
    """The traces audited whose root span started at exactly ``root_start_ns``."""


def watermark_path(directory: Path, source: PhoenixSource) -> Path:
    """Where ``source``'s watermark lives in ``directory`` (one file per source)."""
    return directory / f"{hashlib.sha256(source.name.encode()).hexdigest()[:16]}.json"


def read_watermark(path: Path) -> Watermark | None:
    """The watermark stored at ``path`` (``None``: none yet); an unreadable one is a :class:`TraceError`."""
    if not path.exists():
        return None
    try:
        return Watermark.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as error:
        raise TraceError(f"the watermark {path} cannot be read ({error}); remove it to audit the window "
                         "again") from None


def write_watermark(path: Path, watermark: Watermark) -> None:
    """Store ``watermark`` at ``path`` (written whole, then moved into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(watermark.model_dump_json(indent=1), encoding="utf-8")
    partial.replace(path)


@dataclass(frozen=True)
class PhoenixRead:
    """What one read of a Phoenix project gave."""

    items: list[InputLine]
    """One item per trace in the window, in root start order, then one per span that names no trace."""
    watermark: Watermark | None
    """The watermark once these items are audited (``None``: nothing new was read)."""
    before_window: int
    """Traces seen whose root span started before the window (already audited, or older than ``--since``)."""


def phoenix_headers() -> dict[str, str]:
    """The request headers: ``PHOENIX_API_KEY`` as a bearer token when it is set."""
    key = os.environ.get("PHOENIX_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _client(source: PhoenixSource) -> httpx.Client:
    import httpx  # only when a server is read: every rt4 verify asks phoenix_source

    # Never follow a redirect: the key goes to this server only.
    return httpx.Client(base_url=source.base_url, headers=phoenix_headers(), timeout=TIMEOUT_S, follow_redirects=False)


def _page(client: httpx.Client, path: str, params: dict[str, str | int], source: PhoenixSource) -> Any:
    """One page of spans, its body read decoded and cut at :data:`MAX_PAGE_BYTES` (a server cannot fill the
    memory of a run)."""
    with client.stream("GET", path, params=params) as response:
        if response.status_code != 200:
            response.read()
            raise TraceError(f"Phoenix at {source.base_url} answered {response.status_code} for project "
                             f"{source.project!r}: {response.text[:200]}")
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > MAX_PAGE_BYTES:
                raise TraceError(f"Phoenix at {source.base_url}: a page of spans over {MAX_PAGE_BYTES:,} bytes")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise TraceError(f"Phoenix at {source.base_url} answered something that is not JSON") from None


def fetch_spans(source: PhoenixSource, start_ns: int | None) -> list[Any]:
    """Every span of the project that started at or after ``start_ns`` (all of them: ``None``), page by page."""
    import httpx

    path = f"/v1/projects/{quote(source.project, safe='')}/spans/otlpv1"
    params: dict[str, str | int] = {"limit": PAGE_SIZE}
    if start_ns is not None:  # whole microseconds, rounded down (integers: exact): the spans are cut exactly after
        params["start_time"] = (datetime.fromtimestamp(0, UTC) + timedelta(microseconds=start_ns // 1000)).isoformat()
    spans: list[Any] = []
    with _client(source) as client:
        for _ in range(MAX_PAGES):
            try:
                page = _page(client, path, params, source)
            except httpx.HTTPError as error:
                raise TraceError(f"Phoenix at {source.base_url} cannot be read: {type(error).__name__}: "
                                 f"{error}") from None
            if not isinstance(page, dict) or not isinstance(page.get("data"), list):
                raise TraceError(f"Phoenix at {source.base_url} answered no span page ({{\"data\": [spans]}})")
            spans.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                return spans
            params["cursor"] = str(cursor)
    raise TraceError(f"Phoenix at {source.base_url}: more than {MAX_PAGES} pages of spans; narrow --since")


def read_phoenix(source: PhoenixSource, since: timedelta | None, watermark: Watermark | None,
                 mapping: TraceMapping | None = None, now: datetime | None = None) -> PhoenixRead:
    """The traces of ``source`` whose root span started in the window: after ``watermark`` (less the traces
    it names) and within ``since`` of ``now``; :class:`TraceError` when the server cannot be read."""
    floors = [watermark.root_start_ns] if watermark else []
    if since is not None:
        floors.append(int(((now or datetime.now(UTC)) - since).timestamp() * 1e9))
    floor = max(floors, default=None)
    spans = fetch_spans(source, floor)
    traces, problems = spans_of_requests([{"data": spans}], source.name)
    done = set(watermark.trace_ids) if watermark and watermark.root_start_ns == floor else set()
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
    return PhoenixRead(items, _advanced(source, watermark, rooted), len(traces) - len(rooted))


def _advanced(source: PhoenixSource, watermark: Watermark | None,
              rooted: Sequence[tuple[int, str]]) -> Watermark | None:
    if not rooted:
        return None
    last = rooted[-1][0]
    at_last = [trace_id for start, trace_id in rooted if start == last]
    if watermark is not None and watermark.root_start_ns == last:
        at_last = sorted({*watermark.trace_ids, *at_last})
    return Watermark(source=source.name, root_start_ns=last, trace_ids=at_last)

