"""A project's defaults for its runs: ``rt4chart.toml``, or the ``[tool.rt4chart]`` table of
``pyproject.toml``, found from the working directory upward (the first directory that has either;
``rt4chart.toml`` first, a ``pyproject.toml`` without the table is passed over).

Its keys are the flags of ``rt4 verify`` without their dashes (``judge``, ``budget``, ``window``,
``fail-on``, ``cache-dir``, ``report``, ``junit``; an underscore may stand for a dash), its values what
the flags take; they are validated by the models that declare the flags (:class:`RunSpec` and the models
in it), so a bad key or value is a :class:`ConfigError` naming the file and the key. Relative paths
(``out``, ``report``, ``junit``, ``baseline``, ``cache-dir``, the signal files) are read from the file's
directory, so a run started in a subdirectory finds the same files; a judge spec stays as written.
The ``rt4`` command takes them as its flags' defaults (a flag given overrides it; ``rt4 config`` shows
each setting and where it came from); :func:`load_config` is the library's way in.
"""

from __future__ import annotations

from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError

from rt4chart.runs.config_file import ConfigError, find_config
from rt4chart.runs.spec import (
    AUDIT_FLAGS,
    OUTPUT_FLAGS,
    RUN_FLAGS,
    CacheChoice,
    RunSpec,
    field_at,
    flag_of,
    nested_fields,
)

CONFIGURABLE = tuple(path for path in (*RUN_FLAGS, *OUTPUT_FLAGS, *AUDIT_FLAGS) if path != "resume")
"""The :class:`RunSpec` fields (by path) a config file may set: every flag of ``rt4 verify`` but
``--resume``, which says what to do with one output, not how a project audits."""


def config_key(path: str) -> str:
    """The key of the field at ``path`` in a config file: its flag's long name without ``--``."""
    return flag_of(path).split(",")[0].split("/")[0].removeprefix("--")


KEYS = {config_key(path): path for path in CONFIGURABLE}
"""Config key -> field path."""


class ProjectConfig(BaseModel):
    """The run defaults of a project's config file (none found: no file and no setting)."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    path: Path | None = None
    """The file they were read from."""
    settings: dict[str, Any] = {}
    """Validated values by :class:`RunSpec` field path (``limits.budget_usd``), as the flags take them."""

    def run_spec(self) -> RunSpec:
        """The :class:`RunSpec` these defaults make (the cache: the directory or URL set, else none)."""
        fields = nested_fields({path: value for path, value in self.settings.items() if not path.startswith("cache.")})
        cache = CacheChoice(**nested_fields(self.settings).get("cache", {}))
        fields["cache"] = None if cache.no_cache else cache.cache_url or cache.cache_dir
        return RunSpec.model_validate(fields)


def _is_path(path: str) -> bool:
    annotation = field_at(path).annotation
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return Path in members


def validated(path: Path, table: dict[str, Any]) -> ProjectConfig:
    """``table`` (a config file's keys and values) checked by the run's models; paths read from the
    file's directory. :class:`ConfigError` names the file and every wrong key."""
    settings: dict[str, Any] = {}
    for key, value in table.items():
        field = KEYS.get(key.replace("_", "-"))
        if field is None:
            raise ConfigError(f"{path}: unknown key {key!r}; the keys are the flags of `rt4 verify` without '--' "
                              f"(`rt4 config` lists them): {', '.join(sorted(KEYS))}")
        if _is_path(field) and isinstance(value, str):
            value = str((path.parent / value).resolve()) if not Path(value).is_absolute() else value
        settings[field] = value
    config = ProjectConfig(path=path, settings=settings)
    try:
        CacheChoice(**nested_fields(settings).get("cache", {}))
        config.run_spec()
    except ValidationError as error:
        problems = []
        for problem in error.errors():
            field = ".".join(str(part) for part in problem["loc"])
            if field not in CONFIGURABLE and f"cache.{field}" in CONFIGURABLE:  # CacheChoice's own
                field = f"cache.{field}"
            key = config_key(field) if field in CONFIGURABLE else field
            problems.append(f"{key}: {problem['msg'].removeprefix('Value error, ')} (got {problem.get('input')!r})")
        raise ConfigError(f"{path}: " + "; ".join(problems)) from None
    return config


def load_config(start: Path | str | None = None) -> ProjectConfig:
    """The run defaults of the project config that applies in ``start`` (default: the working
    directory): ``rt4chart.toml`` or ``pyproject.toml``'s ``[tool.rt4chart]``, searched upward.
    ``ProjectConfig().settings`` is empty when there is none; :meth:`ProjectConfig.run_spec` makes the
    :class:`RunSpec` for :func:`rt4chart.execute`. Raises :class:`ConfigError` for a bad file, key or value."""
    found = find_config(Path(start) if start is not None else Path.cwd())
    return ProjectConfig() if found is None else validated(*found)
