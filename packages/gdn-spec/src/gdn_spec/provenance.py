"""What produced a conformance report: the suite's version, the kernel's package and version, and the runtime.

A summary pasted into an issue is only worth something if it can be placed: which gdn-spec judged which release of
which kernel, through which adapter, on which Python, numpy and torch. ``cli`` records these in the summary's
header and in the JSON's ``run`` block.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from typing import Any

SUITE_DISTRIBUTION = "gdn-spec"
NOT_INSTALLED = "unknown (not installed)"


def distribution_version(distribution: str) -> str:
    """The installed version of ``distribution``, or NOT_INSTALLED (run from a source tree)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


def providing_distributions(module: str) -> list[str]:
    """The installed distributions that provide ``module``'s top-level package (usually one; none for a file of the
    current directory or a source tree on PYTHONPATH)."""
    top = module.split(".")[0]
    return sorted(set(importlib.metadata.packages_distributions().get(top, [])))


def kernel_provenance(spec: str) -> dict[str, Any]:
    """The kernel under test: its ``module:callable`` spec, its module, and the package that provides the module.

    Args:
        spec (str): the implementation's ``module:callable``, as given to ``gdn-spec check``.

    Returns:
        dict[str, Any]: ``spec``, ``module``, ``package`` ("gdn-nki", or "" when no installed distribution
        provides the module) and ``version`` (the package's, or "" with no package).
    """
    module = spec.partition(":")[0]
    packages = providing_distributions(module)
    package = ", ".join(packages)
    version = ", ".join(distribution_version(p) for p in packages)
    return {"spec": spec, "module": module, "package": package, "version": version}


def runtime_versions() -> dict[str, str]:
    """gdn-spec's, Python's and numpy's versions, and torch's when the run imported it (the torch adapters, or a
    kernel that uses torch): asking for it otherwise would import torch for nothing and name a torch the run never
    used."""
    import numpy as np  # a dependency of the suite: always present

    versions = {
        SUITE_DISTRIBUTION: distribution_version(SUITE_DISTRIBUTION),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(getattr(torch, "__version__", NOT_INSTALLED))
    return versions


def describe_kernel(kernel: dict[str, Any]) -> str:
    """One line for the summary: "gdn_nki (gdn-nki 0.1.0)" or "my_kernel (no installed package provides it)"."""
    if not kernel["package"]:
        return f"{kernel['module']} (no installed package provides it)"
    return f"{kernel['module']} ({kernel['package']} {kernel['version']})"


def describe_runtime(versions: dict[str, str]) -> str:
    """One line for the summary: "gdn-spec 0.1.0 on Python 3.11.9, numpy 2.2.6[, torch 2.5.1]"."""
    rest = ", ".join(f"{name} {version}" for name, version in versions.items() if name != SUITE_DISTRIBUTION)
    return f"{SUITE_DISTRIBUTION} {versions[SUITE_DISTRIBUTION]} on {rest.replace('python', 'Python', 1)}"
