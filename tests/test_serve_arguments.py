"""``rt4 serve`` with arguments it cannot serve (issue 40): a port in use, a garbage model and
``--port -5`` were exit 5 (xllamacpp says only "Failed to init server"), and ``--port 70000`` and
``--parallel 0`` were accepted. Each is now exit 2 with what is wrong, before any model loads."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_module

ROOT = Path(__file__).resolve().parent.parent


def rt4_serve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "rt4chart", "serve", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("args", "message"), [
    (["--port", "-5"], "--port"), (["--port", "70000"], "--port"), (["--parallel", "0"], "--parallel"),
    (["--ctx-per-request", "0"], "--ctx-per-request"), (["--threads", "0"], "--threads"),
])
def test_out_of_range_numbers_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    done = rt4_serve(*args, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr and "internal error" not in done.stderr, done.stderr


def test_a_file_that_is_no_gguf_model_is_named(tmp_path: Path) -> None:
    require_module("xllamacpp", "rt4 serve")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(os.urandom(4096).replace(b"GGUF", b"GGUX"))
    done = rt4_serve("--model", str(garbage), "--port", "0", cwd=tmp_path)
    assert done.returncode == 2 and "is not a GGUF model file" in done.stderr, done.stderr


def test_a_damaged_gguf_model_is_exit_2(tmp_path: Path) -> None:
    require_module("xllamacpp", "rt4 serve")
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(b"GGUF" + bytes(4096))
    done = rt4_serve("--model", str(damaged), "--port", "0", cwd=tmp_path)
    assert done.returncode == 2 and f"llama.cpp could not start on {damaged}" in done.stderr, done.stderr


def test_a_port_in_use_is_named(tmp_path: Path) -> None:
    require_module("xllamacpp", "rt4 serve")
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(64))  # refused for its port before llama.cpp reads it
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = rt4_serve("--model", str(model), "--port", str(port), cwd=tmp_path)
    assert done.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in done.stderr, done.stderr
