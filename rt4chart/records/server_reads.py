"""What every live trace source shares (a Phoenix project, :mod:`rt4chart.records.phoenix`; a Langfuse
server, :mod:`rt4chart.records.langfuse_server`): the ``--since`` window, the watermark that makes the next
audit read only what is new, and a server's JSON page read within bounds.

A :class:`Watermark` remembers, per source, the start of the last audited trace (a Phoenix trace's root
span, a Langfuse trace's ``timestamp``) and the traces that started at that very nanosecond: the next read
asks from there and skips them, so a nightly job audits each trace once. Traces that started before the
window (the watermark or ``--since``) are not audited, and counted (:attr:`SourceRead.before_window`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict

from rt4chart.records.io import InputLine
from rt4chart.records.traces import TraceError
from rt4chart.scrubbing import scrub

if TYPE_CHECKING:
    import httpx

MAX_PAGE_BYTES = 256 * 2**20
"""The most bytes one answer's body may hold once decoded (a page of 1,000 spans with their documents fits
in far less)."""
TIMEOUT_S = 60.0
"""One request's deadline."""


class ServerRefusal(TraceError):
    """A server answered a read with another status than 200."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status it answered."""


class NamedSource(Protocol):
    """A live trace source: its :attr:`name` says it in messages and keys its watermark."""

    @property
    def name(self) -> str:
        """How the source is named in messages and in its watermark."""
        ...


def parse_duration(text: str) -> timedelta:
    """``90s``, ``30m``, ``24h``, ``7d`` as a duration; :class:`ValueError` otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 30m, 24h, 7d)")
    amount, unit = float(match.group(1)), match.group(2)
    return timedelta(seconds=amount * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit])


def unix_ns(moment: datetime) -> int:
    """``moment`` (timezone-aware) as Unix nanoseconds, exactly (integer microseconds, no float)."""
    return (moment - datetime.fromtimestamp(0, UTC)) // timedelta(microseconds=1) * 1000


class Watermark(BaseModel):
    """How far a source has been audited."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    source: str
    """The source (its :attr:`NamedSource.name`)."""
    root_start_ns: int
    """Start time (Unix nanoseconds) of the latest trace audited: its root span's (Phoenix), its
    ``timestamp`` (Langfuse)."""
    trace_ids: list[str]
    """The traces audited that started at exactly ``root_start_ns``."""


def watermark_path(directory: Path, source: NamedSource) -> Path:
    """Where ``source``'s watermark lives in ``directory`` (one file per source)."""
    return directory / f"{hashlib.sha256(source.name.encode()).hexdigest()[:16]}.json"


def read_watermark(path: Path) -> Watermark | None:
    """The watermark stored at ``path`` (``None``: none yet); an unreadable one is a :class:`TraceError`."""
    if not path.exists():
        return None
    try:
        return Watermark.model_validate_json(path.read_bytes())
    except (OSError, ValueError) as error:
        raise TraceError(f"the watermark {path} cannot be read ({error}); remove it to audit the window "
                         "again") from None


def write_watermark(path: Path, watermark: Watermark) -> None:
    """Store ``watermark`` at ``path`` (written whole, then moved into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(watermark.model_dump_json(indent=1), encoding="utf-8")
    partial.replace(path)


@dataclass(frozen=True)
class SourceRead:
    """What one read of a live trace source gave."""

    items: list[InputLine]
    """One item per trace in the window, in start order (then, for Phoenix, one per span that names no
    trace)."""
    watermark: Watermark | None
    """The watermark once these items are audited (``None``: nothing new was read)."""
    before_window: int
    """Traces seen that started before the window (already audited, or older than ``--since``)."""


def window_floor(since: timedelta | None, watermark: Watermark | None, now: datetime | None = None) -> int | None:
    """The earliest start (Unix nanoseconds) a trace may have to be read: the later of the watermark and
    ``now - since`` (``None``: no bound)."""
    floors = [watermark.root_start_ns] if watermark else []
    if since is not None:
        floors.append(unix_ns((now or datetime.now(UTC)) - since))
    return max(floors, default=None)


def audited_at_floor(watermark: Watermark | None, floor: int | None) -> set[str]:
    """The traces the watermark says were audited at ``floor`` (to skip: the read starts at that instant)."""
    return set(watermark.trace_ids) if watermark and watermark.root_start_ns == floor else set()


def advanced(source: NamedSource, watermark: Watermark | None, started: Sequence[tuple[int, str]]) -> Watermark | None:
    """The watermark once the traces ``started`` (``(start ns, trace id)``, in start order) are audited
    (``None``: none were read)."""
    if not started:
        return None
    last = started[-1][0]
    at_last = [trace_id for start, trace_id in started if start == last]
    if watermark is not None and watermark.root_start_ns == last:
        at_last = sorted({*watermark.trace_ids, *at_last})
    return Watermark(source=source.name, root_start_ns=last, trace_ids=at_last)


def get_json(client: httpx.Client, path: str, params: Mapping[str, str | int] | Sequence[tuple[str, str | int]],
             server: str, asked: str, secrets: Sequence[str] = ()) -> Any:
    """The JSON a server answers to ``GET path``, its body read decoded and cut at :data:`MAX_PAGE_BYTES`
    (a server cannot fill the memory of a run); anything else (a refusal: :class:`ServerRefusal`, a body
    that is not JSON, a transport failure) is a :class:`TraceError` naming ``server`` and what was
    ``asked``, with ``secrets`` scrubbed from what the server said."""
    import httpx

    try:
        query = tuple(params.items() if isinstance(params, Mapping) else params)
        with client.stream("GET", path, params=query) as response:
            if response.status_code != 200:
                response.read()
                said = scrub(response.text[:200], secrets)
                raise ServerRefusal(f"{server} answered {response.status_code} for {asked}: {said}",
                                    response.status_code)
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_PAGE_BYTES:
                    raise TraceError(f"{server}: an answer for {asked} over {MAX_PAGE_BYTES:,} bytes")
    except httpx.HTTPError as error:
        raise TraceError(f"{server} cannot be read: {type(error).__name__}: {scrub(str(error), secrets)}") from None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise TraceError(f"{server} answered something that is not JSON for {asked}") from None
