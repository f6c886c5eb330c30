"""gdn-nki's layers, held by reading every module's imports (at the top or inside a function).

The folders are the layers, and an import points down only: the public modules at the package root (``gdn_nki``,
``gdn_nki.conformance``, ``gdn_nki.traces``, ``gdn_nki.torch_decode``) → ``torch/`` → ``host/`` → the composing
kernels ``block/`` and ``normed/`` → the kernel families ``cte/``, ``tkg/``, ``conv/``, ``norm/`` and ``gating/``
(which never import each other) → ``common/``. ``common/backend.py`` is the one
module that knows nki-cpu exists; every other module writes plain NKI through it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gdn_nki

SOURCE = Path(gdn_nki.__file__).parent
# Rank of each layer folder ("" = the package root: the public modules); a module may import its own folder's
# modules and those of a lower rank, never a higher or an equal one of another folder (the kernel families cte, tkg,
# conv, norm and gating share a rank). block (the fused decode block) composes the tkg and conv families, and normed
# (the prefill with the norm folded in) the cte and norm families, so they sit between those and host.
RANKS = {
    "": 4,
    "torch": 3,
    "host": 2,
    "block": 1.5,
    "cte": 1,
    "tkg": 1,
    "conv": 1,
    "norm": 1,
    "gating": 1,
    "normed": 1.5,
    "common": 0,
}
BACKEND = "gdn_nki.common.backend"


def _modules() -> dict[str, Path]:
    """Dotted name -> source of every gdn-nki module (a package is its ``__init__``)."""
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = ("gdn_nki", *path.relative_to(SOURCE).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def layer(module: str) -> str:
    """The layer folder a gdn-nki module lives in ("" for the public modules at the package root)."""
    parts = module.split(".")[1:]
    is_package = MODULES[module].name == "__init__.py"
    return parts[0] if parts and (len(parts) > 1 or is_package) else ""


def imports(module: str) -> dict[str, int]:
    """The gdn-nki modules ``module`` imports anywhere in its source, each with the line of its first import."""
    path = MODULES[module]
    anchor = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(anchor[: len(anchor) - node.level + 1] + ([node.module] if node.module else []))
            # `from pkg import name`: name is a module when the package has one of that name, else pkg is imported
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == "gdn_nki":
                while target not in MODULES:  # `import gdn_nki.tkg.step` names the module; an attribute its parent
                    target = target.rpartition(".")[0]
                found.setdefault(target, node.lineno)
    return found


def test_every_layer_has_modules() -> None:
    """The test reads the tree it is about: each layer folder is found, and holds the modules its docs name."""
    layers = {layer(m) for m in MODULES}
    assert layers == set(RANKS), f"layer folders found: {sorted(layers)}; RANKS names {sorted(RANKS)}"
    for expected in ("gdn_nki.cte.kernel", "gdn_nki.tkg.step", "gdn_nki.host.prefill", "gdn_nki.torch.chunk", BACKEND):
        assert expected in MODULES


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    """Rule: a module imports its own layer or a lower one; the public root modules are imported by none."""
    here = layer(module)
    for target, line in imports(module).items():
        there = layer(target)
        if target == "gdn_nki" or there == "":
            assert here == "", f"{module}:{line} imports the public module {target}: import what it re-exports"
            continue
        if there == here:
            continue
        assert RANKS[there] < RANKS[here], (
            f"{module}:{line} ({here or 'root'}/) imports {target} ({there}/): gdn-nki's layers import downward only "
            f"(root → torch → host → block → cte | tkg | conv → common); move the shared code down a layer"
        )


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != BACKEND))
def test_only_the_backend_knows_nki_cpu(module: str) -> None:
    """Rule: every module but ``common/backend.py`` writes plain NKI through the backend and never names nki-cpu or
    imports an ``nki`` package directly."""
    path = MODULES[module]
    text = path.read_text()
    assert "nki_cpu" not in text, f"{module} mentions nki_cpu"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            roots = [] if node.level else [(node.module or "").split(".")[0]]
        else:
            continue
        assert not {"nki", "nki_cpu"} & set(roots), f"{module}:{node.lineno} imports {roots} (use common.backend)"
