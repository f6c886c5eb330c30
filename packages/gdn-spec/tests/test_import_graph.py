"""Each package's modules import each other without circles.

A circle holds only while one of its imports stays inside a function, and the next edit that moves it to the top
breaks the package at import time. So the graph counts every import a module's source contains, at the top or in
a function; only those under ``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

# gdn-spec's tests hold the packages whose sources they can read: their own, the oracle they import, and the kernel
# when it is installed (nki-cpu's tests hold nki-cpu's graph).
PACKAGES = ("gdn_spec", "gdn_ref", "gdn_nki")


def package_sources(package: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of an installed package (a package is its __init__)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"{package} is not an installed package"
    root = Path(next(iter(spec.submodule_search_locations)))
    sources = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        sources[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return sources


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The import nodes under an ``if TYPE_CHECKING:`` block."""
    hidden: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(inner for stmt in node.body for inner in ast.walk(stmt))
    return hidden


def imported_modules(module: str, path: Path, sources: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its source (``from pkg import mod`` names mod)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    hidden = _type_checking_only(tree)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if node in hidden:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            # the longest prefix that is one of the package's modules: "pkg.mod.func" -> "pkg.mod"
            while target and target not in sources:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    sources = package_sources(package)
    return {module: imported_modules(module, path, sources) for module, path in sources.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None when the graph is acyclic."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for child in sorted(graph.get(node, ())):
            if state.get(child) == "open":
                return [*path[path.index(child) :], child]
            if child not in state and (cycle := visit(child)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_modules_import_each_other_without_circles(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed")
    cycle = find_cycle(import_graph(package))
    assert cycle is None, f"{package} imports in a circle: {' -> '.join(cycle or [])}"


def test_the_graph_sees_imports_inside_functions_and_relative_ones() -> None:
    graph = import_graph("gdn_spec")
    assert "gdn_spec.impl" in graph["gdn_spec.plugin"]  # imported inside pytest_configure
    assert "gdn_spec.core" in graph["gdn_spec.adapters"]  # "from ..core import" in a package's __init__
    assert "gdn_spec.adapters.seqfirst" in graph["gdn_spec.adapters"]  # "from .seqfirst import" inside adapt
    assert "gdn_spec.core" not in graph["gdn_spec.profiles"]  # under TYPE_CHECKING only


def test_a_circle_is_found() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
