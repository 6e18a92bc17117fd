"""Audits of production traces read from a tracing server (:mod:`rt4chart.records.live_sources`): where a
source's watermark lives, reading the source from it, and moving it once the audit is done.

The watermark of a source is a file in ``watermarks/`` under the judge cache's directory (``--cache-dir``,
else the per-user default; with ``--cache-url`` or ``--no-cache``, the per-user default too), so an
interrupted nightly job and its rerun share it. It moves only after a run that audited every trace it read
(no stop, no open verdict, every verdict written back under ``--write-back``): otherwise it stays where it
was, and the rerun reads the same traces again, their judge calls paid once through the cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from rt4chart.judges.cache import default_cache_dir
from rt4chart.records.langfuse import LangfuseMapping
from rt4chart.records.langfuse_server import read_langfuse
from rt4chart.records.live_sources import LiveSource
from rt4chart.records.phoenix import PhoenixSource, read_phoenix
from rt4chart.records.server_reads import SourceRead, read_watermark, watermark_path, write_watermark
from rt4chart.records.traces import TraceError, TraceMapping, load_mapping
from rt4chart.runs.run import RunOutcome
from rt4chart.runs.spec import RunSpec
from rt4chart.runs.write_back import WriteBackResult, write_back_failed


def watermark_directory(spec: RunSpec) -> Path:
    """The folder of the run's watermarks (see the module's docstring)."""
    return (spec.cache if isinstance(spec.cache, Path) else default_cache_dir()) / "watermarks"


def source_mapping(source: LiveSource, path: Path | None) -> TraceMapping | LangfuseMapping:
    """The mapping ``--trace-mapping`` names for ``source``: a file of :class:`TraceMapping`'s fields for
    Phoenix (its spans are OTLP's), of :class:`LangfuseMapping`'s for Langfuse (``None``: the defaults);
    :class:`TraceError` for a file that is not one."""
    if isinstance(source, PhoenixSource):
        return load_mapping(path, TraceMapping)
    return load_mapping(path, LangfuseMapping)


def read_project(spec: RunSpec, source: LiveSource, since: timedelta | None,
                 mapping: TraceMapping | LangfuseMapping | None = None) -> SourceRead:
    """The traces of ``source`` not audited yet (after its watermark, within ``since``), read under
    ``mapping`` (a :class:`TraceMapping` for Phoenix, a :class:`LangfuseMapping` for Langfuse, as
    :func:`source_mapping` reads one; ``None``: the defaults); :class:`TraceError` for the other kind."""
    watermark = read_watermark(watermark_path(watermark_directory(spec), source))
    if isinstance(source, PhoenixSource):
        if isinstance(mapping, LangfuseMapping):
            raise TraceError(f"{source.name}: a Phoenix project is read with a TraceMapping, not a LangfuseMapping")
        return read_phoenix(source, since, watermark, mapping)
    if isinstance(mapping, TraceMapping):
        raise TraceError(f"{source.name}: a Langfuse project is read with a LangfuseMapping, not a TraceMapping")
    return read_langfuse(source, since, watermark, mapping)


def audited_everything(outcome: RunOutcome[Any]) -> bool:
    """Whether a run gave every line its final record: no stop, no verdict left open."""
    return outcome.stop is None and outcome.counts.incomplete == 0


def advance_watermark(spec: RunSpec, source: LiveSource, read: SourceRead, outcome: RunOutcome[Any],
                      written_back: Sequence[WriteBackResult] | None = None) -> bool:
    """Move ``source``'s watermark past what ``read`` gave when the run audited all of it (and, under
    ``--write-back``, ``written_back`` holds no failure); whether it moved."""
    if read.watermark is None or not audited_everything(outcome) or write_back_failed(written_back or []):
        return False
    write_watermark(watermark_path(watermark_directory(spec), source), read.watermark)
    return True
