"""pytest11 plugin: ``--gdn-impl``, ``--gdn-adapter``, ``--gdn-profile``, ``--gdn-algorithm``, the implementation
fixture, the contract profile's skips, Hypothesis profiles.

Nothing here runs unless the suite is asked for: the suite lives in ``gdn_spec.suite`` and is collected only by
``pytest --pyargs gdn_spec.suite ...`` (or ``gdn-spec check``). With no implementation requested its tests are
skipped with the reason; unrelated pytest runs see a few extra options and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, Phase, settings

if TYPE_CHECKING:
    from .core import Implementation

# Names only, no import of gdn_ref at load time: this module loads in every pytest run of an environment with
# gdn-spec installed, so it must not fail or slow down runs that never ask for the suite.
ALGORITHMS = ("schur", "neumann")
COMPUTE_DTYPES = ("float32", "bfloat16")
ENV_VAR = "GDN_SPEC_IMPL"
ENTRY_POINT_GROUP = "gdn_spec.implementations"
CONTRACT_PROFILES = ("api", "math")  # gdn_spec.profiles.PROFILES (names only, see above)
ADAPTER_NAMES = ("fla", "fla-torch", "hf-torch", "torch", "nki")  # gdn_spec.adapters.ADAPTERS
DECODE_ADAPTER_NAMES = ("fla-decode", "hf-decode", "vllm-decode")  # gdn_spec.decode.adapters.DECODE_ADAPTERS
FAMILIES = ("auto", "prefill", "decode")  # gdn_spec.decode.impl.FAMILIES
DECODE_MODULE_PREFIX = "test_decode_"  # the decode family's suite modules; every other one is prefill's

SUITE_DIR = Path(__file__).parent / "suite"
_IMPL_KEY = pytest.StashKey["Implementation | None"]()

# Kernel-sized examples are slow and data generation is ours (numpy), so deadlines and the size/slowness
# health checks mean nothing here; fixtures are function-scoped on purpose (numerics record per test).
_SUPPRESSED = (HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large)
# A verdict needs the first failing example, not the smallest: shrinking re-runs the kernel and the float64
# oracle dozens of times per failing test (a broken kernel took minutes where a correct one takes seconds).
_NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
PROFILES = {
    # CI: reproducible verdicts (derandomized, no example database), a bounded number of examples per test.
    "ci": dict(derandomize=True, max_examples=6, deadline=None, database=None, print_blob=True, phases=_NO_SHRINK),
    # Development: random exploration with the example database, so failures found once are replayed first;
    # failures are shrunk to a small example.
    "dev": dict(max_examples=40, deadline=None),
    # Self-tests of the suite's power (mutants): the fewest examples that still exercise every regime.
    "quick": dict(derandomize=True, max_examples=2, deadline=None, database=None, phases=_NO_SHRINK),
}
# What each profile's verdict is worth, for the summary's header and the JSON's run block.
PROFILE_PURPOSES = {
    "ci": "reproducible verdicts",
    "dev": "random exploration, failures replayed from the example database",
    "quick": "a smoke run for the suite's self-tests, not a verdict (use ci)",
}


def register_profiles() -> None:
    """Register the ``ci``, ``dev`` and ``quick`` Hypothesis profiles (re-registering the active one applies it)."""
    for name, kwargs in PROFILES.items():
        settings.register_profile(name, suppress_health_check=_SUPPRESSED, **kwargs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gdn-spec", "GDN conformance suite (gdn_spec.suite)")
    group.addoption(
        "--gdn-impl",
        default=None,
        metavar="MODULE:CALLABLE",
        help=f"GDN implementation under test; else ${ENV_VAR}, else the only '{ENTRY_POINT_GROUP}' entry point.",
    )
    group.addoption(
        "--gdn-adapter",
        default=None,
        metavar="NAME[:KEY=VALUE,...]",
        help=f"call the implementation through an adapter of gdn_spec.adapters: {', '.join(ADAPTER_NAMES)}; "
        f"of a decode kernel: {', '.join(DECODE_ADAPTER_NAMES)}.",
    )
    group.addoption(
        "--gdn-family",
        default="auto",
        choices=FAMILIES,
        help="prefill (gdn_cte's signature) or decode (decode_step's: the test_decode_* modules); default auto: "
        "decode when the callable declares gdn_spec_decode_capabilities or the adapter is a decode adapter.",
    )
    group.addoption("--gdn-device", default=None, help="torch device for the torch adapters (default: cuda if any).")
    group.addoption(
        "--gdn-profile",
        default=None,
        choices=CONTRACT_PROFILES,
        help="contract profile: api (gdn_cte's full contract) or math (numbers only); default: the adapter's.",
    )
    group.addoption(
        "--gdn-algorithm",
        default="all",
        choices=(*ALGORITHMS, "all"),
        help="run the suite for one algorithm only (default: every algorithm the implementation supports).",
    )


_PROFILE_KEY = pytest.StashKey[str]()
_DECODE_KEY = pytest.StashKey[bool]()


def _suite_requested(config: pytest.Config) -> bool:
    if config.getoption("gdn_impl") or os.environ.get(ENV_VAR):
        return True
    return any("gdn_spec.suite" in str(a) or "gdn_spec/suite" in str(a) for a in config.args)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _suite_requested(config):
        config.stash[_IMPL_KEY] = None
        return
    config.addinivalue_line("markers", "gdn_requires(promise): the test checks an API promise (gdn_spec.profiles)")
    register_profiles()
    # Conformance verdicts default to the reproducible profile; --hypothesis-profile dev opts into exploring.
    if not config.getoption("hypothesis_profile", default=None):
        settings.load_profile("ci")
    from .decode.impl import is_decode, resolve_family  # the suite was asked for: now gdn_ref may load
    from .impl import ImplementationError

    family = config.getoption("gdn_family")
    try:
        impl = resolve_family(config.getoption("gdn_impl"), adapter=config.getoption("gdn_adapter"),
                              device=config.getoption("gdn_device"), family=family)  # fmt: skip
    except ImplementationError as exc:
        raise pytest.UsageError(f"gdn-spec: {exc}") from exc
    config.stash[_IMPL_KEY] = impl
    config.stash[_DECODE_KEY] = is_decode(impl) or (impl is None and family == "decode")
    config.stash[_PROFILE_KEY] = config.getoption("gdn_profile") or (impl.default_profile if impl else "api")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What produced this run, in pytest's header: the kernel and its package, the adapter, the contract profile, and
    the versions of gdn-spec, Python, numpy and torch (``gdn-spec check`` says the same in its summary)."""
    impl = config.stash.get(_IMPL_KEY, None)
    if impl is None:
        return []
    from .provenance import describe_kernel, describe_runtime, kernel_provenance, runtime_versions

    via = impl.via or "called directly"
    return [
        f"gdn-spec: kernel {describe_kernel(kernel_provenance(impl.spec))}, {via}, profile {contract_profile(config)}",
        f"gdn-spec: {describe_runtime(runtime_versions())}",
    ]


def _in_suite(path: Path) -> bool:
    return SUITE_DIR in Path(path).resolve().parents


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A run checks one family: the decode modules (``test_decode_*``) for a decode kernel, the others otherwise."""
    if (
        collection_path.suffix != ".py"
        or not collection_path.name.startswith("test_")
        or not _in_suite(collection_path)
    ):
        return None
    decode_module = collection_path.name.startswith(DECODE_MODULE_PREFIX)
    return True if decode_module != config.stash.get(_DECODE_KEY, False) else None


def _other_family(item: pytest.Item, config: pytest.Config) -> str | None:
    """Why a suite test of the other family does not run (a module named explicitly is collected whatever
    ``pytest_ignore_collect`` says)."""
    decode_run = config.stash.get(_DECODE_KEY, False)
    if Path(item.path).name.startswith(DECODE_MODULE_PREFIX) == decode_run:
        return None
    kernel, area = ("decode", "prefill") if decode_run else ("prefill", "decode")
    return f"a {kernel} kernel: the {area} family's areas do not apply to it"


def _explicitly_parametrized(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not _in_suite(metafunc.definition.path):
        return
    for name, values in (("gdn_algorithm", ALGORITHMS), ("gdn_dtype", COMPUTE_DTYPES)):
        if name in metafunc.fixturenames and not _explicitly_parametrized(metafunc, name):
            metafunc.parametrize(name, values)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    suite_items = [item for item in items if _in_suite(item.path)]
    if not suite_items:
        return
    impl = config.stash.get(_IMPL_KEY, None)
    profile = config.stash.get(_PROFILE_KEY, "api")
    chosen = config.getoption("gdn_algorithm")
    deselected = []
    for item in suite_items:
        params = getattr(item, "callspec", None)
        params = params.params if params else {}
        algorithm, dtype = params.get("gdn_algorithm"), params.get("gdn_dtype")
        if chosen != "all" and algorithm is not None and algorithm != chosen:
            deselected.append(item)
            continue
        if impl is None:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"no GDN implementation requested: pass --gdn-impl MODULE:CALLABLE, set ${ENV_VAR}, "
                    f"or register one in the '{ENTRY_POINT_GROUP}' entry-point group"
                )
            )
            continue
        reason = (
            _other_family(item, config)
            or impl.capabilities.unsupported(algorithm, dtype)
            or _unmet_promise(item, profile, impl)
        )
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        dropped = set(deselected)
        items[:] = [item for item in items if item not in dropped]


# What the running suite test substituted (one test at a time per process, xdist workers included), e.g. "ran at
# Dk=16, Dv=16 instead of Dk=32, Dv=16 (...)": cleared before each test, attached to its report.
_SUBSTITUTIONS: list[str] = []
SUBSTITUTION_PROPERTY = "gdn_substituted"


def note_substitution(text: str) -> None:
    """Record that the running suite test runs at other sizes than it names (suite._support.supported): the
    report carries it (user property ``gdn_substituted``), and a failure's message starts with it, so a failure
    reported at Dk=16, Dv=16 is not read as one at the Dk=32, Dv=16 the test's source shows."""
    if text not in _SUBSTITUTIONS:
        _SUBSTITUTIONS.append(text)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _SUBSTITUTIONS.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Generator[None, Any, None]:
    outcome = yield
    if call.when != "call" or not _SUBSTITUTIONS or not _in_suite(item.path):
        return
    report = outcome.get_result()
    note = "; ".join(_SUBSTITUTIONS)
    report.user_properties.append((SUBSTITUTION_PROPERTY, note))
    if report.failed:
        report.sections.append(("gdn-spec: sizes run", note))
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:  # the one-line message (pytest's short summary, gdn-spec check's FAILED list)
            crash.message = f"[{note}] {crash.message}"


def _unmet_promise(item: pytest.Item, profile: str, impl: Implementation) -> str | None:
    from .profiles import MARKER, unmet

    for mark in item.iter_markers(MARKER):
        reason = unmet(mark.args[0], profile, impl.capabilities)
        if reason:
            return reason
    return None


def contract_profile(config: pytest.Config) -> str:
    """The contract profile of this run (``--gdn-profile``, else the implementation's default)."""
    return config.stash.get(_PROFILE_KEY, "api")


@pytest.fixture(scope="session")
def gdn_impl(pytestconfig: pytest.Config) -> Implementation:
    """The implementation under test (its capabilities in ``.capabilities``)."""
    impl = pytestconfig.stash.get(_IMPL_KEY, None)
    if impl is None:
        pytest.skip("no GDN implementation requested (--gdn-impl)")
    return impl
