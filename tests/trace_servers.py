"""Stand-ins for the tracing servers rt4chart reads from and writes verdicts to, on 127.0.0.1, speaking
the endpoints rt4chart uses exactly as documented:

- Phoenix (REST API v1): ``GET /v1/projects/{project}/spans/otlpv1`` (``start_time`` inclusive, ``limit``,
  ``cursor`` / ``next_cursor``, newest first, spans as Phoenix serves them: snake_case, see
  tests/fixtures/traces/phoenix_otlpv1.json), ``POST /v1/span_annotations?sync=true`` (``{"data": [...]}``,
  an annotation with the same span, name and identifier updated in place) and
  ``GET /v1/projects/{project}/span_annotations?span_ids=...``;
- Langfuse (public API, basic auth: with ``langfuse_keys`` set, any other key answers 401):
  ``GET /api/public/projects`` (the keys' one project), ``GET /api/public/traces`` (``page`` from 1,
  ``limit``, ``orderBy=timestamp.asc``, ``fromTimestamp`` inclusive, ``toTimestamp`` exclusive, the
  ``environment`` / ``name`` / ``tags`` filters; each trace with its observation ids, ``meta.totalPages``),
  ``GET /api/public/traces/{traceId}`` (the trace with its observations and scores, as the fixture
  tests/fixtures/traces/langfuse_rag.json holds them), ``POST /api/public/scores`` (a score with the
  same ``id`` updated in place) and ``GET /api/public/scores``.

Every request's method, path and Authorization header is kept (``requests``), so a test can say where a
key went; ``fail_writes`` makes every write answer 500, ``redirect_to`` every read a redirect.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse


@dataclass
class TraceServer:
    """The state of one stand-in: spans per project, annotations, scores, the requests seen."""

    spans: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    annotations: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    """``(method, path with query, Authorization header)`` of every request, in order."""
    fail_writes: bool = False
    page_cap: int = 4
    """The most spans one page holds, whatever ``limit`` asks (Phoenix caps it too): a few traces page."""
    langfuse_traces: list[dict[str, Any]] = field(default_factory=list)
    """Langfuse traces, each with its observations as objects."""
    langfuse_project: dict[str, Any] = field(default_factory=lambda: {"id": "cm-project-1", "name": "rag-app"})
    """The one project Langfuse's keys open."""
    langfuse_keys: tuple[str, str] | None = None
    """``(public, secret)``: the only keys Langfuse accepts (``None``: any basic auth)."""
    langfuse_gone: set[str] = field(default_factory=set)
    """Traces listed whose own read answers 404 (deleted between the two)."""
    redirect_to: str | None = None
    """When set, every GET answers 307 to this base URL (a server that would send a key elsewhere)."""
    url: str = ""

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def _span_page(state: TraceServer, project: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
    if project not in state.spans:
        return 404, {"detail": f"Project with name {project} not found"}
    spans = sorted(state.spans[project], key=lambda s: int(s["start_time_unix_nano"]), reverse=True)
    if "start_time" in query:
        floor = datetime.fromisoformat(query["start_time"][0]).timestamp()
        # Phoenix compares microsecond timestamps: a span is in when its start is not before the floor.
        spans = [s for s in spans if int(s["start_time_unix_nano"]) // 1000 >= round(floor * 1e6)]
    offset = int(query.get("cursor", ["0"])[0])
    limit = min(int(query.get("limit", ["100"])[0]), state.page_cap)
    page = spans[offset:offset + limit]
    more = offset + limit < len(spans)
    return 200, {"data": page, "next_cursor": str(offset + limit) if more else None}


def _langfuse_authorized(state: TraceServer, header: str | None) -> bool:
    if not (header or "").startswith("Basic "):
        return False
    if state.langfuse_keys is None:
        return True
    return base64.b64decode((header or "")[len("Basic "):]).decode() == ":".join(state.langfuse_keys)


def _trace_list(state: TraceServer, query: dict[str, list[str]]) -> dict[str, Any]:
    """A page of ``GET /api/public/traces``: the traces as listed (observation ids, not objects)."""
    traces = sorted(state.langfuse_traces, key=lambda t: (datetime.fromisoformat(t["timestamp"]), t["id"]),
                    reverse=query.get("orderBy", ["timestamp.desc"])[0] != "timestamp.asc")
    if "fromTimestamp" in query:
        floor = datetime.fromisoformat(query["fromTimestamp"][0])
        traces = [t for t in traces if datetime.fromisoformat(t["timestamp"]) >= floor]
    if "toTimestamp" in query:
        ceiling = datetime.fromisoformat(query["toTimestamp"][0])
        traces = [t for t in traces if datetime.fromisoformat(t["timestamp"]) < ceiling]
    for key in ("environment", "name"):
        if key in query:
            traces = [t for t in traces if t.get(key, "default" if key == "environment" else None) in query[key]]
    traces = [t for t in traces if set(query.get("tags", [])) <= set(t.get("tags") or [])]
    page, limit = int(query.get("page", ["1"])[0]), min(int(query.get("limit", ["50"])[0]), state.page_cap)
    listed = [{**t, "observations": [o["id"] for o in t["observations"]], "scores": []}
              for t in traces[(page - 1) * limit:page * limit]]
    return {"data": listed, "meta": {"page": page, "limit": limit, "totalItems": len(traces),
                                     "totalPages": -(-len(traces) // limit)}}


def _langfuse_get(state: TraceServer, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
    if path == "/api/public/projects":
        organization = {"id": "org-1", "name": "org"}
        return 200, {"data": [{**state.langfuse_project, "metadata": {}, "organization": organization}]}
    if path == "/api/public/traces":
        return 200, _trace_list(state, query)
    if path.startswith("/api/public/traces/"):
        trace_id = unquote(path.removeprefix("/api/public/traces/"))
        found = next((t for t in state.langfuse_traces if t["id"] == trace_id and trace_id not in state.langfuse_gone),
                     None)
        if found is None:
            return 404, {"error": "LangfuseNotFoundError", "message": "Trace not found within authorized project"}
        scores = [score for score in state.scores.values() if score["traceId"] == trace_id]
        return 200, {**found, "scores": scores}
    return 200, {"data": list(state.scores.values()), "meta": {"totalItems": len(state.scores)}}


def _handler(state: TraceServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            return json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")

        def do_GET(self) -> None:
            state.requests.append(("GET", self.path, self.headers.get("Authorization")))
            if state.redirect_to is not None:
                self.send_response(307)
                self.send_header("Location", state.redirect_to + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            url = urlparse(self.path)
            query = parse_qs(url.query)
            parts = [unquote(p) for p in url.path.split("/")]
            if len(parts) == 6 and parts[1:3] == ["v1", "projects"] and parts[4:] == ["spans", "otlpv1"]:
                self._reply(*_span_page(state, parts[3], query))
            elif len(parts) == 5 and parts[1:3] == ["v1", "projects"] and parts[4] == "span_annotations":
                wanted = set(query.get("span_ids", []))
                found = [a for (span, _, _), a in state.annotations.items() if span in wanted]
                self._reply(200, {"data": found, "next_cursor": None})
            elif url.path.startswith("/api/public/"):
                if not _langfuse_authorized(state, self.headers.get("Authorization")):
                    self._reply(401, {"message": "Invalid credentials. Confirm the host and the keys."})
                    return
                self._reply(*_langfuse_get(state, url.path, query))
            else:
                self._reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            state.requests.append(("POST", self.path, self.headers.get("Authorization")))
            url = urlparse(self.path)
            body = self._body()
            if state.fail_writes:
                self._reply(500, {"detail": "database is locked"})
            elif url.path == "/v1/span_annotations":
                ids = []
                for annotation in body["data"]:
                    key = (annotation["span_id"], annotation["name"], annotation.get("identifier") or "")
                    previous = state.annotations.get(key)
                    annotation_id = previous["id"] if previous else f"annotation-{len(state.annotations) + 1}"
                    state.annotations[key] = {**annotation, "id": annotation_id}
                    ids.append({"id": annotation_id})
                self._reply(200, {"data": ids})
            elif url.path == "/api/public/scores":
                if not _langfuse_authorized(state, self.headers.get("Authorization")):
                    self._reply(401, {"message": "Unauthorized"})
                    return
                state.scores[body["id"]] = body
                self._reply(200, {"id": body["id"]})
            else:
                self._reply(404, {"detail": "Not Found"})

    return Handler


@contextmanager
def trace_server(spans: dict[str, list[dict[str, Any]]] | None = None) -> Iterator[TraceServer]:
    """A stand-in serving ``spans`` (by project) on a free port of 127.0.0.1 until the block ends."""
    state = TraceServer(spans=spans or {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
