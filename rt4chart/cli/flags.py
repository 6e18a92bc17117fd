"""How the ``rt4`` command spells models as flags, declared once in the models: a flag per field of
:class:`~rt4chart.options.AuditOptions` (:func:`audit_options`) and of
:class:`~rt4chart.runs.spec.RunSpec` (:func:`run_options`), with the field's default and docstring as
``--help`` (panels: :data:`rt4chart.options.HELP_PANELS`, by parameter name); and the usage error
(:func:`fail`) both raise. Light to import: ``rt4 --help`` builds every flag from here.
"""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from rich.console import Console
from rich.text import Text

from rt4chart.options import AuditOptions
from rt4chart.runs.spec import CacheChoice, RunSpec

EXIT_USAGE = 2
"""Bad input or usage (README "Exit codes"); every other exit code comes from :func:`rt4chart.runs.run.exit_code`."""

stderr = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """Report a usage error and return the exit to raise. ``message`` is plain text, never markup:
    paths, ids and pip extras hold brackets (``x[/]y.jsonl``) that rich would parse."""
    stderr.print(Text.assemble(("error:", "red"), " ", message), highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


def _field_flag(name: str, info: FieldInfo) -> str:
    """The CLI flag of a model field: its ``json_schema_extra["flag"]`` as written, else its name
    (``--window``; a bool both ways, ``--batch-claims/--no-batch-claims``)."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    if "flag" in extra:
        return str(extra["flag"])
    flag = "--" + name.replace("_", "-")
    return f"{flag}/--no-{flag.removeprefix('--')}" if info.annotation is bool else flag


def _flag(name: str) -> str:
    """The CLI flag of an :class:`AuditOptions` field (``--window``, ``--global/--no-global``)."""
    return _field_flag(name, AuditOptions.model_fields[name])


_CLI_TYPES = (str, int, float, bool, Path, type(None))


def _field_parameter(name: str, info: FieldInfo, flag: str, *, bounded: bool = False) -> inspect.Parameter:
    """A typer option for a model field: its default and docstring, a Literal offered as text (the model
    checks it: one place, one message), members the CLI cannot parse (a Backend) left out, and a
    required field optional on the CLI (the command decides what its absence means)."""
    annotation: Any = info.annotation
    help_text = info.description or ""
    if get_origin(annotation) is Literal:
        help_text = f"{help_text} One of: {', '.join(get_args(annotation))}."
        annotation = str
    elif get_origin(annotation) in (Union, UnionType):
        annotation = functools.reduce(operator.or_, [member for member in get_args(annotation) if member in _CLI_TYPES])
    default = info.default
    if info.is_required():
        annotation, default = annotation | None, None
    # ``bounded``: the model's ge/le bounds are the flag's too, checked by typer, which names the flag (run
    # flags; audit options are checked by AuditOptions itself, one message per flag).
    constraints = info.metadata if bounded else []
    bounds = {key: getattr(item, key) for item in constraints for key in ("ge", "le") if hasattr(item, key)}
    limits = {"min": bounds["ge"]} if "ge" in bounds else {}
    limits |= {"max": bounds["le"]} if "le" in bounds else {}
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default,
        annotation=Annotated[annotation, typer.Option(*flag.split(","), help=help_text, **limits)],
    )


def _option_parameter(name: str) -> inspect.Parameter:
    return _field_parameter(name, AuditOptions.model_fields[name], _flag(name))


def _options_error(error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        where = _flag(str(item["loc"][0])).split("/")[0] if item["loc"] else "options"
        problems.append(f"{where}: {item['msg']}")
    return "; ".join(problems)


Command = TypeVar("Command", bound=Callable[..., None])


def _with_flags(command: Command, keyword: str, added: list[inspect.Parameter],
                model: Callable[[dict[str, Any]], Any]) -> Command:
    """``command`` offering the ``added`` flags too, called with ``keyword=`` what ``model`` makes of
    their values (by parameter name)."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != keyword]
    parameters = own + added

    @functools.wraps(command)
    def with_flags(*args: Any, **kwargs: Any) -> None:
        command(*args, **{keyword: model({p.name: kwargs.pop(p.name) for p in added})}, **kwargs)

    del with_flags.__wrapped__  # typer reads the signature below, not the command's own
    with_flags.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    with_flags.__annotations__ = {p.name: p.annotation for p in parameters}
    return with_flags  # type: ignore[return-value]


def _audit_options_of(values: dict[str, Any]) -> AuditOptions:
    try:
        return AuditOptions(**values)
    except ValidationError as error:
        raise fail(_options_error(error)) from None


def audit_options(command: Command) -> Command:
    """Give ``command`` a flag for every :class:`AuditOptions` field and call it with ``options=``
    the validated model; an invalid value is a usage error (exit 2) naming its flag."""
    return _with_flags(command, "options", [_option_parameter(name) for name in AuditOptions.model_fields],
                       _audit_options_of)


def _run_field(path: str) -> FieldInfo:
    """The :class:`RunSpec` field at ``path`` (``limits.budget_usd``); ``cache.*`` are the fields of
    :class:`CacheChoice`, the three flags of the one field ``RunSpec.cache``."""
    model: type[BaseModel] = RunSpec
    *parents, name = path.split(".")
    for parent in parents:
        annotation = CacheChoice if (model, parent) == (RunSpec, "cache") else model.model_fields[parent].annotation
        model = next(m for m in (annotation, *get_args(annotation)) if isinstance(m, type) and issubclass(m, BaseModel))
    return model.model_fields[name]


def _run_parameter(path: str) -> inspect.Parameter:
    """The flag of a run field, its parameter named after the flag (``--signal-model``: ``signal_model``)."""
    info = _run_field(path)
    flag = _field_flag(path.rsplit(".", 1)[-1], info)
    return _field_parameter(flag.split(",")[0].split("/")[0].removeprefix("--").replace("-", "_"), info, flag,
                            bounded=True)


def run_options(*paths: str) -> Callable[[Command], Command]:
    """Give ``command`` a flag for each :class:`~rt4chart.runs.spec.RunSpec` field in ``paths`` (help from the
    field's docstring, panel from :data:`HELP_PANELS`) and call it with ``run=`` the values by parameter name
    (``run["budget"]``): the command builds its spec with the run layer's checks, which name the flags."""
    added = [_run_parameter(path) for path in paths]
    return lambda command: _with_flags(command, "run", added, dict)


RUN_FLAGS = (
    "out", "resume", "judge", "api_base", "limits.concurrency", "limits.budget_usd", "limits.timeout_s",
    "cache.cache_dir", "cache.cache_url", "cache.no_cache", "engine.engine", "engine.address", "engine.workers",
    "engine.worker_cpus", "signals.kind", "signals.model", "signals.probe", "signals.server", "signals.delta",
)
"""The run flags of ``rt4 verify``, in the order of its ``--help``."""

OUTPUT_FLAGS = ("outputs.html", "outputs.junit", "outputs.github", "outputs.fail_on", "outputs.max_rate",
                "outputs.baseline")
"""The output and CI flags of ``rt4 verify`` (``rt4 report`` takes all but ``--report``, its ``--html``)."""
