"""The project config file on the command line: its settings become the flags' defaults of every
command (:func:`apply_project_config`, called before any command runs; a flag given overrides them),
and ``rt4 config`` shows each setting's effective value and where it came from."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from rt4chart.cli.flags import fail, run_spec
from rt4chart.runs.config import CONFIGURABLE, ProjectConfig, config_key, load_config
from rt4chart.runs.config_file import ConfigError
from rt4chart.runs.spec import RunSpec

commands = typer.Typer()


def _defaults_of(command: Any, ctx: typer.Context, defaults: dict[str, Any]) -> dict[str, Any]:
    """click's ``default_map`` for ``command``: the same defaults for every command of a group, by name
    (typer's click is vendored and private: a group is what lists commands)."""
    if not hasattr(command, "list_commands"):
        return defaults
    return {name: _defaults_of(sub, ctx, defaults)
            for name in command.list_commands(ctx) if (sub := command.get_command(ctx, name)) is not None}


def apply_project_config(ctx: typer.Context) -> None:
    """Read the config file that applies in the working directory (a bad one: exit 2 naming the file
    and key) and make its settings the defaults of the flags they name, in every command."""
    try:
        config = load_config()
    except ConfigError as error:
        raise fail(str(error)) from None
    ctx.obj = config
    if config.settings:
        # A flag's parameter is named by its field path (cli.flags: `limits.budget_usd` -> limits_budget_usd).
        defaults = {path.replace(".", "_"): value for path, value in config.settings.items()}
        ctx.default_map = _defaults_of(ctx.command, ctx, defaults)


@commands.command()
@run_spec(*CONFIGURABLE)
def config(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the settings as JSON.")] = False,
    *,
    spec: RunSpec,
) -> None:
    """Show the effective settings of a run here: each value and where it came from (default, the
    config file, or a flag given with this command)."""
    # `spec` is unused on purpose: building it validated the settings as a run would (a bad value: exit 2).
    project: ProjectConfig = ctx.find_root().obj or ProjectConfig()
    file = str(project.path) if project.path else None
    rows = []
    for path in CONFIGURABLE:
        name = path.replace(".", "_")
        source = ctx.get_parameter_source(name)
        origin = {"COMMANDLINE": "flag", "DEFAULT_MAP": file}.get(source.name if source else "") or "default"
        value = ctx.params[name]
        rows.append({"key": config_key(path), "value": str(value) if value is not None and not isinstance(
            value, (bool, int, float)) else value, "source": origin})
    if as_json:
        print(json.dumps({"config": file, "settings": rows}, indent=2))
        return
    print(f"# config file: {file or 'none (rt4chart.toml or [tool.rt4chart] in pyproject.toml, from here upward)'}")
    for row in rows:  # one setting a line: readable at any width, and valid TOML to copy from
        print(f"{row['key']} = {json.dumps(row['value'])}  # {row['source']}")
