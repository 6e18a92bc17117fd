"""A run is an artifact: the manifest written beside an audit's records.

``rt4 verify --out audit.jsonl`` also writes ``audit.jsonl.manifest.json``: the judge and its
identity hash, the prompt version, every audit option, the input file's sha256, counts per label,
calls, tokens, cost, wall time, rt4chart's version, start and end time, and the sha256 of the
records it describes. It lives beside the records rather than in their first line so that every
reader of records (``rt4 report``, ``rt4 score``, ``rt4 agree``, jq, pandas) keeps reading one
record per line. ``rt4 diff`` reads it when it is there; a records file without one (made before
manifests existed, or copied alone) still compares, with the judge and prompt version read from its
records and the options unknown.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rt4chart.options import AuditOptions
from rt4chart.records.io import STDIN, audit_fingerprint, discards, file_sha256, write_lines_atomically
from rt4chart.records.io import manifest_path as manifest_path  # kept in io with the other sidecars, named here too
from rt4chart.types import RunCitations, Usage

MANIFEST_SCHEMA = "rt4chart.run-manifest/1"


class ManifestError(ValueError):
    """A manifest file that exists but cannot be read as one."""


class InputFacts(BaseModel):
    """The input file an audit read."""

    path: str | None
    """The input as the user named it (``-`` for standard input; ``None``: samples given in code)."""
    sha256: str | None
    """sha256 of the input file's bytes; ``None`` for standard input or samples given in code."""
    lines: int
    """Input lines (blank lines excluded)."""


class RunCounts(BaseModel):
    """The one tally of a run: what it found (the manifest's ``counts``) and, left out of the
    manifest, how it went (written, resumed, remaining) and what its policy counts as failing."""

    records: int = 0
    """Output records (one per input line)."""
    labels: dict[str, int] = Field(default_factory=dict)
    """Answers per label (entailed, contradicted, baseless)."""
    hallucinated: int = 0
    """Answers with a claim that is not entailed."""
    claims: dict[str, int] = Field(default_factory=dict)
    """Claims per final label (``unjudged`` when a judge error left one open)."""
    incomplete: int = 0
    """Records whose verdict a judge failure left open."""
    invalid: int = 0
    """Input lines that could not be audited."""
    citations: RunCitations | None = Field(default=None, exclude_if=lambda value: value is None)
    """Citation figures over the answers that carry citation markers (left out when none does)."""
    failing: int = Field(default=0, exclude=True)
    """Judged answers that fail the run's ``--fail-on`` policy (not in the manifest)."""
    written: int = Field(default=0, exclude=True)
    """Records written by this run (the manifest's top level says what was resumed or reused)."""
    resumed: int = Field(default=0, exclude=True)
    """Records kept from an earlier run (``--resume``)."""
    remaining: int = Field(default=0, exclude=True)
    """Input lines the run did not audit because it stopped."""
    flagged: int = Field(default=0, exclude=True)
    """Records with flagged tokens or spans (``rt4 signals``)."""

    @property
    def judged(self) -> int:
        """Answers with a verdict (invalid lines and open verdicts excluded)."""
        return sum(self.labels.values())


class RunManifest(BaseModel):
    """Everything needed to know what an audit file is and to compare it with another one."""

    schema_version: str = MANIFEST_SCHEMA
    """Format of this file."""
    rt4chart_version: str
    """The installed rt4chart that ran the audit."""
    judge: str
    """The judge's name, which is its identity (``embedded#<hash>``, ``scripted:FILE#<hash>``, ...)."""
    judge_sha256: str
    """sha256 of the judge's name: one fixed-length identity to compare or index by."""
    prompt_version: str
    """Hash of the prompt templates and their rendering code."""
    options: dict[str, Any]
    """Every audit option (:class:`rt4chart.options.AuditOptions`), defaults included."""
    configuration_sha256: str
    """The audit configuration's fingerprint (judge, prompt version, options): what each record's
    ``input_hash`` is bound to."""
    input: InputFacts
    """The input file."""
    records_sha256: str
    """sha256 of the records file as written, to tell whether this manifest still describes it."""
    counts: RunCounts
    """Counts per label."""
    usage: Usage
    """Judge calls, tokens and cost of this run, as its ledger booked them (records kept by
    ``--resume`` or reused from a baseline cost nothing now; cache hits never reach the ledger:
    each record's ``usage`` counts its own)."""
    resumed: int = 0
    """Records kept from an earlier run of the same file (``--resume``)."""
    reused_from_baseline: int = 0
    """Records taken from ``--baseline`` without a judge call (same input line, same configuration)."""
    baseline: str | None = None
    """The baseline records file (``--baseline``), when one was given."""
    started_at: datetime
    """When the audit started (UTC)."""
    ended_at: datetime
    """When its outputs were published (UTC)."""
    wall_s: float
    """Seconds from start to end."""


def rt4chart_version() -> str:
    try:
        return version("rt4chart")
    except PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def write_manifest(
    out: Path,
    counts: RunCounts,
    *,
    judge: str,
    prompt_version: str,
    options: AuditOptions,
    input_path: Path | str | None,
    input_lines: int,
    usage: Usage,
    started_at: datetime,
    ended_at: datetime,
    resumed: int = 0,
    reused_from_baseline: int = 0,
    baseline: Path | None = None,
) -> Path | None:
    """Write the manifest of the finished records file ``out``; return its path (``None`` for the
    null device, whose records were dropped: no manifest beside it).

    Call it once the records are final (after signals are attached): it hashes the file as it is.
    """
    if discards(out):
        return None
    readable = input_path is not None and str(input_path) != STDIN
    manifest = RunManifest(
        rt4chart_version=rt4chart_version(),
        judge=judge,
        judge_sha256=hashlib.sha256(judge.encode()).hexdigest(),
        prompt_version=prompt_version,
        options=options.model_dump(mode="json"),
        configuration_sha256=audit_fingerprint(judge, prompt_version, options),
        input=InputFacts(
            path=None if input_path is None else str(input_path),
            sha256=file_sha256(Path(input_path)) if readable and input_path is not None else None,
            lines=input_lines,
        ),
        records_sha256=file_sha256(out),
        counts=counts,
        usage=usage,
        resumed=resumed,
        reused_from_baseline=reused_from_baseline,
        baseline=None if baseline is None else str(baseline),
        started_at=started_at,
        ended_at=ended_at,
        wall_s=round((ended_at - started_at).total_seconds(), 3),
    )
    path = manifest_path(out)
    write_lines_atomically(path, [manifest.model_dump_json(indent=2)])
    return path


def read_manifest(records: Path) -> RunManifest | None:
    """The manifest beside ``records``, or ``None`` when there is none (an older records file).

    Raises :class:`ManifestError` for a manifest file that is not one.
    """
    path = manifest_path(records)
    if not path.exists():
        return None
    if not path.is_file():
        raise ManifestError(f"{path}: not an rt4chart run manifest (not a regular file)")
    try:
        return RunManifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except OSError as error:
        raise ManifestError(f"{path}: cannot read the run manifest ({error.strerror})") from None
    except RecursionError:  # json's decoder recurses: a manifest nested 100,000 deep
        raise ManifestError(f"{path}: not an rt4chart run manifest (nested too deep)") from None
    except ValueError as error:  # not JSON, not UTF-8, an integer over Python's digit limit, not a manifest
        problem = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ManifestError(f"{path}: not an rt4chart run manifest ({problem})") from None


def describes(manifest: RunManifest, records: Path) -> bool:
    """Whether ``manifest`` was written for the records file as it is now (not edited since)."""
    return manifest.records_sha256 == file_sha256(records)
