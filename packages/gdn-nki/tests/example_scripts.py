"""The repository's example scripts (``examples/``) and gdn-nki's bench scripts (``bench/``), imported as modules by
the tests that run them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_example(stem: str) -> ModuleType:
    """``examples/<stem>.py`` as the module ``stem`` (registered in ``sys.modules``, as its dataclasses need)."""
    return _load(EXAMPLES, stem)


def load_bench(stem: str) -> ModuleType:
    """``packages/gdn-nki/bench/<stem>.py`` as the module ``stem`` (registered in ``sys.modules``)."""
    return _load(BENCH, stem)


def _load(folder: Path, stem: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(stem, folder / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
