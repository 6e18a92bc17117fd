"""Verdicts written back where the team reads its traces (``rt4 verify --write-back``): a Phoenix span
annotation on each audited answer's LLM span, or a Langfuse score on its trace and generation (on the
server a ``langfuse://`` input was read from, else ``LANGFUSE_HOST``).

One verdict per answer, named ``rt4chart``: its label (entailed / contradicted / baseless), its score (the
share of claims the context entails), an explanation (the claims that are not entailed, with their
evidence), and as metadata every claim with its label, answer span and evidence, the judge and the prompt
version. Writes are idempotent: Phoenix's annotation carries the identifier ``rt4chart`` (same span, name
and identifier: updated in place) and Langfuse's score an id derived from trace and observation (same id:
updated), so a rerun updates, never duplicates. Everything sent is scrubbed like every other output
(:func:`rt4chart.scrubbing.scrub_value`: keys in the environment, the target's own key, key-shaped
tokens). The key goes to the target's host only: redirects are not followed.

A record without a verdict (invalid input, a verdict left open) is not written (``skipped``); a write the
server refuses or that cannot reach it is ``failed``, with the reason: each record's outcome is a line of
``OUT.write-back.jsonl``, and a failure makes the run exit 4 (README "Exit codes").
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict

from rt4chart.records.io import read_records
from rt4chart.records.langfuse_server import LangfuseSource
from rt4chart.records.phoenix import PhoenixSource, phoenix_headers
from rt4chart.report.tables import support_score
from rt4chart.runs.run import RunStatus, exit_code
from rt4chart.scrubbing import scrub, scrub_value, secrets_in_environment
from rt4chart.types import AuditRecord, Evidence, Label

VERDICT_NAME = "rt4chart"
"""The annotation's (score's) name, and Phoenix's identifier of it."""
PHOENIX_BATCH = 100
"""Annotations sent in one request."""
TIMEOUT_S = 60.0
"""One request's deadline."""


class WriteBackError(ValueError):
    """A write-back that cannot start: no target for the input, or its credentials missing."""


@dataclass(frozen=True)
class LangfuseTarget:
    """A Langfuse server and its project keys (``LANGFUSE_HOST``, ``LANGFUSE_PUBLIC_KEY``,
    ``LANGFUSE_SECRET_KEY``)."""

    host: str
    public_key: str
    secret_key: str

    @classmethod
    def from_environment(cls, source: LangfuseSource | None = None) -> LangfuseTarget:
        """The server ``source`` was read from (the keys go to the host they were read with), else
        ``LANGFUSE_HOST`` / ``LANGFUSE_BASE_URL``; the keys of the environment."""
        host = source.base_url if source else os.environ.get("LANGFUSE_HOST") or os.environ.get("LANGFUSE_BASE_URL")
        public, secret = os.environ.get("LANGFUSE_PUBLIC_KEY"), os.environ.get("LANGFUSE_SECRET_KEY")
        missing = [name for name, value in (("LANGFUSE_HOST", host), ("LANGFUSE_PUBLIC_KEY", public),
                                            ("LANGFUSE_SECRET_KEY", secret)) if not value]
        if missing or host is None or public is None or secret is None:
            raise WriteBackError(f"--write-back to Langfuse needs {', '.join(missing)} in the environment")
        return cls(host.rstrip("/"), public, secret)


Target = PhoenixSource | LangfuseTarget
"""Where verdicts go."""


class WriteBackResult(BaseModel):
    """What became of one record's verdict (a line of ``OUT.write-back.jsonl``)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    id: str | None
    """The record's id (the trace id)."""
    line: int
    """The record's line."""
    target: str
    """Where it was sent: the Phoenix project or the Langfuse host."""
    span_id: str | None = None
    """The span (Phoenix) or observation (Langfuse) the verdict is on."""
    status: Literal["written", "skipped", "failed"]
    """``skipped``: the record has no verdict to write."""
    error: str | None = None
    """Why it was skipped or failed."""


def _evidence(evidence: Evidence) -> dict[str, Any]:
    """One evidence as sent: its text and context sentences, and the retrieved document it quotes (its
    id and the quote's offsets in it, so a trace viewer can point at the document the retriever returned)."""
    sent: dict[str, Any] = {"text": evidence.text, "sentence_ids": evidence.sentence_ids}
    if evidence.source is not None:
        sent |= {"document": evidence.source.document, "document_span": [evidence.source.start, evidence.source.end]}
    return sent


def verdict(record: AuditRecord) -> dict[str, Any]:
    """The verdict of one answer as sent: label, score, explanation, metadata (not scrubbed yet)."""
    unsupported = [claim for claim in record.claims if claim.label is not Label.ENTAILED]
    lines = [f"{len(record.claims) - len(unsupported)} of {len(record.claims)} claims entailed by the context."]
    for claim in unsupported:
        evidence = "; ".join(e.text + (f" [{e.source.document}]" if e.source else "") for e in claim.evidence)
        label = claim.label.value if claim.label else "open"
        lines.append(f"{label}: {claim.text}" + (f" (context: {evidence})" if evidence else ""))
    claims = [{
        "text": claim.text, "label": claim.label.value if claim.label else None,
        "answer_span": [claim.answer_span.start, claim.answer_span.end] if claim.answer_span else None,
        "evidence": [_evidence(e) for e in claim.evidence],
    } for claim in record.claims]
    return {
        "label": record.label.value if record.label else None, "score": round(support_score(record), 4),
        "explanation": "\n".join(lines),
        "metadata": {"claims": claims, "hallucinated": record.hallucinated, "judge": record.judge,
                     "prompt_version": record.prompt_version},
    }


def _span_of(record: AuditRecord) -> str | None:
    trace = record.trace
    return None if trace is None else trace.answer_span_id or trace.root_span_id


def _skip_reason(record: AuditRecord) -> str | None:
    if record.trace is None:
        return "the record names no trace"
    if record.label is None or record.incomplete:
        return "no verdict (invalid input or a verdict left open)"
    return None


def _failure(error: Exception | httpx.Response, secrets: Sequence[str]) -> str:
    if isinstance(error, httpx.Response):
        return scrub(f"HTTP {error.status_code}: {error.text[:200]}", secrets)
    return scrub(f"{type(error).__name__}: {error}", secrets)


def _phoenix(records: list[AuditRecord], source: PhoenixSource, secrets: Sequence[str]) -> list[WriteBackResult]:
    results: list[WriteBackResult] = []
    with httpx.Client(base_url=source.base_url, headers=phoenix_headers(), timeout=TIMEOUT_S,
                      follow_redirects=False) as client:
        for first in range(0, len(records), PHOENIX_BATCH):
            batch = records[first:first + PHOENIX_BATCH]
            annotations = []
            for record in batch:
                sent = scrub_value(verdict(record), secrets)
                annotations.append({
                    "span_id": _span_of(record), "name": VERDICT_NAME, "annotator_kind": "LLM",
                    "identifier": VERDICT_NAME, "metadata": sent["metadata"],
                    "result": {"label": sent["label"], "score": sent["score"], "explanation": sent["explanation"]},
                })
            try:
                response = client.post("/v1/span_annotations", params={"sync": "true"}, json={"data": annotations})
                error = None if response.is_success else _failure(response, secrets)
            except httpx.HTTPError as failure:
                error = _failure(failure, secrets)
            results += [WriteBackResult(id=r.id, line=r.line, target=source.name, span_id=_span_of(r),
                                        status="failed" if error else "written", error=error) for r in batch]
    return results


def langfuse_score_id(trace_id: str, observation_id: str | None) -> str:
    """The id of rt4chart's score on a trace's observation: the same on every rerun."""
    return "rt4chart-" + hashlib.sha256(f"{trace_id}/{observation_id or ''}".encode()).hexdigest()[:32]


def _langfuse(records: list[AuditRecord], target: LangfuseTarget, secrets: Sequence[str]) -> list[WriteBackResult]:
    token = base64.b64encode(f"{target.public_key}:{target.secret_key}".encode()).decode()
    results: list[WriteBackResult] = []
    with httpx.Client(base_url=target.host, headers={"Authorization": f"Basic {token}"}, timeout=TIMEOUT_S,
                      follow_redirects=False) as client:
        for record in records:
            if (trace := record.trace) is None:  # never: such records are skipped before
                continue
            sent = scrub_value(verdict(record), secrets)
            observation = trace.answer_span_id
            score = {
                "id": langfuse_score_id(trace.trace_id, observation), "traceId": trace.trace_id,
                "observationId": observation, "name": VERDICT_NAME, "dataType": "CATEGORICAL",
                "value": sent["label"], "comment": sent["explanation"],
                "metadata": {**sent["metadata"], "support": sent["score"]},
            }
            try:
                response = client.post("/api/public/scores", json=score)
                error = None if response.is_success else _failure(response, secrets)
            except httpx.HTTPError as failure:
                error = _failure(failure, secrets)
            results.append(WriteBackResult(id=record.id, line=record.line, target=target.host, span_id=observation,
                                           status="failed" if error else "written", error=error))
    return results


def write_back(records: Iterable[AuditRecord], target: Target) -> list[WriteBackResult]:
    """Each record's verdict written to ``target`` (see the module's docstring), its outcome in order."""
    secrets = sorted(secrets_in_environment() | ({target.secret_key, target.public_key}
                                                 if isinstance(target, LangfuseTarget) else set()))
    name = target.name if isinstance(target, PhoenixSource) else target.host
    results: dict[int, WriteBackResult] = {}
    writable: list[AuditRecord] = []
    for record in records:
        if reason := _skip_reason(record):
            results[record.line] = WriteBackResult(id=record.id, line=record.line, target=name, status="skipped",
                                                   span_id=_span_of(record), error=reason)
        else:
            writable.append(record)
    sent = _phoenix(writable, target, secrets) if isinstance(target, PhoenixSource) else \
        _langfuse(writable, target, secrets)
    results.update((result.line, result) for result in sent)
    return [results[line] for line in sorted(results)]


def results_path(out: Path) -> Path:
    """Where the write-back's outcome of the records in ``out`` goes: ``OUT.write-back.jsonl``."""
    return out.with_name(out.name + ".write-back.jsonl")


def write_back_records(out: Path, target: Target) -> list[WriteBackResult]:
    """The verdicts of the finished records in ``out`` written to ``target``; each record's outcome also
    written to :func:`results_path`."""
    records = (line.report for line in read_records(out) if line.report is not None)
    results = write_back(records, target)
    results_path(out).write_text("".join(json.dumps(r.model_dump(mode="json")) + "\n" for r in results),
                                 encoding="utf-8")
    return results


def exit_code_after(run_exit_code: int, results: Iterable[WriteBackResult]) -> int:
    """A run's exit code once its verdicts were written back: 4 when one could not be written, unless the
    run already ended with a code that says more (2, 3, 4)."""
    settled = {exit_code(RunStatus.PASSED), exit_code(RunStatus.FAILED)}
    if run_exit_code in settled and write_back_failed(results):
        return exit_code(RunStatus.INCOMPLETE)
    return run_exit_code


def write_back_failed(results: Iterable[WriteBackResult]) -> bool:
    """Whether a verdict could not be written back."""
    return any(result.status == "failed" for result in results)
