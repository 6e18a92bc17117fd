"""The Ray processes a driver started die with it, however it dies (SIGKILL included).

A local cluster started by ``ray.init`` (``rt4 verify --engine ray`` without ``--address``) is a
tree of processes: the GCS server and the raylet under the driver, Ray's agents and workers under
the raylet. When the driver is killed, the raylet's agents were seen to live on for 25 s and more.
:func:`watch_driver` starts this module as a separate process holding the read end of a pipe whose
write end only the driver holds: the pipe reaches end-of-file when the driver exits or is killed,
and the watchdog then kills every process of the tree it has seen (it refreshes the tree while it
waits, so workers and agents started later are known when their parent is already gone).

    python -m rt4chart.runs.ray_watchdog   (stdin: one JSON line, the root process ids; then EOF)
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from typing import IO

import psutil

REFRESH_S = 0.5
"""How often the watchdog refreshes the tree while the driver lives."""

GRACE_S = 2.0
"""Seconds the processes get to end on SIGTERM before SIGKILL."""


def ray_children(driver: int) -> list[int]:
    """Process ids of the driver's children that Ray started (its command line names ray)."""
    found = []
    for child in psutil.Process(driver).children():
        try:
            if "ray" in " ".join(child.cmdline()).lower():
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def watch_driver(roots: list[int]) -> subprocess.Popen[bytes]:
    """Start the watchdog over ``roots`` (and every process they start); it acts once this
    process ends. Keep the returned handle: closing its stdin is the driver's normal exit too."""
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "rt4chart.runs.ray_watchdog"], stdin=subprocess.PIPE, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    assert watchdog.stdin is not None
    watchdog.stdin.write((json.dumps(roots) + "\n").encode())
    watchdog.stdin.flush()
    return watchdog


def _tree(known: dict[int, psutil.Process], roots: list[psutil.Process]) -> None:
    """Add every live process under ``roots`` to ``known`` (a process object remembers its start
    time, so a reused process id is never mistaken for one of the tree)."""
    for root in roots:
        try:
            for process in [root, *root.children(recursive=True)]:
                known.setdefault(process.pid, process)
        except psutil.Error:
            continue


def _wait_for_eof(pipe: IO[bytes], known: dict[int, psutil.Process], roots: list[psutil.Process]) -> None:
    descriptor = pipe.fileno()
    while True:
        _tree(known, roots)
        readable, _, _ = select.select([descriptor], [], [], REFRESH_S)
        if readable and not os.read(descriptor, 4096):
            return


def main() -> None:
    pipe = sys.stdin.buffer
    roots: list[psutil.Process] = []
    for pid in json.loads(pipe.readline() or b"[]"):
        try:
            roots.append(psutil.Process(pid))
        except psutil.Error:
            continue
    known: dict[int, psutil.Process] = {}
    _wait_for_eof(pipe, known, roots)
    _tree(known, roots)
    alive = [process for process in known.values() if process.is_running()]
    for process in alive:
        try:
            process.terminate()
        except psutil.Error:
            continue
    _, left = psutil.wait_procs(alive, timeout=GRACE_S)
    for process in left:
        try:
            process.kill()
        except psutil.Error:
            continue


if __name__ == "__main__":
    main()
