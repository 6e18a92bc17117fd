"""A real stand-in for OpenAI's Batch API on 127.0.0.1: files, batches, their status progression,
output and error files, expiry and failures on purpose.

Endpoints (OpenAI's shapes): ``POST /v1/chat/completions`` (online, answered at once, as a vLLM
server with a batch runner would), ``POST /v1/files`` (multipart, ``purpose=batch``),
``GET /v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches`` (newest first),
``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``. A batch is ``validating`` when created,
``in_progress`` at its first retrieval, and finishes at a later one (``completed``, or ``expired`` /
``failed`` when the test says so) unless :attr:`BatchServer.finishing` holds it. Each line of a
finished batch is answered by the fault server's own reply logic (:meth:`faults.FaultServer.completion`
and its script of :class:`~faults.Fault`), so a batched request gets exactly the reply it would get
online. Every request line received is counted by ``custom_id``: a test proves from here that
nothing was submitted twice.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from faults import Fault, FaultServer

ANSWERED = frozenset({"ok", "prose", "fence", "think", "invalid_json"})
"""Fault behaviours a batch line is answered with (HTTP 200); any other is an error line (HTTP 500)."""


@dataclass
class BatchServer:
    """State shared with the handler threads."""

    answers: FaultServer
    """The online server's reply logic and fault script (never started: only its methods answer)."""
    files: dict[str, bytes] = field(default_factory=dict)
    """Uploaded and produced files by id."""
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Batch objects by id, as the API returns them."""
    submitted: Counter[str] = field(default_factory=Counter)
    """Request lines received in created batches, by ``custom_id``."""
    online: list[dict[str, Any]] = field(default_factory=list)
    """Bodies of the online ``/v1/chat/completions`` requests (the server answers both ways, as vLLM does)."""
    expire: int = 0
    """The next this many batches created expire instead of completing."""
    expired_answers: int = 0
    """Lines an expiring batch answers before it expires (the rest go to its error file as ``batch_expired``)."""
    fail: int = 0
    """The next this many batches created fail validation (status ``failed``, no output)."""
    finishing: int | None = None
    """How many of the batches created may finish (``None``: all); the later ones stay ``in_progress``,
    so a test can stop a client at any round."""
    created: threading.Event = field(default_factory=threading.Event)
    """Set each time a batch is created (a test clears it to wait for the next)."""
    base_url: str = ""
    """``http://127.0.0.1:PORT/v1`` once started."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    @property
    def created_batches(self) -> list[dict[str, Any]]:
        """Every batch created, in creation order."""
        with self.lock:
            return sorted(self.batches.values(), key=_number)

    def create(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            content = self.files.get(str(request.get("input_file_id")))
            if content is None:
                return 400, {"error": {"message": "no such input file", "type": "invalid_request_error"}}
            lines = [json.loads(line) for line in content.splitlines() if line.strip()]
            self.submitted.update(str(line["custom_id"]) for line in lines)
            fate = "completed"
            if self.fail:
                self.fail -= 1
                fate = "failed"
            elif self.expire:
                self.expire -= 1
                fate = "expired"
            batch = {
                "id": self.new_id("batch"), "object": "batch", "endpoint": request.get("endpoint"),
                "input_file_id": request["input_file_id"], "completion_window": request.get("completion_window"),
                "status": "validating", "output_file_id": None, "error_file_id": None, "errors": None,
                "created_at": int(time.time()), "metadata": request.get("metadata") or {},
                "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                "_lines": lines, "_fate": fate, "_number": len(self.batches) + 1,
            }
            self.batches[batch["id"]] = batch
        self.created.set()
        return 200, public(batch)

    def retrieve(self, batch_id: str) -> dict[str, Any] | None:
        with self.lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return None
            if batch["status"] == "validating":
                batch["status"] = "in_progress"
            elif batch["status"] == "in_progress" and (self.finishing is None or _number(batch) <= self.finishing):
                self._finish(batch)
            return public(batch)

    def cancel(self, batch_id: str) -> dict[str, Any] | None:
        with self.lock:
            batch = self.batches.get(batch_id)
            if batch is not None and batch["status"] in ("validating", "in_progress"):
                batch["status"] = "cancelled"
            return public(batch) if batch is not None else None

    def _finish(self, batch: dict[str, Any]) -> None:
        fate, lines = batch["_fate"], batch["_lines"]
        if fate == "failed":
            batch["status"] = "failed"
            batch["errors"] = {"object": "list", "data": [{"code": "invalid_file", "message": "failed on purpose"}]}
            return
        answered = lines if fate == "completed" else lines[: self.expired_answers]
        outputs, errors = [], []
        for line in answered:
            fault = self.answers.next_fault()
            body = line["body"]
            if fault.behaviour in ANSWERED:
                response = {"status_code": 200, "request_id": self.new_id("req"),
                            "body": self.answers.completion(body, fault.behaviour)}
                outputs.append({"id": self.new_id("batch_req"), "custom_id": line["custom_id"],
                                "response": response, "error": None})
            else:
                response = {"status_code": 500, "request_id": self.new_id("req"),
                            "body": {"error": {"message": "internal error", "type": "server_error"}}}
                errors.append({"id": self.new_id("batch_req"), "custom_id": line["custom_id"],
                               "response": response, "error": None})
        for line in lines[len(answered):]:
            errors.append({"id": self.new_id("batch_req"), "custom_id": line["custom_id"], "response": None,
                           "error": {"code": "batch_expired", "message": "not completed in time"}})
        batch["status"] = fate
        batch["request_counts"] = {"total": len(lines), "completed": len(outputs), "failed": len(errors)}
        for kind, rows in (("output_file_id", outputs), ("error_file_id", errors)):
            if rows:
                file_id = self.new_id("file")
                self.files[file_id] = "".join(json.dumps(row) + "\n" for row in rows).encode()
                batch[kind] = file_id


def _number(batch: dict[str, Any]) -> int:
    """The batch's place in creation order, from 1."""
    return int(batch["_number"])


def public(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch object as the API shows it (without the stand-in's own bookkeeping)."""
    return {key: value for key, value in batch.items() if not key.startswith("_")}


def _uploaded_file(content_type: str, data: bytes) -> tuple[str | None, bytes | None]:
    """``purpose`` and the ``file`` part of a multipart upload."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + data
    )
    purpose, content = None, None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if name == "purpose" and isinstance(payload, bytes):
            purpose = payload.decode()
        elif name == "file" and isinstance(payload, bytes):
            content = payload
    return purpose, content


def _handler(state: BatchServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            """Keep test output quiet."""

        def _send(self, status: int, body: dict[str, Any] | bytes) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _missing(self) -> None:
            self._send(404, {"error": {"message": f"no such object: {self.path}", "type": "invalid_request_error"}})

        def do_GET(self) -> None:
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            if parts[1:] == ["batches"]:
                rows = [public(batch) for batch in reversed(state.created_batches)]
                self._send(200, {"object": "list", "data": rows, "has_more": False})
            elif len(parts) == 3 and parts[1] == "batches":
                found = state.retrieve(parts[2])
                self._send(200, found) if found is not None else self._missing()
            elif len(parts) == 4 and parts[1] == "files" and parts[3] == "content":
                with state.lock:
                    content = state.files.get(parts[2])
                self._send(200, content) if content is not None else self._missing()
            else:
                self._missing()

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            parts = self.path.split("?", 1)[0].strip("/").split("/")
            if parts[1:] == ["files"]:
                purpose, content = _uploaded_file(self.headers.get("Content-Type", ""), data)
                if purpose != "batch" or content is None:
                    self._send(400, {"error": {"message": "purpose=batch and a file", "type": "invalid_request_error"}})
                    return
                with state.lock:
                    file_id = state.new_id("file")
                    state.files[file_id] = content
                self._send(200, {"id": file_id, "object": "file", "bytes": len(content), "purpose": "batch"})
            elif parts[1:] == ["chat", "completions"]:
                body = json.loads(data)
                with state.lock:
                    state.online.append(body)
                self._send(200, state.answers.completion(body))
            elif parts[1:] == ["batches"]:
                self._send(*state.create(json.loads(data or b"{}")))
            elif len(parts) == 4 and parts[1] == "batches" and parts[3] == "cancel":
                found = state.cancel(parts[2])
                self._send(200, found) if found is not None else self._missing()
            else:
                self._missing()

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


@contextmanager
def batch_server(reply: str | Callable[[dict[str, Any]], str], *faults: Fault) -> Iterator[BatchServer]:
    """Serve the Batch API on a free port of 127.0.0.1 until the block ends; each line is answered as
    ``faults.fault_server(reply, *faults)`` would answer it online."""
    state = BatchServer(answers=FaultServer(reply=reply, script=deque(faults)))
    server = _Server(("127.0.0.1", 0), _handler(state))
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
