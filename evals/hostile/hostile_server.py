"""A hostile OpenAI-compatible (and vLLM-completions) server on 127.0.0.1 for the hostile probes:
replies that are gzip bombs, bodies that never end, headers or bodies that trickle in a byte at a
time, and redirects to another origin. Every behaviour is bounded on the server's side (bytes sent
and seconds spent per connection), so a probe whose client is not bounded still ends.
"""

from __future__ import annotations

import functools
import json
import socket
import struct
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from faults import grounded

Mode = Literal["ok", "gzip_bomb", "endless", "trickle_headers", "trickle_body", "redirect"]

SERVER_BOUND_S = 170.0
"""The longest any one connection is kept busy by the server (the probes' clients should give up first)."""
ENDLESS_CAP_BYTES = 6 * 2**30
"""What an endless body sends at most (past any client's memory limit in the probes)."""
BOMB_DECODED_BYTES = 2 * 2**30
"""What the gzip bomb's body decodes to (its size on the wire is about 2 MB)."""


@functools.cache
def _gzip_bomb() -> bytes:
    """A chat completion whose ``content`` is ``BOMB_DECODED_BYTES`` of "a", gzip-compressed: one
    MiB of "a" deflated once after a full flush (so its bytes are the same wherever it stands) and
    repeated, with the CRC and size of the whole in the trailer."""
    head = b'{"id": "bomb", "object": "chat.completion", "model": "m", "choices": [{"index": 0, ' \
           b'"finish_reason": "stop", "message": {"role": "assistant", "content": "'
    tail = b'"}}]}'
    block = b"a" * 2**20
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    opening = compressor.compress(head) + compressor.flush(zlib.Z_FULL_FLUSH)
    repeated = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
    closing = compressor.compress(tail) + compressor.flush(zlib.Z_FINISH)
    blocks = BOMB_DECODED_BYTES // len(block)
    crc = zlib.crc32(head)
    for _ in range(blocks):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(tail, crc)
    size = len(head) + blocks * len(block) + len(tail)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    return header + opening + repeated * blocks + closing + struct.pack("<II", crc, size & 0xFFFFFFFF)


@dataclass
class HostileServer:
    """One server's behaviour and what it saw."""

    mode: Mode
    redirect_to: str = ""
    """For ``redirect``: the URL (of another origin) every POST is sent to with a 307."""
    requests: list[str] = field(default_factory=list)
    """The path of every request received."""
    base_url: str = ""
    bomb: bytes = b""


def _handler(state: HostileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            state.requests.append(self.path)
            self._json(200, {"object": "list", "data": [{"id": "m", "object": "model"}]})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            state.requests.append(self.path)
            started = time.monotonic()
            if state.mode == "redirect":
                self.send_response(307)
                self.send_header("Location", state.redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif state.mode == "gzip_bomb":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(state.bomb)))
                self.end_headers()
                self.wfile.write(state.bomb)
            elif state.mode == "endless":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"a" * 2**16
                framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
                head = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "'
                self.wfile.write(f"{len(head):x}\r\n".encode() + head + b"\r\n")
                sent = 0
                while sent < ENDLESS_CAP_BYTES and time.monotonic() - started < SERVER_BOUND_S:
                    self.wfile.write(framed)
                    sent += len(chunk)
            elif state.mode == "trickle_headers":
                reply = self._reply_bytes(body)
                for byte in reply:
                    if time.monotonic() - started > SERVER_BOUND_S:
                        break
                    self.wfile.write(bytes([byte]))
                    time.sleep(0.5)
            elif state.mode == "trickle_body":
                content = json.dumps(self._completion(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                for byte in content:
                    if time.monotonic() - started > SERVER_BOUND_S:
                        break
                    self.wfile.write(bytes([byte]))
                    time.sleep(0.5)
            else:
                self._json(200, self._completion(body))

        def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
            if "prompt" in body:  # vLLM's completions with prompt_logprobs
                return {"choices": [{"index": n, "text": "", "prompt_logprobs": [None] * len(ids)}
                                    for n, ids in enumerate(body["prompt"])]}
            message = {"role": "assistant", "content": grounded(body)}
            return {"id": "ok", "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70}}

        def _reply_bytes(self, body: dict[str, Any]) -> bytes:
            content = json.dumps(self._completion(body)).encode()
            head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(content)}\r\n"
                    "X-Padding: " + "x" * 64 + "\r\n\r\n").encode()
            return head + content

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            content = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up mid-reply is what the probes expect


@contextmanager
def hostile_server(mode: Mode, redirect_to: str = "") -> Iterator[HostileServer]:
    """A running server in ``mode`` on 127.0.0.1 (a free port); ``base_url`` ends in ``/v1``."""
    state = HostileServer(mode, redirect_to, bomb=_gzip_bomb() if mode == "gzip_bomb" else b"")
    server = _Server(("127.0.0.1", 0), _handler(state))
    server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
