"""What the ``rt4`` command does with an exception nobody handled: never exit 1, the code a CI job
reads as "hallucinations found".

A full disk or an output that cannot be written (``ENOSPC``, a read-only file system, permissions,
the file size limit) is the user's to fix: exit 2 with one line that names the file and says what
was kept. Anything else is a bug: exit 5 (:data:`rt4chart.runs.run.RunStatus.CRASHED`) with one line
and the path of a log holding the traceback (secrets scrubbed), to attach to a report.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from rt4chart.runs.run import EXIT_USAGE, RunStatus, exit_code
from rt4chart.scrubbing import scrub

_UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})
"""Errors of writing that the user fixes (room, permissions), not bugs."""


@dataclass(frozen=True)
class CrashExit:
    """The exit of a command that raised: its code and the one line to print."""

    code: int
    message: str


def crash_log_path() -> Path:
    """Where the traceback of this process's crash goes (the system's temporary folder)."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    return Path(tempfile.gettempdir()) / f"rt4chart-crash-{stamp}-{os.getpid()}.log"


def exit_for(error: BaseException) -> CrashExit:
    """The exit of a command that raised ``error`` (any exception but ``SystemExit`` and
    ``KeyboardInterrupt``, which have their own)."""
    if isinstance(error, OSError) and error.errno in _UNWRITABLE:
        where = f" {error.filename}" if error.filename else ""
        return CrashExit(
            EXIT_USAGE,
            f"cannot write{where}: {error.strerror}; the records written before it are kept (a torn last "
            "line is dropped by --resume); free the space or fix the permissions and rerun with --resume",
        )
    log = crash_log_path()
    details = "".join(traceback.format_exception(error))
    try:
        log.write_text(scrub(details), encoding="utf-8")
        where = f"the traceback is in {log}"
    except OSError as log_error:
        where = f"its traceback could not be written to {log} ({log_error.strerror})"
    summary = scrub(f"{type(error).__name__}: {error}")[:300]
    return CrashExit(
        exit_code(RunStatus.CRASHED),
        f"internal error ({summary}); {where}; please report it with that file",
    )
