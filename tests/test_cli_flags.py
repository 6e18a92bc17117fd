"""The flags of ``rt4``: built from model fields (:mod:`rt4chart.cli.flags`), each in the ``--help`` panel
its field declares, and made into the model by one function; the CLI in modules a reader can take in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
from typer.core import TyperOption
from typer.testing import CliRunner

import rt4chart.cli.app
from rt4chart.cli.app import app
from rt4chart.cli.flags import AUDIT_FLAGS, OUTPUT_FLAGS, RUN_FLAGS, field_at, flag_of, panel_of, run_spec
from rt4chart.judges.budget import RunLimits
from rt4chart.judges.cache import default_cache_dir
from rt4chart.options import AuditOptions, FailOn
from rt4chart.report.outputs import PublishOptions
from rt4chart.runs.engine import EngineOptions
from rt4chart.runs.spec import CacheChoice, RunSpec, SignalSpec

EVERY_RUN_FIELD = [
    *(name for name in RunSpec.model_fields if name in ("judge", "api_base", "out", "resume")),
    *(f"limits.{name}" for name in RunLimits.model_fields),
    *(f"cache.{name}" for name in CacheChoice.model_fields),
    *(f"engine.{name}" for name in EngineOptions.model_fields),
    *(f"signals.{name}" for name in SignalSpec.model_fields if name != "use_cache"),
    *(f"outputs.{name}" for name in ("html", "junit", "github", "fail_on", "max_rate", "baseline")),
    *AUDIT_FLAGS,
]
"""Every field a command may offer as a flag (the rest of RunSpec is set by the commands, never a flag)."""


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        found += _commands(sub, (*path, name))
    return found


def _built_from(option: TyperOption) -> str | None:
    """The field an option was built from: the one whose flag and docstring it carries."""
    for path in EVERY_RUN_FIELD:
        spelled = flag_of(path).split(",")[0].split("/")[0]
        if option.opts[0] == spelled and (option.help or "").startswith(field_at(path).description or "\0"):
            return path
    return None


def test_every_field_a_command_can_offer_declares_its_help_panel() -> None:
    # A new AuditOptions field (every one is a flag) or run field without json_schema_extra={"panel": ...} fails here.
    assert [path for path in EVERY_RUN_FIELD if panel_of(path) is None] == []


def test_every_flag_built_from_a_field_sits_in_the_panel_its_field_declares() -> None:
    built: dict[tuple[str, ...], list[str]] = {}
    for path, command in _commands(typer.main.get_command(app)):
        for option in (param for param in command.params if isinstance(param, TyperOption)):
            field = _built_from(option)
            if field is not None:
                assert option.rich_help_panel == panel_of(field) is not None, (path, option.opts)
                built.setdefault(path, []).append(field)
    # Not vacuous: rt4 verify offers every audit option, run flag and output flag, each from its field.
    assert sorted(built[("verify",)]) == sorted([*AUDIT_FLAGS, *RUN_FLAGS, *OUTPUT_FLAGS])
    assert {("estimate",), ("eval",), ("compare",), ("repair",), ("report",), ("cache", "stats")} <= set(built)


def test_no_module_of_the_cli_is_over_400_lines() -> None:
    lengths = {path.name: len(path.read_text(encoding="utf-8").splitlines())
               for path in Path(rt4chart.cli.app.__file__).parent.glob("*.py")}
    assert {name: lines for name, lines in lengths.items() if lines > 400} == {}
    assert len(lengths) >= 6, "one module per command group"


def _spec_of(*args: str, per_user_cache: bool = True) -> tuple[int, RunSpec | None, str]:
    """What a command with every run flag receives from ``args`` (exit code, spec, stderr)."""
    received: list[RunSpec] = []
    probe = typer.Typer()

    @probe.command()
    @run_spec(*RUN_FLAGS, *OUTPUT_FLAGS, *AUDIT_FLAGS, per_user_cache=per_user_cache)
    def command(*, spec: RunSpec) -> None:
        received.append(spec)

    result = CliRunner().invoke(probe, list(args), catch_exceptions=False)
    return result.exit_code, received[0] if received else None, result.stderr


def test_the_flags_become_the_run_spec_they_spell(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    code, spec, _ = _spec_of(
        "--judge", "scripted:rules.json", "--budget", "0.5", "--concurrency", "3", "--window", "5", "--overlap", "2",
        "--no-global", "--workers", "3", "--signals", "csr", "--signal-model", str(model), "--signal-delta", "0.3",
        "--no-cache", "--fail-on", "contradicted", "--report", str(tmp_path / "r.html"),
        "--out", str(tmp_path / "o.jsonl"), "--resume",
    )
    assert code == 0
    assert spec == RunSpec(
        judge="scripted:rules.json", limits=RunLimits(budget_usd=0.5, concurrency=3),
        options=AuditOptions(window=5, overlap=2, global_verification=False), engine=EngineOptions(workers=3),
        signals=SignalSpec(kind="csr", model=model, delta=0.3, use_cache=False), cache=None,
        outputs=PublishOptions(fail_on=FailOn.CONTRADICTED, html=tmp_path / "r.html"), out=tmp_path / "o.jsonl",
        resume=True,
    )


def test_without_flags_the_run_is_the_default_one_with_the_cache_the_command_chooses(tmp_path: Path) -> None:
    assert _spec_of()[1] == RunSpec(cache=default_cache_dir())
    assert _spec_of(per_user_cache=False)[1] == RunSpec(cache=None)  # rt4 eval: runs are independent
    assert _spec_of("--cache-dir", str(tmp_path), per_user_cache=False)[1] == RunSpec(cache=tmp_path)
    assert _spec_of("--cache-url", "redis://127.0.0.1:1/0")[1] == RunSpec(cache="redis://127.0.0.1:1/0")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--decomposer", "spans"], "--decomposer must be judge, rules, auto or holistic (got 'spans')"),
        (["--engine", "spark"], "--engine must be local or ray (got 'spark')"),
        (["--signals", "logits", "--signal-model", "m.gguf"], "--signals must be csr or attention (got 'logits')"),
        (["--signals", "csr"], "--signal-model is required: Model directory or GGUF file for --signals"),
        # A signal flag without --signals was ignored: it is refused, naming the flag that is missing.
        (["--signal-delta", "0.3"], "--signals is required"),
        (["--signals", "csr", "--signal-model", "m", "--signal-delta", "nan"], "--signal-delta: must be a finite"),
        (["--window", "4", "--overlap", "4"], "--overlap: overlap must be smaller than a valid window"),
        (["--citation-pattern", "["], "--citation-pattern: citation_pattern is not a regular expression"),
        (["--cache-dir", "c", "--cache-url", "redis://127.0.0.1:1/0"], "--cache-dir and --cache-url are alternatives"),
    ],
)
def test_a_wrong_flag_is_a_usage_error_that_names_it(args: list[str], message: str) -> None:
    code, spec, stderr = _spec_of(*args)
    assert (code, spec) == (2, None)
    assert message in " ".join(stderr.split()) and "Traceback" not in stderr


def test_every_wrong_flag_is_named_at_once() -> None:
    code, _, stderr = _spec_of("--window", "0", "--timeout", "nan", "--signals", "csr")
    assert code == 2
    assert all(flag in stderr for flag in ("--window", "--timeout", "--signal-model")), stderr


def _help_of(*command: str) -> dict[str, Any]:
    group = typer.main.get_command(app)
    for name in command:
        group = group.commands[name]  # type: ignore[attr-defined]
    return {option.opts[0]: option.rich_help_panel for option in group.params if isinstance(option, TyperOption)}


def test_the_commands_own_flags_sit_beside_the_flags_of_their_kind() -> None:
    assert _help_of("verify")["--quiet"] == _help_of("verify")["--out"] == "Outputs and CI"
    assert _help_of("eval")["--cache-dir"] == _help_of("eval")["--judge"] == "Judge and cost"
    assert _help_of("repair")["--judge"] == _help_of("repair")["--api-base"] == "Judge and cost"
