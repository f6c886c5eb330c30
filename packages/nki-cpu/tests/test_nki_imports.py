"""nki-cpu's modules form an import graph without circles, and ``checks`` is a leaf.

The graph is read from the source (every ``import`` statement, at module level or inside a function), so an
import hidden inside a function to break a circle still counts. Importing ``a.b.c`` runs the ``__init__`` of every
package on the way that the importer is not already inside, so those packages are edges too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nki_cpu

ROOT = Path(nki_cpu.__file__).parent
PACKAGE = "nki_cpu"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            stem = ".".join([*base, node.module] if node.module else base)
        else:
            stem = node.module or ""
        return [stem, *(f"{stem}.{alias.name}" for alias in node.names)]
    return []


def import_graph() -> dict[str, set[str]]:
    """Module -> the nki-cpu modules importing it runs (packages it is not inside included)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        inside = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 2)}
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _imported(node, name, is_package):
                parts = target.split(".")
                for k in range(2, len(parts) + 1):  # the root package's __init__ is the public facade
                    prefix = ".".join(parts[:k])
                    if prefix in modules and prefix not in inside and prefix != name:
                        graph[name].add(prefix)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (as a path that returns to its start), or None."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if colour.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in colour:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        colour[node] = 2
        return None

    for node in sorted(graph):
        if node not in colour:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_circles():
    graph = import_graph()
    assert len(graph) > 20  # the walk found the package
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def test_checks_is_a_leaf():
    assert import_graph()["nki_cpu.checks"] == set()


def test_the_cycle_finder_finds_a_planted_circle():
    graph = import_graph()
    graph["nki_cpu.checks"] = {"nki_cpu.tensor"}  # tensor imports checks: a circle
    cycle = find_cycle(graph)
    assert cycle is not None and "nki_cpu.checks" in cycle and cycle[0] == cycle[-1]


def test_function_level_imports_are_edges_too():
    source = "def late():\n    from nki_cpu import tensor\n"
    targets = [t for node in ast.walk(ast.parse(source)) for t in _imported(node, "nki_cpu.checks", False)]
    assert "nki_cpu.tensor" in targets
