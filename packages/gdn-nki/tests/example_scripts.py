"""The repository's example scripts (``examples/``), imported as modules by the tests that run them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def load_example(stem: str) -> ModuleType:
    """``examples/<stem>.py`` as the module ``stem`` (registered in ``sys.modules``, as its dataclasses need)."""
    spec = importlib.util.spec_from_file_location(stem, EXAMPLES / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
