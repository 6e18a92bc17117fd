"""What a run is, declared once and light to import: :class:`RunSpec` and the models nested in it that
only a run has (:class:`SignalSpec`, :class:`CacheChoice`).

Every field's docstring is its ``--help`` text and its ``json_schema_extra["panel"]`` its ``--help`` panel
(:class:`~rt4chart.options.HelpPanel`): :func:`rt4chart.cli.flags.run_spec` gives a command a flag per field it
names (``limits.budget_usd`` -> ``--budget``, ``options.window`` -> ``--window``) and calls it with the
``RunSpec`` the flags make. A field whose flag is not its name says so in ``json_schema_extra={"flag": ...}``
(spellings separated by commas: ``"--out,-o"``; a bool written as one switch, ``"--no-cache"``, is that
switch alone). This module imports nothing heavy (no numpy, no litellm): ``rt4 --help`` builds its flags
from it; the run itself lives in :mod:`rt4chart.runs.run`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.fields import FieldInfo

from rt4chart.judges.budget import RunLimits
from rt4chart.options import AuditOptions, HelpPanel
from rt4chart.protocol import Backend
from rt4chart.report.outputs import PublishOptions
from rt4chart.runs.engine import EngineOptions


class SignalSpec(BaseModel):
    """White-box token signals added to each record before it is written (``--signals``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: Literal["csr", "attention"] = Field(json_schema_extra={"flag": "--signals", "panel": HelpPanel.SIGNALS})
    """Add white-box token signals to each record before it is written: csr, or attention (needs
    --signal-probe); both need --signal-model."""
    model: Path = Field(json_schema_extra={"flag": "--signal-model", "panel": HelpPanel.SIGNALS})
    """Model directory or GGUF file for --signals."""
    probe: Path | None = Field(default=None, json_schema_extra={"flag": "--signal-probe", "panel": HelpPanel.SIGNALS})
    """Probe file from `rt4 signals train`, for --signals attention."""
    server: str | None = Field(default=None, json_schema_extra={"flag": "--signal-server", "panel": HelpPanel.SIGNALS})
    """Base URL of a vLLM server for --signals (prompt_logprobs)."""
    delta: float = Field(default=0.2, json_schema_extra={"flag": "--signal-delta", "panel": HelpPanel.SIGNALS})
    """CSR threshold for --signals csr."""
    use_cache: bool = True
    """Read and write the per-user signal cache (the CLI: not --no-cache)."""

    @field_validator("delta")
    @classmethod
    def _finite(cls, delta: float) -> float:
        if not math.isfinite(delta):
            raise ValueError("must be a finite number")
        return delta


class CacheChoice(BaseModel):
    """How the CLI spells :attr:`RunSpec.cache` (one field, three flags): a directory, a Redis URL, or
    none. :func:`rt4chart.cli.flags.run_spec` turns the choice into the field's value."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    cache_dir: Path | None = Field(default=None, json_schema_extra={"panel": HelpPanel.JUDGE})
    """Judge-call cache directory (default: per-user cache)."""
    cache_url: str | None = Field(default=None, json_schema_extra={"panel": HelpPanel.JUDGE})
    """Cache judge calls on this Redis server (redis://HOST:PORT/DB) instead of --cache-dir; needs the redis
    extra."""
    no_cache: bool = Field(default=False, json_schema_extra={"flag": "--no-cache", "panel": HelpPanel.JUDGE})
    """Neither read nor write the cache."""


class RunSpec(BaseModel):
    """Everything that shapes one run besides its input: declared once, used by every entry point."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, arbitrary_types_allowed=True)

    # From Python the judge may also be a Backend of the caller's (the CLI offers the text forms).
    judge: str | Backend | None = Field(default=None, json_schema_extra={"panel": HelpPanel.JUDGE})
    """Judge: a profile name (rt4 judges), a profile FILE.toml (e.g. a fleet), a litellm model (openai/NAME
    with --api-base), cascade:A@0.8,B, vote:A,B,C or scripted:RULES.json (default: the embedded offline
    verifier)."""
    api_base: str | None = Field(default=None, json_schema_extra={"panel": HelpPanel.JUDGE})
    """Base URL of an OpenAI-compatible or vLLM server."""
    limits: RunLimits = Field(default_factory=RunLimits)
    """Budget in USD, judge calls in flight, seconds per HTTP attempt."""
    cache: Path | str | None = None
    """Judge-call cache: a directory, a ``redis://`` URL, or ``None`` for no cache (the CLI: :class:`CacheChoice`)."""
    options: AuditOptions = Field(default_factory=AuditOptions)
    """The audit's options (they bind records for ``--resume``)."""
    engine: EngineOptions = Field(default_factory=EngineOptions)
    """Where the audit runs (this process or a Ray cluster); changes no record."""
    input_file: Path | None = None
    """The input file, when there is one: outputs may never overwrite it."""
    out: Path | None = Field(default=None, json_schema_extra={"flag": "--out,-o", "panel": HelpPanel.OUTPUTS})
    """Output JSONL (default: stdout), written atomically under the file's lock."""
    resume: bool = Field(default=False, json_schema_extra={"flag": "--resume", "panel": HelpPanel.RESUME})
    """Keep records already complete in --out (same input and configuration); audit the rest."""
    outputs: PublishOptions = Field(default_factory=PublishOptions)
    """What a finished run writes besides its records (view, HTML, JUnit, annotations) and how it
    decides failure."""
    signals: SignalSpec | None = None
    """White-box signals added to each record before it is written; ``None``: none."""


def field_at(path: str) -> FieldInfo:
    """The :class:`RunSpec` field at ``path`` (``limits.budget_usd``, ``options.window``); ``cache.*`` are
    the fields of :class:`CacheChoice`, the three flags of the one field ``RunSpec.cache``."""
    model: type[BaseModel] = RunSpec
    *parents, name = path.split(".")
    for parent in parents:
        annotation = CacheChoice if (model, parent) == (RunSpec, "cache") else model.model_fields[parent].annotation
        model = next(m for m in (annotation, *get_args(annotation)) if isinstance(m, type) and issubclass(m, BaseModel))
    return model.model_fields[name]


def field_extra(info: FieldInfo) -> dict[str, Any]:
    """What a field declares for its flag (``panel``, ``flag``): its ``json_schema_extra``."""
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def flag_of(path: str) -> str:
    """Every spelling of the flag of the field at ``path``: its ``json_schema_extra["flag"]`` as written
    (``--out,-o``), else its name (``--window``; a bool both ways, ``--batch-claims/--no-batch-claims``)."""
    info = field_at(path)
    if "flag" in field_extra(info):
        return str(field_extra(info)["flag"])
    flag = "--" + path.rsplit(".", 1)[-1].replace("_", "-")
    return f"{flag}/--no-{flag.removeprefix('--')}" if info.annotation is bool else flag


def nested_fields(values: Mapping[str, Any]) -> dict[str, Any]:
    """Values by dotted path as the nested fields of a model (``{"limits": {"budget_usd": 1.0}}``)."""
    fields: dict[str, Any] = {}
    for path, value in values.items():
        *parents, name = path.split(".")
        level = fields
        for parent in parents:
            level = level.setdefault(parent, {})
        level[name] = value
    return fields


AUDIT_FLAGS = tuple(f"options.{name}" for name in AuditOptions.model_fields)
"""A flag per :class:`AuditOptions` field: ``rt4 verify``, ``estimate``, ``eval``, ``compare`` and ``repair``."""

CACHE_FLAGS = ("cache.cache_dir", "cache.cache_url", "cache.no_cache")
"""``--cache-dir``, ``--cache-url`` and ``--no-cache``: the judge cache of a run."""

RUN_FLAGS = (
    "out", "resume", "judge", "api_base", "limits.concurrency", "limits.budget_usd", "limits.timeout_s",
    "limits.batch", "limits.batch_poll_s",
    *CACHE_FLAGS, "engine.engine", "engine.address", "engine.workers",
    "engine.worker_cpus", "signals.kind", "signals.model", "signals.probe", "signals.server", "signals.delta",
)
"""The run flags of ``rt4 verify``, in the order of its ``--help``."""

OUTPUT_FLAGS = ("outputs.html", "outputs.junit", "outputs.github", "outputs.fail_on", "outputs.max_rate",
                "outputs.baseline")
"""The output and CI flags of ``rt4 verify`` (``rt4 report`` takes all but ``--report``, its ``--html``)."""
