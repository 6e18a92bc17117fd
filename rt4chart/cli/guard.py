"""``rt4 guard``: flags in, the guardrail service of :mod:`rt4chart.runs.guard` started."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, get_args

import typer

from rt4chart.cli.flags import fail, stderr
from rt4chart.types import Label

commands = typer.Typer()


@commands.command()
def guard(
    host: Annotated[str, typer.Option(help="Address to bind; beyond 127.0.0.1 a token is required.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to bind (0: a free one).")] = 8404,
    judge: Annotated[str | None, typer.Option(help="Judge as rt4 verify --judge takes it (default: embedded).")] = None,
    api_base: Annotated[
        str | None, typer.Option(help="Base URL of the judge's OpenAI-compatible server (as rt4 verify --api-base).")
    ] = None,
    upstream: Annotated[
        str | None,
        typer.Option(help="OpenAI-compatible base URL (…/v1): serve /v1/chat/completions as an auditing proxy."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="RT4_GUARD_TOKEN", show_envvar=True, help="Bearer token every request but /health must carry."
        ),
    ] = None,
    block_on: Annotated[
        list[Label] | None, typer.Option(help="Label that blocks an answer (repeat; default: contradicted).")
    ] = None,
    flag_on: Annotated[
        list[Label] | None, typer.Option(help="Label that flags an answer (repeat; default: baseless).")
    ] = None,
    on_incomplete: Annotated[
        str, typer.Option(help="Decision when the judge could not finish: flag or block (never pass).")
    ] = "flag",
    max_in_flight: Annotated[int, typer.Option(min=1, help="Requests audited at once.")] = 4,
    max_queued: Annotated[int, typer.Option(min=0, help="Requests waiting; beyond them 429 with Retry-After.")] = 16,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body (413 beyond it).")] = 1_000_000,
    max_sentences: Annotated[int, typer.Option(min=1, help="Answer sentences per request (413 beyond).")] = 50,
    max_claims: Annotated[
        int, typer.Option(min=1, help="Claims per request, counted before any is verified (413 beyond).")
    ] = 200,
    latency_budget_ms: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Milliseconds a cascade's later stages may take per audited text; claims left open keep an "
            "earlier stage's judgement, marked, and the decision is at least --on-incomplete.",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.001, help="Seconds one request may take (408 beyond).")] = 30.0,
    cache_dir: Annotated[
        str | None, typer.Option(help="Judge cache directory or redis:// URL shared by all requests.")
    ] = None,
    budget: Annotated[float | None, typer.Option(min=0.0, help="USD spend cap shared by all requests.")] = None,
    audit_log: Annotated[Path | None, typer.Option(help="Append every answer's record to this JSONL file.")] = None,
    decomposer: Annotated[
        str,
        typer.Option(
            help="How answers become claims: auto, rules, judge or holistic, as rt4 verify --decomposer (auto: "
            "rules under --latency-budget-ms)."
        ),
    ] = "auto",
) -> None:
    """Serve the audit over HTTP: POST /v1/verify (and /v1/chat/completions with --upstream), /health, /metrics."""
    import asyncio
    import os

    from pydantic import ValidationError

    from rt4chart.judges.registry import JudgeConfigError
    from rt4chart.options import AuditOptions, DecomposerKind
    from rt4chart.runs.guard import UPSTREAM_KEY_ENV, GuardConfig, GuardConfigError, GuardLimits, GuardPolicy, serve
    from rt4chart.runs.telemetry import TelemetryUnavailable

    if on_incomplete not in {"flag", "block"}:
        raise fail(f"--on-incomplete must be flag or block (got {on_incomplete!r})")
    if decomposer not in get_args(DecomposerKind):
        raise fail(f"--decomposer must be {', '.join(get_args(DecomposerKind))} (got {decomposer!r})")
    try:
        policy = GuardPolicy(
            block_on=frozenset(block_on or [Label.CONTRADICTED]),
            flag_on=frozenset(flag_on or [Label.BASELESS]),
            on_incomplete="block" if on_incomplete == "block" else "flag",
        )
        limits = GuardLimits(
            max_in_flight=max_in_flight,
            max_queued=max_queued,
            max_body_bytes=max_body_bytes,
            max_sentences=max_sentences,
            max_claims=max_claims,
            latency_budget_ms=latency_budget_ms,
            timeout_s=timeout,
        )
        config = GuardConfig(
            host=host,
            port=port,
            judge=judge,
            api_base=api_base,
            cache=cache_dir,
            budget_usd=budget,
            token=token or None,
            upstream=upstream,
            upstream_key=os.environ.get(UPSTREAM_KEY_ENV) or None,
            audit_log=audit_log,
            policy=policy,
            limits=limits,
            options=AuditOptions(decomposer=decomposer),  # type: ignore[arg-type]  # checked above
        )
        config.check()
    except (ValidationError, GuardConfigError) as error:
        raise fail(str(error)) from None

    def ready(url: str) -> None:
        stderr.print(
            f"rt4 guard: serving on {url} (Ctrl-C stops after the requests in flight)", highlight=False, markup=False
        )

    try:
        asyncio.run(serve(config, ready))
    except (JudgeConfigError, OSError, TelemetryUnavailable) as error:  # an unknown judge, a port in use
        raise fail(str(error)) from None
