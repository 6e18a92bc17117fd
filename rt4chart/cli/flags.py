"""How the ``rt4`` command spells a run as flags, declared once in the models: :func:`run_spec` gives a
command a flag per field of :class:`~rt4chart.runs.spec.RunSpec` it names (``limits.budget_usd`` ->
``--budget``, ``options.window`` -> ``--window``; :data:`AUDIT_FLAGS`: every
:class:`~rt4chart.options.AuditOptions` field) and calls it with ``spec=`` the validated model. A flag's
default and help are its field's default and docstring, its ``--help`` panel the field's
``json_schema_extra["panel"]`` (:class:`~rt4chart.options.HelpPanel`), its spelling the field's name unless
``json_schema_extra["flag"]`` says otherwise. An invalid value, and the usage error (:func:`fail`), exit 2
with a message that names the flag. Light to import: ``rt4 --help`` builds every flag from here.
"""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Callable, Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import typer
from pydantic import ValidationError
from pydantic_core import ErrorDetails
from rich.console import Console
from rich.text import Text

from rt4chart.runs.spec import AUDIT_FLAGS as AUDIT_FLAGS  # the flag tuples, as the commands import them
from rt4chart.runs.spec import CACHE_FLAGS as CACHE_FLAGS
from rt4chart.runs.spec import OUTPUT_FLAGS as OUTPUT_FLAGS
from rt4chart.runs.spec import RUN_FLAGS as RUN_FLAGS
from rt4chart.runs.spec import (
    CacheChoice,
    RunSpec,
    field_at,
    field_extra,
    flag_of,
    nested_fields,
)

EXIT_USAGE = 2
"""Bad input or usage (README "Exit codes"); every other exit code comes from :func:`rt4chart.runs.run.exit_code`."""

stderr = Console(stderr=True)


def fail(message: str) -> typer.Exit:
    """Report a usage error and return the exit to raise. ``message`` is plain text, never markup:
    paths, ids and pip extras hold brackets (``x[/]y.jsonl``) that rich would parse."""
    stderr.print(Text.assemble(("error:", "red"), " ", message), highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_USAGE)


def panel_of(path: str) -> str | None:
    """The ``--help`` panel the field at ``path`` declares (``json_schema_extra["panel"]``), if any."""
    panel = field_extra(field_at(path)).get("panel")
    return None if panel is None else str(panel)


def _named(path: str) -> str:
    """The first spelling of the flag at ``path`` (``--out``, ``--global``): what a message names."""
    return flag_of(path).split(",")[0].split("/")[0]


_CLI_TYPES = (str, int, float, bool, Path, type(None))


def _parameter(path: str, help_text: str | None) -> inspect.Parameter:
    """A typer option for the field at ``path``: its default, docstring and panel; a Literal offered as
    text (the model checks it: one place, one message); members the CLI cannot parse (a Backend) left out;
    and a required field optional on the CLI (the model says when it is missing)."""
    info = field_at(path)
    annotation: Any = info.annotation
    help_text = help_text or info.description or ""
    if get_origin(annotation) is Literal:
        help_text = f"{help_text} One of: {', '.join(get_args(annotation))}."
        annotation = str
    elif get_origin(annotation) in (Union, UnionType):
        annotation = functools.reduce(operator.or_, [member for member in get_args(annotation) if member in _CLI_TYPES])
    default = info.default
    if info.is_required():
        annotation, default = annotation | None, None
    # A run field's ge/le bounds are its flag's too, checked by typer and shown in --help; audit options are
    # checked by AuditOptions alone (one message per flag, as rt4chart.verify(...) gets it).
    constraints = [] if path.startswith("options.") else info.metadata
    bounds = {key: getattr(item, key) for item in constraints for key in ("ge", "le") if hasattr(item, key)}
    limits = {"min": bounds["ge"]} if "ge" in bounds else {}
    limits |= {"max": bounds["le"]} if "le" in bounds else {}
    option = typer.Option(*flag_of(path).split(","), help=help_text, rich_help_panel=panel_of(path), **limits)
    return inspect.Parameter(path.replace(".", "_"), inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[annotation, option])


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


def _cache_of(choice: CacheChoice, per_user_default: bool) -> Path | str | None:
    """``RunSpec.cache`` from its three flags: ``None`` with ``--no-cache``, else the Redis URL, the
    directory, or the per-user cache (none without ``per_user_default``)."""
    from rt4chart.judges.cache import CacheError, cache_location  # diskcache: not for --help

    if choice.no_cache:
        return None
    try:
        return cache_location(choice.cache_dir, choice.cache_url, per_user_default=per_user_default)
    except CacheError as error:
        raise fail(str(error)) from None


def _problem(error: ErrorDetails, offered: Mapping[str, Any]) -> str:
    """One validation error as the user wrote it: the flag, and what is wrong with its value."""
    path = ".".join(str(part) for part in error["loc"])
    if path not in offered:
        return f"{path or 'options'}: {error['msg']}"
    if error["type"] == "missing":
        return f"{_named(path)} is required: {(field_at(path).description or '').rstrip('.')}"
    if error["type"] == "literal_error":
        *choices, last = get_args(field_at(path).annotation)
        return f"{_named(path)} must be {', '.join(choices)} or {last} (got {error['input']!r})"
    return f"{_named(path)}: {error['msg'].removeprefix('Value error, ')}"


def _spec_of(values: dict[str, Any], defaults: Mapping[str, Any], per_user_cache: bool) -> RunSpec:
    """The run the flags ask for (values by field path), or a usage error naming every wrong flag."""
    # A required field whose flag is not given is left out, so that the model says it is missing.
    given = {path: value for path, value in values.items() if value is not None or not field_at(path).is_required()}
    fields = nested_fields(given)
    if "cache" in fields:
        choice = CacheChoice(**fields["cache"])
        fields["cache"] = _cache_of(choice, per_user_cache)
        if "signals" in fields:
            fields["signals"]["use_cache"] = not choice.no_cache
    # An optional part of the run (--signals) none of whose flags is given is left out.
    for name in [name for name, value in fields.items() if isinstance(value, dict)]:
        flags = [path for path in values if path.startswith(f"{name}.")]
        if RunSpec.model_fields[name].default is None and all(values[path] == defaults[path] for path in flags):
            del fields[name]
    try:
        return RunSpec.model_validate(fields)
    except ValidationError as error:
        raise fail("; ".join(_problem(problem, values) for problem in error.errors())) from None


def run_spec(
    *paths: str, per_user_cache: bool = True, help_texts: Mapping[str, str] | None = None
) -> Callable[[Command], Command]:
    """Give ``command`` a flag for each :class:`RunSpec` field in ``paths`` and call it with ``spec=`` the
    validated :class:`RunSpec` they make (fields not offered keep their defaults); an invalid value is a
    usage error (exit 2) naming its flag. ``cache.*`` are the flags of ``RunSpec.cache`` (a directory,
    by default the per-user cache, or none without ``per_user_cache``; a Redis URL; ``--no-cache``, which
    also keeps ``--signals`` from their cache); ``help_texts`` replaces a field's help where a command
    means it differently."""
    added = [_parameter(path, (help_texts or {}).get(path)) for path in paths]
    by_name = dict(zip([parameter.name for parameter in added], paths, strict=True))
    defaults = {by_name[parameter.name]: parameter.default for parameter in added}

    def spec_of(values: dict[str, Any]) -> RunSpec:
        return _spec_of({by_name[name]: value for name, value in values.items()}, defaults, per_user_cache)

    return lambda command: _with_flags(command, "spec", added, spec_of)
