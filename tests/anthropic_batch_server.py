"""A real stand-in for Anthropic's Messages API and Message Batches on 127.0.0.1.

Endpoints (Anthropic's shapes): ``POST /v1/messages`` (online, answered at once),
``POST /v1/messages/batches`` (``{"requests": [{"custom_id", "params"}]}``),
``GET /v1/messages/batches?limit=N`` (newest first), ``GET /v1/messages/batches/{id}``,
``POST /v1/messages/batches/{id}/cancel`` and ``GET /v1/messages/batches/{id}/results`` (JSON lines).
A batch is ``in_progress`` when created and ``ended`` at its second retrieval unless
:attr:`AnthropicBatchServer.finishing` holds it; a batch being cancelled is ``canceling`` until then.
Each request is answered by the fault server's reply logic (:class:`faults.FaultServer` and its
script of :class:`~faults.Fault`), on the same text an OpenAI body of the request would carry, so a
batched request gets exactly the reply it would get online; a forced ``json_tool_call`` tool is
answered with a ``tool_use`` block, as Anthropic does. A scripted failure is an ``errored`` line;
an expiring batch leaves ``expired`` lines. The prompt cache is modelled: the prefix up to a
request's last ``cache_control`` block is written at its first sight and read afterwards (four
characters a token; none under :attr:`AnthropicBatchServer.min_cached_tokens`). Every request
received is kept (params, headers) and counted by ``custom_id``.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from batch_server import ANSWERED
from faults import Fault, FaultServer

JSON_TOOL = "json_tool_call"


def tokens(text: str) -> int:
    """The stand-in's token count: four characters a token."""
    return max(1, len(text) // 4) if text else 0


def blocks_of(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every content block of a request, system first, in prompt order."""
    system = params.get("system") or []
    found = [{"type": "text", "text": system}] if isinstance(system, str) else list(system)
    for message in params.get("messages") or []:
        content = message.get("content")
        found.extend([{"type": "text", "text": content}] if isinstance(content, str) else content or [])
    return found


def openai_body(params: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI body with the same text (what the fault server's reply functions read)."""

    def text(content: Any) -> str:
        return content if isinstance(content, str) else "".join(str(b.get("text") or "") for b in content or [])

    messages = [{"role": "system", "content": text(params["system"])}] if params.get("system") else []
    messages += [{"role": m["role"], "content": text(m.get("content"))} for m in params.get("messages") or []]
    return {"model": params.get("model"), "messages": messages, "max_tokens": params.get("max_tokens")}


@dataclass
class AnthropicBatchServer:
    """State shared with the handler threads."""

    answers: FaultServer
    """The reply logic and fault script (never started: only its methods answer)."""
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Batch objects by id, with the stand-in's own bookkeeping under ``_`` keys."""
    submitted: Counter[str] = field(default_factory=Counter)
    """Requests received in created batches, by ``custom_id``."""
    batch_params: list[dict[str, Any]] = field(default_factory=list)
    """The ``params`` of every batched request received, in arrival order."""
    online: list[dict[str, Any]] = field(default_factory=list)
    """Bodies of the online ``/v1/messages`` requests."""
    headers: list[dict[str, str]] = field(default_factory=list)
    """Headers of every request received (names in lower case)."""
    cached_prefixes: set[str] = field(default_factory=set)
    """Prompt prefixes written to the modelled cache."""
    min_cached_tokens: int = 0
    """The shortest prefix the modelled cache takes (Anthropic's: 1,024 tokens for Sonnet and Opus,
    2,048 for Haiku; 0: any)."""
    expire: int = 0
    """The next this many batches created expire instead of completing."""
    expired_answers: int = 0
    """Requests an expiring batch answers before it expires (the rest get ``expired`` lines)."""
    fail: int = 0
    """The next this many batches created answer every request with an ``errored`` line."""
    finishing: int | None = None
    """How many of the batches created may end (``None``: all); the later ones stay ``in_progress``."""
    origin: str = ""
    """``http://127.0.0.1:PORT`` once started."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    cache_lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def created_batches(self) -> list[dict[str, Any]]:
        """Every batch created, in creation order."""
        with self.lock:
            return sorted(self.batches.values(), key=lambda batch: int(batch["_number"]))

    def message(self, params: dict[str, Any], behaviour: str) -> dict[str, Any]:
        """The Anthropic message answering ``params`` (``behaviour``: a fault server content variant)."""
        content = self.answers.content_for(behaviour, openai_body(params))  # type: ignore[arg-type]
        forced = (params.get("tool_choice") or {}).get("name") == JSON_TOOL
        try:
            parsed = json.loads(content) if forced else None
        except ValueError:
            parsed = None
        block = ({"type": "tool_use", "id": f"toolu_{next(self._ids)}", "name": JSON_TOOL, "input": parsed}
                 if isinstance(parsed, dict) else {"type": "text", "text": content})
        return {
            "id": f"msg_{next(self._ids)}", "type": "message", "role": "assistant", "model": params.get("model"),
            "content": [block], "stop_reason": "tool_use" if block["type"] == "tool_use" else "end_turn",
            "usage": {**self._prompt_usage(params), "output_tokens": tokens(content)},
        }

    def _prompt_usage(self, params: dict[str, Any]) -> dict[str, int]:
        """input, cache read and cache write tokens of ``params`` under the modelled prefix cache."""
        blocks = blocks_of(params)
        marked = [n for n, block in enumerate(blocks) if block.get("cache_control")]
        prefix = "".join(str(b.get("text") or "") for b in blocks[: marked[-1] + 1]) if marked else ""
        total = tokens("".join(str(b.get("text") or "") for b in blocks))
        cached = tokens(prefix)
        if cached < self.min_cached_tokens:
            prefix, cached = "", 0
        read = written = 0
        with self.cache_lock:
            if prefix in self.cached_prefixes:
                read = cached
            elif prefix:
                self.cached_prefixes.add(prefix)
                written = cached
        return {"input_tokens": total - read - written, "cache_read_input_tokens": read,
                "cache_creation_input_tokens": written}

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        requests = list(body.get("requests") or [])
        with self.lock:
            self.submitted.update(str(r["custom_id"]) for r in requests)
            self.batch_params.extend(r["params"] for r in requests)
            fate = "succeeded"
            if self.fail:
                self.fail, fate = self.fail - 1, "errored"
            elif self.expire:
                self.expire, fate = self.expire - 1, "expired"
            batch_id = f"msgbatch_{next(self._ids)}"
            batch = {
                "id": batch_id, "type": "message_batch", "processing_status": "in_progress",
                "request_counts": {"processing": len(requests), "succeeded": 0, "errored": 0, "canceled": 0,
                                   "expired": 0},
                "ended_at": None, "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "expires_at": None, "cancel_initiated_at": None, "results_url": None,
                "_requests": requests, "_fate": fate, "_number": len(self.batches) + 1, "_retrievals": 0,
            }
            self.batches[batch_id] = batch
        return public(batch)

    def retrieve(self, batch_id: str) -> dict[str, Any] | None:
        with self.lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return None
            batch["_retrievals"] += 1
            may_end = self.finishing is None or int(batch["_number"]) <= self.finishing
            if batch["processing_status"] != "ended" and batch["_retrievals"] >= 2 and may_end:
                self._end(batch)
            return public(batch)

    def cancel(self, batch_id: str) -> dict[str, Any] | None:
        with self.lock:
            batch = self.batches.get(batch_id)
            if batch is not None and batch["processing_status"] == "in_progress":
                batch["processing_status"] = "canceling"
                batch["cancel_initiated_at"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            return public(batch) if batch is not None else None

    def _end(self, batch: dict[str, Any]) -> None:
        """Answer a batch's requests (called under the lock)."""
        requests, fate = batch["_requests"], batch["_fate"]
        answering = len(requests) if fate != "expired" else self.expired_answers
        lines = []
        for number, request in enumerate(requests):
            if batch["cancel_initiated_at"] is not None:
                result: dict[str, Any] = {"type": "canceled"}
            elif number >= answering:
                result = {"type": "expired"}
            elif fate == "errored" or (behaviour := self.answers.next_fault().behaviour) not in ANSWERED:
                result = {"type": "errored",
                          "error": {"type": "error", "error": {"type": "api_error", "message": "internal error"}}}
            else:
                result = {"type": "succeeded", "message": self.message(request["params"], behaviour)}
            lines.append({"custom_id": request["custom_id"], "result": result})
        counts = Counter(line["result"]["type"] for line in lines)
        batch["request_counts"] = {kind: counts.get(kind, 0) for kind in ("succeeded", "errored", "canceled",
                                                                          "expired")} | {"processing": 0}
        batch["processing_status"] = "ended"
        batch["ended_at"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        batch["results_url"] = f"{self.origin}/v1/messages/batches/{batch['id']}/results"
        batch["_results"] = "".join(json.dumps(line) + "\n" for line in lines).encode()


def public(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch object as the API shows it (without the stand-in's own bookkeeping)."""
    return {key: value for key, value in batch.items() if not key.startswith("_")}


def _handler(state: AnthropicBatchServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            """Keep test output quiet."""

        def _send(self, status: int, body: dict[str, Any] | bytes, content_type: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _missing(self) -> None:
            self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": "no such object"}})

        def _parts(self) -> list[str]:
            with state.lock:
                state.headers.append({name.lower(): value for name, value in self.headers.items()})
            return self.path.split("?", 1)[0].strip("/").split("/")

        def do_GET(self) -> None:
            parts = self._parts()
            if parts == ["v1", "messages", "batches"]:
                rows = [public(batch) for batch in reversed(state.created_batches)]
                first, last = (rows[0]["id"], rows[-1]["id"]) if rows else (None, None)
                self._send(200, {"data": rows, "has_more": False, "first_id": first, "last_id": last})
            elif len(parts) == 4 and parts[:3] == ["v1", "messages", "batches"]:
                found = state.retrieve(parts[3])
                self._send(200, found) if found is not None else self._missing()
            elif len(parts) == 5 and parts[:3] == ["v1", "messages", "batches"] and parts[4] == "results":
                with state.lock:
                    results = state.batches.get(parts[3], {}).get("_results")
                self._send(200, results, "application/binary") if results is not None else self._missing()
            else:
                self._missing()

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            parts = self._parts()
            if parts == ["v1", "messages"]:
                params = json.loads(data)
                with state.lock:
                    state.online.append(params)
                fault = state.answers.next_fault()
                if fault.behaviour not in ANSWERED:
                    self._send(500, {"type": "error", "error": {"type": "api_error", "message": "internal error"}})
                    return
                self._send(200, state.message(params, fault.behaviour))
            elif parts == ["v1", "messages", "batches"]:
                self._send(200, state.create(json.loads(data or b"{}")))
            elif len(parts) == 5 and parts[:3] == ["v1", "messages", "batches"] and parts[4] == "cancel":
                found = state.cancel(parts[3])
                self._send(200, found) if found is not None else self._missing()
            else:
                self._missing()

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


@contextmanager
def anthropic_batch_server(
    reply: str | Callable[[dict[str, Any]], str], *faults: Fault
) -> Iterator[AnthropicBatchServer]:
    """Serve Anthropic's Messages API and Message Batches on a free port of 127.0.0.1 until the block
    ends; each request is answered as ``faults.fault_server(reply, *faults)`` would answer its text."""
    state = AnthropicBatchServer(answers=FaultServer(reply=reply, script=deque(faults)))
    server = _Server(("127.0.0.1", 0), _handler(state))
    state.origin = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
