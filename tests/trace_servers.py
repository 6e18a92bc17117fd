"""Stand-ins for the tracing servers rt4chart reads from and writes verdicts to, on 127.0.0.1, speaking
the endpoints rt4chart uses exactly as documented:

- Phoenix (REST API v1): ``GET /v1/projects/{project}/spans/otlpv1`` (``start_time`` inclusive, ``limit``,
  ``cursor`` / ``next_cursor``, newest first, spans as Phoenix serves them: snake_case, see
  tests/fixtures/traces/phoenix_otlpv1.json), ``POST /v1/span_annotations?sync=true`` (``{"data": [...]}``,
  an annotation with the same span, name and identifier updated in place) and
  ``GET /v1/projects/{project}/span_annotations?span_ids=...``;
- Langfuse (public API): ``POST /api/public/scores`` (basic auth; a score with the same ``id`` updated in
  place) and ``GET /api/public/scores``.

Every request's method, path and Authorization header is kept (``requests``), so a test can say where a
key went; ``fail_writes`` makes every write answer 500.
"""

from __future__ import annotations

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
            url = urlparse(self.path)
            query = parse_qs(url.query)
            parts = [unquote(p) for p in url.path.split("/")]
            if len(parts) == 6 and parts[1:3] == ["v1", "projects"] and parts[4:] == ["spans", "otlpv1"]:
                self._reply(*_span_page(state, parts[3], query))
            elif len(parts) == 5 and parts[1:3] == ["v1", "projects"] and parts[4] == "span_annotations":
                wanted = set(query.get("span_ids", []))
                found = [a for (span, _, _), a in state.annotations.items() if span in wanted]
                self._reply(200, {"data": found, "next_cursor": None})
            elif url.path == "/api/public/scores":
                self._reply(200, {"data": list(state.scores.values()), "meta": {"totalItems": len(state.scores)}})
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
                if not (self.headers.get("Authorization") or "").startswith("Basic "):
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
