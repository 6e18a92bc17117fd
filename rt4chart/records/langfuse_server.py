"""RAG turns read from a running Langfuse server over its public API.

``langfuse://HOST:PORT/PROJECT`` (``langfuse+https://HOST/PROJECT`` for TLS) names a project by its id or
name, optionally narrowed by the trace list's own filters as a query (``?environment=production&name=rag``;
:data:`TRACE_FILTERS`) and with its own settling time (``?settle=2m``, default :data:`SETTLE`). The keys
are ``LANGFUSE_PUBLIC_KEY`` / ``LANGFUSE_SECRET_KEY``, sent as HTTP basic auth to that server only
(redirects are not followed); the project they open (``GET /api/public/projects``) must be the one named,
so a key of another project cannot audit, or later score, the wrong traces.

Traces are listed page by page (``GET /api/public/traces?page=N&limit=&orderBy=timestamp.asc&fromTimestamp=``,
``page`` from 1 to ``meta.totalPages``; ``toTimestamp`` leaves out the last :data:`SETTLE`, as Langfuse
serves a trace there some minutes after it happened), then each one is read with its observations
(``GET /api/public/traces/{traceId}``) and becomes one item (one per turn under ``turns = "each"``) as a
Langfuse export's trace does (:func:`rt4chart.records.langfuse.langfuse_items`), in ``timestamp`` order.
The ``--since`` window and the watermark (the last trace ``timestamp`` audited and the traces at it) work as
:mod:`rt4chart.records.server_reads` says.
"""

from __future__ import annotations

import base64
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlencode

from rt4chart.records.io import InputLine
from rt4chart.records.langfuse import LangfuseMapping, langfuse_items
from rt4chart.records.server_reads import (
    TIMEOUT_S,
    ServerRefusal,
    SourceRead,
    Watermark,
    advanced,
    audited_at_floor,
    get_json,
    parse_duration,
    unix_ns,
    window_floor,
)
from rt4chart.records.traces import TraceError

if TYPE_CHECKING:
    import httpx

LANGFUSE_SCHEMES = {"langfuse": "http", "langfuse+https": "https"}
"""Input schemes of a Langfuse project and the protocol each speaks."""
TRACE_FILTERS = ("environment", "name", "userId", "sessionId", "tags", "release", "version")
"""Query parameters of ``GET /api/public/traces`` a source may narrow its traces by (repeatable)."""
PAGE_SIZE = 100
"""Traces listed per page."""
MAX_PAGES = 10_000
"""Pages listed at most from one source (a server whose pages never end cannot hold a run forever)."""
SETTLE = timedelta(minutes=10)
"""How old a trace must be to be read: Langfuse's trace endpoints serve data up to about ten minutes late,
and a watermark past a trace not served yet would skip it for good."""


@dataclass(frozen=True)
class LangfuseSource:
    """A Langfuse project to read traces from (and write verdicts back to)."""

    base_url: str
    """``http(s)://HOST:PORT``."""
    project: str
    """The project's id or name."""
    filters: tuple[tuple[str, str], ...] = ()
    """``(parameter, value)`` of the trace list's filters (:data:`TRACE_FILTERS`), in the order given."""
    settle: timedelta = SETTLE
    """Traces younger than this are left for the next read."""

    @property
    def name(self) -> str:
        """How the source is named in messages and in its watermark."""
        query = f"?{urlencode(self.filters)}" if self.filters else ""
        return f"{self.base_url}/project/{self.project}{query}"


def langfuse_source(text: str) -> LangfuseSource | None:
    """The Langfuse project ``text`` names (``langfuse://HOST:PORT/PROJECT[?FILTERS]``; a path's collapsed
    ``langfuse:/`` reads the same), else ``None``; :class:`TraceError` for a filter it does not know or a
    ``settle`` that is no duration."""
    match = re.fullmatch(r"(langfuse(?:\+https)?):/+([^/\s?]+)/([^?]+)(?:\?(.*))?", text)
    if match is None:
        return None
    scheme, host, project, query = match.groups()
    pairs = parse_qsl(query or "", keep_blank_values=True)
    filters = tuple((key, value) for key, value in pairs if key != "settle")
    unknown = sorted({key for key, _ in filters} - set(TRACE_FILTERS))
    if unknown:
        raise TraceError(f"{text}: unknown trace filter {', '.join(unknown)} (known: {', '.join(TRACE_FILTERS)}; "
                         "and settle)")
    settles = [value for key, value in pairs if key == "settle"]
    try:
        settle = parse_duration(settles[-1]) if settles else SETTLE
    except ValueError as error:
        raise TraceError(f"{text}: settle: {error}") from None
    return LangfuseSource(f"{LANGFUSE_SCHEMES[scheme]}://{host}", project.strip("/"), filters, settle)


@dataclass(frozen=True)
class LangfuseKeys:
    """A Langfuse project's API keys, from ``LANGFUSE_PUBLIC_KEY`` and ``LANGFUSE_SECRET_KEY``."""

    public_key: str
    secret_key: str

    @classmethod
    def from_environment(cls) -> LangfuseKeys:
        """The keys of the environment; :class:`TraceError` naming the ones missing."""
        public, secret = os.environ.get("LANGFUSE_PUBLIC_KEY"), os.environ.get("LANGFUSE_SECRET_KEY")
        if not public or not secret:
            missing = [n for n, v in (("LANGFUSE_PUBLIC_KEY", public), ("LANGFUSE_SECRET_KEY", secret)) if not v]
            raise TraceError(f"reading Langfuse needs {' and '.join(missing)} in the environment")
        return cls(public, secret)

    @property
    def authorization(self) -> str:
        """The ``Authorization`` header's value: HTTP basic auth, the public key as user."""
        return "Basic " + base64.b64encode(f"{self.public_key}:{self.secret_key}".encode()).decode()

    @property
    def secrets(self) -> list[str]:
        """What never appears in a message."""
        return [self.secret_key, self.public_key]


def _client(source: LangfuseSource, keys: LangfuseKeys) -> httpx.Client:
    import httpx  # only when a server is read: every rt4 verify asks langfuse_source

    # Never follow a redirect: the keys go to this server only.
    return httpx.Client(base_url=source.base_url, headers={"Authorization": keys.authorization}, timeout=TIMEOUT_S,
                        follow_redirects=False)


def check_project(client: httpx.Client, source: LangfuseSource, keys: LangfuseKeys) -> None:
    """:class:`TraceError` unless the keys open the project ``source`` names (by id or name)."""
    answer = get_json(client, "/api/public/projects", {}, _server(source), "the keys' project", keys.secrets)
    projects = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(projects, list):
        raise TraceError(f"{_server(source)} answered no project list ({{\"data\": [projects]}})")
    opened = [p for p in projects if isinstance(p, dict)]
    if not any(source.project in (p.get("id"), p.get("name")) for p in opened):
        names = ", ".join(f"{p.get('name')} (id {p.get('id')})" for p in opened) or "none"
        raise TraceError(f"{_server(source)}: the keys open project {names}, not {source.project!r}")


def _server(source: LangfuseSource) -> str:
    return f"Langfuse at {source.base_url}"


def _timestamp_ns(trace: Any) -> int | None:
    """A listed trace's ``timestamp`` as Unix nanoseconds (``None``: none readable)."""
    text = trace.get("timestamp") if isinstance(trace, dict) else None
    try:
        moment = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return unix_ns(moment if moment.tzinfo else moment.replace(tzinfo=UTC))


def _iso(ns: int) -> str:
    """Unix nanoseconds as Langfuse's ISO 8601 timestamps are written: whole milliseconds (its precision),
    rounded down, in UTC."""
    moment = datetime.fromtimestamp(0, UTC) + timedelta(milliseconds=ns // 10**6)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def list_traces(client: httpx.Client, source: LangfuseSource, start_ns: int | None, end_ns: int,
                keys: LangfuseKeys) -> list[dict[str, Any]]:
    """The traces listed from ``start_ns`` on (all of them: ``None``) and before ``end_ns``, oldest first,
    page by page."""
    params: list[tuple[str, str | int]] = [("limit", PAGE_SIZE), ("orderBy", "timestamp.asc"), *source.filters,
                                           ("toTimestamp", _iso(end_ns))]
    if start_ns is not None:
        params.append(("fromTimestamp", _iso(start_ns)))
    listed: list[dict[str, Any]] = []
    for page in range(1, MAX_PAGES + 1):
        answer = get_json(client, "/api/public/traces", [("page", page), *params], _server(source),
                          f"project {source.project!r}", keys.secrets)
        data = answer.get("data") if isinstance(answer, dict) else None
        meta = answer.get("meta") if isinstance(answer, dict) else None
        if not isinstance(data, list) or not isinstance(meta, dict):
            raise TraceError(f"{_server(source)} answered no trace page ({{\"data\": [traces], \"meta\": {{...}}}})")
        listed += data
        total = meta.get("totalPages")
        if not data or not isinstance(total, int) or page >= total:
            return listed
    raise TraceError(f"{_server(source)}: more than {MAX_PAGES} pages of traces; narrow --since")


def read_langfuse(source: LangfuseSource, since: timedelta | None, watermark: Watermark | None,
                  mapping: LangfuseMapping | None = None, now: datetime | None = None) -> SourceRead:
    """The traces of ``source`` whose ``timestamp`` is in the window: after ``watermark`` (less the traces it
    names) and within ``since`` of ``now``, each read with its observations; :class:`TraceError` when the
    keys are missing or refused, or the server cannot be read."""
    keys = LangfuseKeys.from_environment()
    now = now or datetime.now(UTC)
    floor, ceiling = window_floor(since, watermark, now), unix_ns(now - source.settle)
    done = audited_at_floor(watermark, floor)
    with _client(source, keys) as client:
        check_project(client, source, keys)
        listed = list_traces(client, source, floor, ceiling, keys)
        started: dict[str, int] = {}
        before: set[str] = set()
        unreadable: list[str] = []
        for trace in listed:
            trace_id, start = trace.get("id") if isinstance(trace, dict) else None, _timestamp_ns(trace)
            if not isinstance(trace_id, str) or not trace_id or start is None:
                unreadable.append(f"a listed trace without an id or a timestamp: {str(trace)[:120]}")
            elif (floor is not None and start < floor) or trace_id in done:
                before.add(trace_id)
            elif start < ceiling:
                started.setdefault(trace_id, start)  # a trace listed twice (pages moved under ties) once
        in_order = sorted((start, trace_id) for trace_id, start in started.items())
        items: list[InputLine] = []
        for _, trace_id in in_order:
            items += _items(client, source, trace_id, len(items) + 1, keys, mapping or LangfuseMapping())
    items += [InputLine(number, None, problem) for number, problem in enumerate(unreadable, start=len(items) + 1)]
    return SourceRead(items, advanced(source, watermark, in_order), len(before))


def _items(client: httpx.Client, source: LangfuseSource, trace_id: str, first: int, keys: LangfuseKeys,
           mapping: LangfuseMapping) -> list[InputLine]:
    """A listed trace read with its observations as items numbered from ``first`` (one, or one per turn under
    ``turns = "each"``); one deleted since it was listed (404) is an error item naming it (every listed trace
    has its record)."""
    try:
        trace = get_json(client, f"/api/public/traces/{quote(trace_id, safe='')}", {}, _server(source),
                         f"trace {trace_id!r}", keys.secrets)
    except ServerRefusal as refusal:
        if refusal.status != 404:
            raise
        return [InputLine(first, None, f"trace {trace_id}: listed, then not found ({refusal})", raw_id=trace_id)]
    return langfuse_items(trace, first, mapping)
