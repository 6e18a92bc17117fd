"""What the public packages export, in the style of httpx's ``test_exported_members``: ``__all__``
is exactly the public names a package holds, the lazy export table and the names type checkers see
are the same list, and ``from ... import *`` works."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest

import rt4chart
import rt4chart.signals
from rt4chart.options import AuditOptionKeywords, AuditOptions

EXTENSION_API = {
    # What a backend of one's own needs (ARCHITECTURE.md, "A new backend" and "A sending backend").
    "Backend", "BackendWrapper", "CostEstimator", "TokenCounter", "JudgeRequest", "JudgeResponse", "Message",
    "GenerationParams", "VerifyInput", "VerifyOutput", "ClaimJudgement", "DecomposeInput", "DecomposeOutput",
    "Sender", "Reply", "PolicyBackend", "CallSettings", "JudgeUnavailable", "ScriptedBackend",
}


def public_names(package: types.ModuleType) -> list[str]:
    """Names a package holds that are rt4chart's own objects, not modules and not private."""
    return sorted(
        name
        for name, value in vars(package).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and (getattr(value, "__module__", None) or "").startswith("rt4chart")
    )


def type_checking_imports(path: Path) -> dict[str, str]:
    """``name -> module`` of the ``from M import X as X`` lines under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
    names: dict[str, str] = {}
    for statement in block.body:
        assert isinstance(statement, ast.ImportFrom) and statement.module
        for alias in statement.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as `{alias.name} as {alias.name}`"
            names[alias.name] = statement.module
    return names


@pytest.mark.parametrize("package", [rt4chart, rt4chart.signals], ids=lambda p: p.__name__)
def test_all_is_exactly_the_public_names(package: types.ModuleType) -> None:
    for name in package.__all__:
        getattr(package, name)  # loads the lazy ones, so the namespace holds every export
    assert package.__all__ == sorted(package.__all__)
    assert package.__all__ == public_names(package)


def test_the_lazy_exports_are_what_type_checkers_see() -> None:
    exports = rt4chart._EXPORTS
    assert type_checking_imports(Path(inspect.getfile(rt4chart))) == exports
    assert set(rt4chart.__all__) == {*exports, "verify", "averify"}
    for name, module in exports.items():
        assert getattr(rt4chart, name).__module__ == module


def test_the_extension_api_is_exported() -> None:
    assert set(rt4chart.__all__) >= EXTENSION_API


@pytest.mark.parametrize("package", ["rt4chart", "rt4chart.signals"])
def test_star_import_works(package: str) -> None:
    # In a fresh interpreter: a name in __all__ that does not exist raises only there.
    probe = f"from {package} import *; import {package} as p; names = dir(); assert set(p.__all__) <= set(names)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_the_typed_options_mirror_the_options_model() -> None:
    fields = {name: field.annotation for name, field in AuditOptions.model_fields.items()}
    assert typing.get_type_hints(AuditOptionKeywords) == fields
    assert list(typing.get_type_hints(AuditOptionKeywords)) == list(fields)  # same order as --help lists them
