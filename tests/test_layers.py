"""The import graph of the package: its folders are its layers, as ARCHITECTURE.md's ``layers`` block
says, with no cycle between modules, and a small public API whose names never shadow a module."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import rt4chart

PACKAGE = Path(rt4chart.__file__).resolve().parent
ARCHITECTURE = PACKAGE.parent / "ARCHITECTURE.md"


def layers() -> dict[str, int]:
    """Folder or top-level module -> layer number, from the ``layers`` block of ARCHITECTURE.md
    (lowest first)."""
    block = re.search(r"```layers\n(.*?)```", ARCHITECTURE.read_text(encoding="utf-8"), re.S)
    assert block, "ARCHITECTURE.md has no ```layers block"
    order: dict[str, int] = {}
    for number, line in enumerate(block.group(1).splitlines()):
        for module in line.split(":", 1)[1].split() if ":" in line else []:
            assert module not in order, f"{module} is in two layers"
            order[module] = number
    return order


def layer_of(module: str, order: dict[str, int]) -> int:
    """The layer of ``module``: its own entry, else its folder's (the longest one that holds it)."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in order:
            return order[".".join(parts[:end])]
    raise AssertionError(f"{module} is in no layer: add its folder (or the module) to the layers block")


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name below ``rt4chart`` (``protocol``, ``judges.registry``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name and "shipped" not in parts:
            found[name] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Ids of the import nodes inside ``if TYPE_CHECKING:`` blocks (never executed)."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }


def imports(path: Path, known: set[str], *, at_run_time: bool = False) -> set[str]:
    """Package modules that ``path`` imports anywhere (module level, in functions, and, unless
    ``at_run_time``, for type checks)."""
    targets: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_only(tree) if at_run_time else set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rt4chart"):
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.startswith("rt4chart")]
        for name in names:
            short = name.removeprefix("rt4chart").removeprefix(".")
            while short and short not in known:
                short = short.rpartition(".")[0]
            if short:
                targets.add(short)
    return targets


def test_every_module_has_a_layer() -> None:
    order, found = layers(), set(modules())
    for module in found:
        layer_of(module, order)
    assert set(order) <= found, "the layers block names a folder or module that does not exist"
    # Folders are the layers: a layer lists folders and top-level modules, never a module inside a folder.
    assert not {entry for entry in order if "." in entry and entry.rpartition(".")[0] in order}


def test_every_folder_is_a_package_that_says_what_it_holds() -> None:
    for folder in {path.parent for path in PACKAGE.rglob("*.py")} - {PACKAGE}:
        if "shipped" in folder.parts:
            continue
        init = folder / "__init__.py"
        assert init.is_file(), f"{folder.relative_to(PACKAGE)} has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), f"{init} has no docstring"


def test_no_module_imports_from_a_higher_layer() -> None:
    order, found = layers(), modules()
    upward = [
        f"{module} (layer {layer_of(module, order)}) imports {target} (layer {layer_of(target, order)})"
        for module, path in found.items()
        for target in imports(path, set(found))
        if target != module and layer_of(target, order) > layer_of(module, order)
    ]
    assert upward == []


def test_the_import_graph_has_no_cycle() -> None:
    # Imports for type checks only are never executed, so they cannot form a cycle at run time.
    found = modules()
    graph = {module: imports(path, set(found), at_run_time=True) - {module} for module, path in found.items()}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        if module in done:
            return
        assert module not in visiting, " -> ".join([*visiting[visiting.index(module):], module])
        visiting.append(module)
        for target in sorted(graph[module]):
            visit(target)
        visiting.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_the_public_api_is_what_the_package_exports() -> None:
    for name in rt4chart.__all__:
        assert getattr(rt4chart, name) is not None
    assert {"verify", "averify", "judge_stack", "AuditOptions", "AuditRecord", "Backend"} <= set(rt4chart.__all__)
    with pytest.raises(AttributeError):
        rt4chart.no_such_name  # noqa: B018


def test_no_public_name_shadows_a_module() -> None:
    top_level = {name.split(".")[0] for name in modules()}
    assert not set(rt4chart.__all__) & top_level
    # Importing a module by its dotted path gives the module, whatever the package exports.
    assert importlib.import_module("rt4chart.method.verification").__name__ == "rt4chart.method.verification"
