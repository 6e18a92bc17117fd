"""A local stand-in of the Hugging Face hub's HTTP API, serving the files of folders on disk: the two
endpoints ``huggingface_hub`` calls to pull a model (``HF_ENDPOINT`` pointed at it):

- ``GET /api/models/{repo}/revision/{revision}?blobs=true``: the commit and the files, each weight
  file with its LFS sha256 (``HfApi.model_info(..., files_metadata=True)``);
- ``HEAD`` / ``GET /{repo}/resolve/{revision}/{file}``: a file, with ``X-Repo-Commit``, ``ETag`` and
  ``Content-Length`` (``hf_hub_download``).

A revision that is a commit is echoed as the commit (as the hub does); a branch resolves to
:data:`BRANCH_COMMIT`. Every request is recorded, so a test can tell that none was made.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BRANCH_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
"""The commit a branch name (``main``) resolves to."""

LFS_SUFFIXES = (".safetensors", ".bin")
"""Files the hub stores in LFS (their listing carries a sha256)."""


@dataclass
class HubStandIn:
    """Repositories served (``repo id -> folder``), files served damaged, and the requests seen."""

    repos: dict[str, Path]
    damaged: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def body(self, repo: str, name: str) -> bytes:
        data = (self.repos[repo] / name).read_bytes()
        return data[:-1] + bytes([data[-1] ^ 1]) if name in self.damaged else data


def _commit(revision: str) -> str:
    return revision if re.fullmatch(r"[0-9a-f]{40}", revision) else BRANCH_COMMIT


def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return None

        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _route(self) -> None:
            hub.requests.append(f"{self.command} {self.path}")
            path = self.path.split("?", 1)[0]
            listing = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
            download = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            repo = (listing or download).group(1) if (listing or download) else None  # type: ignore[union-attr]
            if repo not in hub.repos:
                self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
            elif listing:
                siblings = []
                for file in sorted(hub.repos[repo].iterdir()):
                    entry: dict[str, object] = {"rfilename": file.name, "size": file.stat().st_size}
                    if file.suffix in LFS_SUFFIXES:
                        digest = hashlib.sha256(file.read_bytes()).hexdigest()
                        entry["lfs"] = {"sha256": digest, "size": file.stat().st_size, "pointerSize": 134}
                    siblings.append(entry)
                info = {"id": repo, "sha": _commit(listing.group(2)), "siblings": siblings, "private": False}
                self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
            elif download and (hub.repos[repo] / download.group(3)).is_file():
                body = hub.body(repo, download.group(3))
                self._send(200, body, {"X-Repo-Commit": _commit(download.group(2)),
                                       "ETag": f'"{hashlib.sha256(body).hexdigest()}"'})
            else:
                self._send(404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"})

        do_GET = _route
        do_HEAD = _route

    return Handler


@contextmanager
def hub_standin(repos: dict[str, Path], damaged: set[str] | None = None) -> Iterator[HubStandIn]:
    """Serve ``repos`` on 127.0.0.1 while the block runs; yields the stand-in (its ``url`` is ``HF_ENDPOINT``)."""
    hub = HubStandIn(repos=repos, damaged=damaged or set())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
