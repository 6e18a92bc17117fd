"""``rt4 signals csr|attention|train``: white-box token signals of a self-hosted model
(:mod:`rt4chart.signals`), written as records of their own (``rt4 verify --signals`` adds the same to
audit records, in the run layer)."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rt4chart.cli.common import InputArgument, _guard_outputs, _read_input, _ReadableGroup
from rt4chart.cli.flags import fail, stderr

if TYPE_CHECKING:
    from rt4chart.signals.aggtruth import AttentionRecord, AttentionSetup
    from rt4chart.signals.csr import SignalRecord

commands = typer.Typer(
    cls=_ReadableGroup, name="signals", help="White-box token signals of a self-hosted model.", no_args_is_help=True
)

LIBRARY_BARS_OFF = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error"}
"""The switches that keep huggingface_hub's, transformers' and every tqdm progress bar out of a log
(their ``\\r`` redraws fill a redirected stderr); read by the libraries when they load."""


@commands.callback()
def _no_library_bars_in_logs() -> None:
    """When stderr is not a terminal, turn the libraries' progress bars off before any of them loads
    (a setting of the user's own stays)."""
    if not sys.stderr.isatty():
        for name, value in LIBRARY_BARS_OFF.items():
            os.environ.setdefault(name, value)


def _phase(text: str) -> None:
    """A line saying what a long step does now (a model loading, features extracted)."""
    stderr.print(f"rt4: {text}", highlight=False, markup=False, soft_wrap=True)


SignalModelOption = Annotated[Path, typer.Option(help="Model directory or GGUF file (its tokenizer gives the offsets; with --server, the server must serve the same model).")]
SignalServerOption = Annotated[str | None, typer.Option(help="Base URL of a vLLM server (prompt_logprobs) to score on instead of in process.")]
DeltaOption = Annotated[float, typer.Option(help="Flag answer tokens with CSR >= delta.")]


def _signal_backend(model: Path, server: str | None, delta: float, batch_size: int | None = None) -> Any:
    """The signal backend, or a usage error (missing extra, unreadable model, unreachable server)."""
    from rt4chart.signals import SignalError, open_backend

    if not math.isfinite(delta):
        raise fail("--delta must be a finite number")
    if batch_size is not None and batch_size < 1:
        raise fail("--batch-size must be at least 1")
    try:
        return open_backend(model, server=server, batch_size=batch_size)
    except SignalError as error:
        raise fail(str(error)) from None


@commands.command("csr")
def signals_csr(
    input_path: InputArgument,
    model: SignalModelOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL: per input line, token scores with answer offsets and flagged spans.")],
    delta: DeltaOption = 0.2,
    server: SignalServerOption = None,
    batch_size: Annotated[int, typer.Option(help="Sequences per forward pass (in process).")] = 4,
    cache_dir: Annotated[Path | None, typer.Option(help="Signal cache directory (default: per-user cache).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the signal cache.")] = False,
) -> None:
    """REFIND's context sensitivity ratio of every answer token of INPUT.jsonl."""
    from rt4chart.signals import SignalError
    from rt4chart.signals.csr import SignalCache, csr_records

    out = _guard_outputs({"--out": out}, [input_path, model])["--out"]
    items = _read_input(input_path)
    backend = _signal_backend(model, server, delta, batch_size)
    cache = None if no_cache else SignalCache(cache_dir)
    try:
        records = csr_records(items, backend, delta=delta, cache=cache)
    except SignalError as error:
        raise fail(str(error)) from None
    _write_signal_records(out, records, "with flagged tokens")


def _write_signal_records(out: Path, records: Sequence[SignalRecord] | Sequence[AttentionRecord], flagged: str) -> None:
    """Write the records through the run layer (which decides the exit: 2 when a line failed) and say
    how many were flagged and how many failed."""
    from rt4chart.runs.run import write_signal_records

    outcome = write_signal_records(out, records)
    stderr.print(f"wrote {outcome.counts.records} records to {out}: {outcome.counts.flagged} {flagged}, "
                 f"{outcome.counts.invalid} with errors", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(outcome.exit_code)


def _attention_setup(model: Path, probe_path: Path) -> AttentionSetup:
    """The probe and the model it reads, or a usage error."""
    from rt4chart.signals import SignalError
    from rt4chart.signals.aggtruth import open_attention_probe

    try:
        return open_attention_probe(model, probe_path)
    except SignalError as error:
        raise fail(str(error)) from None


SignalCacheDirOption = Annotated[Path | None, typer.Option(help="Signal cache directory (default: per-user cache).")]
NoSignalCacheOption = Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the signal cache.")]


@commands.command("attention")
def signals_attention(
    input_path: InputArgument,
    model: Annotated[Path, typer.Option(help="Model directory or GGUF file (the one the probe was trained on).")],
    probe: Annotated[Path, typer.Option(help="Probe file from `rt4 signals train`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL: per input line, window and token scores with answer offsets and flagged spans.")],
    cache_dir: SignalCacheDirOption = None,
    no_cache: NoSignalCacheOption = False,
) -> None:
    """AggTruth attention-probe scores of every answer of INPUT.jsonl (per window, per token, flagged spans)."""
    from rt4chart.signals import SignalError
    from rt4chart.signals.aggtruth import attention_records
    from rt4chart.signals.attention import FeatureCache

    out = _guard_outputs({"--out": out}, [input_path, model, probe])["--out"]
    items = _read_input(input_path)
    setup = _attention_setup(model, probe)
    try:
        records = attention_records(
            items, setup.extractor, setup.probe, setup.name, None if no_cache else FeatureCache(cache_dir)
        )
    except SignalError as error:
        raise fail(str(error)) from None
    _write_signal_records(out, records, "flagged")


@commands.command("train")
def signals_train(
    gold_path: Annotated[Path, typer.Argument(help="Labelled JSONL (the output of `rt4 convert`), or - for stdin.", show_default=False)],
    model: Annotated[Path, typer.Option(help="Model directory or GGUF file whose attention the probe reads.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Probe file to write (JSON).")],
    feature: Annotated[str, typer.Option(help="AggTruth feature: sum, cossim, entropy or jsdiv.")] = "sum",
    selector: Annotated[str, typer.Option(help="Head selector. AggTruth's: center:R, random:N:K, random-positive:N:K, spearman (the default: best on held-out RAGTruth QA dev, evals/signals/RESULTS_aggtruth.md). Ours: spearman:significant, spearman:R, lasso[:C], best-of-random:N:K, best-of-random-positive:N:K, layers-center:R, all.")] = "spearman",
    seed: Annotated[int, typer.Option(help="Seed of the random selectors.")] = 0,
    cache_dir: SignalCacheDirOption = None,
    no_cache: NoSignalCacheOption = False,
) -> None:
    """Train an AggTruth probe on labelled answers: 8-token windows, class-balanced logistic regression."""
    from rt4chart.signals import SignalError, require_sklearn
    from rt4chart.signals.aggtruth import gold_samples, train_from_gold
    from rt4chart.signals.attention import FEATURES, FeatureCache, open_attention_extractor
    from rt4chart.signals.probe import parse_selector, save_probe

    if feature not in FEATURES:
        raise fail(f"--feature must be one of {', '.join(FEATURES)} (got {feature!r})")
    out = _guard_outputs({"--out": out}, [gold_path, model])["--out"]
    items = _read_input(gold_path)
    try:
        parsed = parse_selector(selector)
        require_sklearn()
        samples = gold_samples(items)
        _phase(f"loading {model}")
        extractor = open_attention_extractor(model)
        _phase(f"reading the attention of {len(samples)} answers, then fitting the {feature} probe")
        probe = train_from_gold(
            samples, extractor, feature=feature, selector=parsed, cache=None if no_cache else FeatureCache(cache_dir), seed=seed
        )
    except SignalError as error:
        raise fail(str(error)) from None
    save_probe(probe, out)
    stderr.print(
        f"wrote {out}: {feature} probe on {len(probe.columns)} heads ({probe.selector}), "
        f"{probe.training.windows} windows ({probe.training.positive_windows} positive) from {len(samples)} answers",
        highlight=False, markup=False, soft_wrap=True,
    )
