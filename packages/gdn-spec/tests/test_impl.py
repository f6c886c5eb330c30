"""Resolving the implementation under test and validating its capabilities."""

from __future__ import annotations

import pytest

from gdn_spec import impl
from gdn_spec.impl import Capabilities, ImplementationError, load, resolve
from gdn_spec.regimes import Geometry


def test_load_module_callable_reads_capabilities() -> None:
    loaded = load("mutants:CORRECT")
    assert loaded.capabilities.name == "mutant:none" and loaded.capabilities.max_work == 1 << 22
    assert loaded.capabilities.algorithms == ("schur", "neumann")


@pytest.mark.parametrize("spec", ["mutants", "mutants:", "no_such_module_xyz:f", "mutants:NOPE", "mutants:CAPS"])
def test_bad_specs_are_errors(spec: str) -> None:
    with pytest.raises(ImplementationError):
        load(spec)


@pytest.mark.parametrize("raw", [{"algorithms": ("fla",)}, {"dtypes": ()}, {"max_sequence": 5}, {"example_scale": 0}])
def test_bad_capabilities_are_errors(raw: dict) -> None:
    with pytest.raises(ImplementationError):
        Capabilities.from_mapping(raw, "x")


def test_limits_explain_skips() -> None:
    caps = Capabilities.from_mapping({"max_seq_len": 256, "dtypes": ["bfloat16"]}, "k")
    assert caps.dtypes == ("bfloat16",)
    assert "float32" in caps.unsupported(dtype="float32")
    assert caps.too_large(Geometry(1, 1, 1, 256, 16, 16)) is None
    assert "max_seq_len=256" in caps.too_large(Geometry(1, 1, 1, 512, 16, 16))


def test_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(impl, "registered", lambda: {})
    assert resolve(None, {}) is None
    assert resolve(None, {"GDN_SPEC_IMPL": "mutants:CORRECT"}).spec == "mutants:CORRECT"
    assert resolve("mutants:out_fp32", {"GDN_SPEC_IMPL": "mutants:CORRECT"}).spec == "mutants:out_fp32"
    monkeypatch.setattr(impl, "registered", lambda: {"only": "mutants:CORRECT"})
    assert resolve(None, {}).spec == "mutants:CORRECT"
    assert resolve("only", {}).spec == "mutants:CORRECT"
    monkeypatch.setattr(impl, "registered", lambda: {"a": "mutants:CORRECT", "b": "mutants:out_fp32"})
    with pytest.raises(ImplementationError, match="several"):
        resolve(None, {})


def test_plugin_names_match_the_sources() -> None:
    from gdn_ref.constants import ALGORITHMS
    from gdn_spec import plugin
    from gdn_spec.regimes import COMPUTE_DTYPES

    assert plugin.ALGORITHMS == ALGORITHMS and plugin.COMPUTE_DTYPES == COMPUTE_DTYPES
    assert (plugin.ENV_VAR, plugin.ENTRY_POINT_GROUP) == (impl.ENV_VAR, impl.ENTRY_POINT_GROUP)
