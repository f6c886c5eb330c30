"""Project sessions: tests, conformance, integration, lint, bench, thirdparty, neuron (the real Neuron SDK; skips
cleanly without it).

Every session installs the repo's packages into its own virtualenv; nothing is installed by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "tests", "conformance", "integration"]
nox.options.error_on_missing_interpreters = False

ROOT = Path(__file__).parent
PACKAGES = ["gdn-ref", "gdn-spec", "nki-cpu", "gdn-nki"]
# Implementations the conformance suite runs against: "module:callable" specs, each with the pytest-xdist workers of
# its run, longest run first. gdn-nki's prefill is ``simulate`` for dense calls and ``prefill_varlen`` with
# cu_seqlens (``simulate`` alone takes none, and the varlen area skipped it); gdn_nki:decode_step declares
# gdn_spec_decode_capabilities: the decode family.
# The runs share the cores (``_run_concurrently``): the simulated kernel's run, about three quarters of the CPU time,
# gets two workers so that it keeps both cores busy once the short runs end; those run in one process each, since a
# worker costs a process start, the imports and a collection of the suite (about 3 s of CPU each) and two more would
# only take turns on the same cores.
IMPLEMENTATIONS = {
    "gdn_nki.conformance:simulate_with_varlen": "2",
    "gdn_ref:gdn_cte": "0",
    "gdn_nki:decode_step": "0",
    "gdn_nki.conformance:decode_step_on_two_programs": "0",  # the decode family at launch grid 2
}


def _interpreter(version: str) -> str:
    """A runnable interpreter for ``version``: ``pythonX.Y`` on PATH if it runs, else a pyenv installation of it,
    else the bare version (nox then skips the session, saying the interpreter was not found)."""
    on_path = shutil.which(f"python{version}")
    if on_path and subprocess.run([on_path, "-c", ""], capture_output=True, check=False).returncode == 0:
        return on_path
    pyenv = shutil.which("pyenv")
    if pyenv:
        listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, check=False).stdout
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False).stdout.strip()
        matches = sorted(v for v in listed.split() if v.startswith(f"{version}."))
        if matches and root:
            return str(Path(root) / "versions" / matches[-1] / "bin" / "python")
    return version


# The packages support Python 3.10–3.12; the unit tests run on each.
PYTHON_VERSIONS = ("3.10", "3.11", "3.12")


def _install_repo(session: nox.Session, *extras: str) -> None:
    """Install every package of the repo (editable) plus test tools, in dependency order."""
    args: list[str] = []
    for name in PACKAGES:
        args += ["-e", f"packages/{name}[test]"]
    session.install(*args, *extras)


def _xdist_workers() -> str:
    return os.environ.get("GDN_TEST_WORKERS", "auto")


# pytest-xdist already runs one worker per core; multi-threaded BLAS inside each worker only oversubscribes them
# (measured: 10x slower small matmuls under load on 2 cores).
SINGLE_THREAD_BLAS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@nox.session
@nox.parametrize("python", [_interpreter(v) for v in PYTHON_VERSIONS], ids=list(PYTHON_VERSIONS))
def tests(session: nox.Session) -> None:
    """Unit tests of every package and the conformance suite's self-tests (matplotlib: the PNG timeline test), then
    every bench script's smoke run (``_bench_smoke``)."""
    _install_repo(session, "matplotlib>=3.7")
    for name in PACKAGES:
        tests_dir = ROOT / "packages" / name / "tests"
        session.run("pytest", "-n", _xdist_workers(), "-q", str(tests_dir), *session.posargs, env=SINGLE_THREAD_BLAS)
    _bench_smoke(session)


def _bench_scripts() -> list[Path]:
    """The packages' bench scripts (``nox -s bench`` runs each with ``--out bench-out``)."""
    return sorted(ROOT.glob("packages/*/bench/bench_*.py"))


def _bench_smoke(session: nox.Session) -> None:
    """Every bench script end to end at its smallest sizes (``--smoke``), writing into a scratch ``--out``
    directory, where each must leave its files: a change that breaks a bench fails CI instead of the next
    ``nox -s bench`` after minutes of work (a bench once wrote its table to the directory's path itself). About
    15 s for the five scripts (measured on the 2-core dev VM); their output is shown when one fails."""
    with tempfile.TemporaryDirectory() as scratch:
        for script in _bench_scripts():
            session.run("python", str(script), "--smoke", "--out", scratch, env=SINGLE_THREAD_BLAS, silent=True)
            if not any(Path(scratch).glob(f"{script.stem}*")):
                session.error(f"{script.relative_to(ROOT)} --smoke --out DIR wrote no {script.stem}* file to DIR")


@nox.session
def conformance(session: nox.Session) -> None:
    """The gdn-spec suite against every implementation, both algorithms, fp32 and bf16 (the decode family for
    gdn-nki's decode step): the runs at once, each report printed whole when it ends, the session failing when
    any run does.

    Measured from a fresh clone on 2 cores shared with other jobs (load about 7, so CPU time; wall time there
    says little): user + sys CPU of gdn-nki's run 76 s (two workers), gdn-ref's 14 s, the decode run 6.6 s, the
    setup (virtualenv, four editable installs from uv's cache) about 6 s; the whole session 106 s. On the 2 cores
    idle that is about 6 + 97 / 2 ≈ 55 s of wall time, the cores busy until gdn-nki's last test. Issue 41's cases
    since: the decode run 8.1 → 11.5 s and the varlen area four tests more (measured side by side, load about 5).
    """
    _install_repo(session)
    # Implementations named on the command line, or a worker count set in GDN_TEST_WORKERS, take the usual workers.
    plan = (
        dict.fromkeys(session.posargs or IMPLEMENTATIONS, _xdist_workers())
        if session.posargs or "GDN_TEST_WORKERS" in os.environ
        else IMPLEMENTATIONS
    )
    _run_concurrently(session, [["gdn-spec", "check", impl, "-n", workers] for impl, workers in plan.items()])


def _run_concurrently(session: nox.Session, commands: list[list[str]]) -> None:
    """Start every command in the session's virtualenv, then print each one's output whole as soon as it has ended.

    One after the other, the cores idled through each run's start-up and its last slow tests: the short runs now
    go inside the long one (their processes share the cores), and a short run's report is printed while the long
    one goes on.
    """
    env = {**os.environ, **SINGLE_THREAD_BLAS, "PATH": os.pathsep.join([session.bin, os.environ.get("PATH", "")])}
    running = []
    for command in commands:
        session.log(" ".join(command))
        output = tempfile.TemporaryFile(mode="w+")
        running.append((command, subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT), output))
    failed = []
    while running:
        ended = [run for run in running if run[1].poll() is not None]
        if not ended:
            time.sleep(REPORT_POLL_SECONDS)
        for command, process, output in ended:
            running.remove((command, process, output))
            output.seek(0)
            print(output.read(), flush=True)
            output.close()
            if process.returncode:
                failed.append(f"{' '.join(command)} (exit code {process.returncode})")
    if failed:
        session.error("failed: " + "; ".join(failed))


# How often _run_concurrently looks for ended runs: a report shows at most this late, and polling costs nothing.
REPORT_POLL_SECONDS = 0.2


HF_QWEN3_NEXT = "transformers.models.qwen3_next.modeling_qwen3_next"
FLA_NAIVE = "fla.ops.gated_delta_rule.naive"
VALIDATED_OUT = ROOT / "thirdparty-out"
# gdn-spec's seq-first adapter for a kernel taking a state pool and every serving keyword (gdn-spec's README).
SERVING_ADAPTER = "fla-torch:varlen=yes,pool=initial_state_indices,bucket=yes,checkpoints=yes,read_rows=yes"


@nox.session
def thirdparty(session: nox.Session) -> None:
    """gdn-spec against third-party GDN kernels on CPU torch (math profile through the seq-first adapters), gdn-nki's
    FLA-compatible torch entry point (also as a serving kernel: SGLang's pool call, bucket, checkpoints, read rows)
    and its raw @nki.jit kernel; writes the README's "kernels validated" table."""
    _install_repo(session, *INTEGRATION_DEPS)
    VALIDATED_OUT.mkdir(exist_ok=True)
    summaries: list[str] = []

    def check(label: str, spec: str, adapter: str, third_party: bool = True, areas: tuple[str, ...] = ()) -> None:
        # A third-party kernel's failed tests (exit 1) are findings for the table; anything else (usage error,
        # internal error, nothing ran) and any failure of this repo's own kernels fails the session. ``areas``:
        # only these contract areas (the table shows — for the others).
        summary = str(VALIDATED_OUT / f"{len(summaries) + 1:02d}.json")
        only = [argument for area in areas for argument in ("--area", area)]
        via = ["--adapter", adapter] if adapter else []
        session.run(
            "gdn-spec", "check", spec, *via, "--label", label, "--json", summary, *only,
            "-n", _xdist_workers(), env=SINGLE_THREAD_BLAS, success_codes=[0, 1] if third_party else [0],
        )  # fmt: skip
        summaries.append(summary)

    # HF's functions dispatch to flash-linear-attention's Triton kernels when it is importable (and those need a
    # GPU): the torch reference paths are checked before it is installed.
    check("HF transformers torch_chunk_gated_delta_rule", f"{HF_QWEN3_NEXT}:torch_chunk_gated_delta_rule", "hf-torch")
    check(
        "HF transformers torch_recurrent_gated_delta_rule",
        f"{HF_QWEN3_NEXT}:torch_recurrent_gated_delta_rule",
        "hf-torch",
    )
    check(
        "HF transformers torch_recurrent_gated_delta_rule as a decode step",
        f"{HF_QWEN3_NEXT}:torch_recurrent_gated_delta_rule",
        "hf-decode",
    )
    # The conv family (``gdn-spec check --family conv``, found by the adapter or the kernel's declared capabilities):
    # HF's torch fallbacks through their pool / cache glue, gdn-nki's vLLM drop-in called in vLLM's pool form (−1
    # rows, rejections), and gdn-nki's own conv entry points; rows conv_decode / conv_prefill of the table.
    check("HF transformers causal_conv1d_update (conv decode)", f"{HF_QWEN3_NEXT}:causal_conv1d_update", "hf-conv")
    check("HF transformers causal_conv1d_fn (conv prefill)", f"{HF_QWEN3_NEXT}:causal_conv1d_fn", "hf-conv-fn")
    check("gdn-nki vLLM-compatible causal_conv1d_update drop-in", "gdn_nki.torch:causal_conv1d_update", "vllm-conv",
          third_party=False)  # fmt: skip
    check("gdn-nki conv_decode_step", "gdn_nki:conv_decode_step", "", third_party=False)
    check("gdn-nki conv_prefill_bucket", "gdn_nki:conv_prefill_bucket", "", third_party=False)
    session.install("flash-linear-attention>=0.4")
    # FLA's naive references: pure torch, one head count for q, k and v (the adapter repeats key heads).
    check("FLA naive_chunk_gated_delta_rule", f"{FLA_NAIVE}:naive_chunk_gated_delta_rule", "fla-torch:gqa=repeat")
    check(
        "FLA naive_recurrent_gated_delta_rule", f"{FLA_NAIVE}:naive_recurrent_gated_delta_rule", "fla-torch:gqa=repeat"
    )
    check(
        "FLA naive_recurrent_gated_delta_rule as a decode step",
        f"{FLA_NAIVE}:naive_recurrent_gated_delta_rule",
        "fla-decode:gqa=repeat",
    )
    check(
        "gdn-nki vLLM-compatible decode drop-in",
        "gdn_nki.torch_decode:vllm_fused_recurrent_gated_delta_rule",
        "vllm-decode",
        third_party=False,
    )
    check(
        "gdn-nki FLA-compatible torch entry point",
        "gdn_nki.torch:chunk_gated_delta_rule",
        "fla-torch:varlen=yes",
        third_party=False,
    )
    # The same entry point called as a serving kernel: SGLang's pool-native call (the pool as initial_state, its
    # rows as initial_state_indices) with gdn-nki's bucket, checkpoints and read rows; the varlen area's serving
    # checks (the other areas make the same calls as the row above).
    check(
        "gdn-nki torch entry point as a serving kernel",
        "gdn_nki.torch:chunk_gated_delta_rule",
        SERVING_ADAPTER,
        third_party=False,
        areas=("varlen",),
    )
    check("gdn-nki raw @nki.jit kernel", "gdn_nki:gdn_cte", "nki", third_party=False)
    check("gdn-nki simulate with torch tensors", "gdn_nki:simulate", "torch", third_party=False)
    session.run("python", "-m", "gdn_spec.validated", "--readme", "README.md", *summaries)


# The PyTorch integration: torch (PyPI's wheel, run on the CPU) and the transformers release the Qwen3-Next
# comparison was written against.
INTEGRATION_DEPS = ("torch>=2.4", "transformers>=5.24")
INTEGRATION_TESTS = (
    "packages/gdn-nki/tests/test_torch.py",
    "packages/gdn-nki/tests/test_torch_options.py",
    "packages/gdn-nki/tests/test_qwen3_next.py",
    "packages/gdn-nki/tests/test_torch_decode.py",
    "packages/gdn-nki/tests/test_torch_entry_point_rejections.py",
    "packages/gdn-nki/tests/test_qwen3_next_generate.py",
    "packages/gdn-nki/tests/test_serve_qwen3_next.py",
    "packages/gdn-nki/tests/test_serving_engine.py",
    "packages/gdn-nki/tests/test_torch_ops.py",
    "packages/gdn-nki/tests/test_torch_compile.py",
    "packages/gdn-nki/tests/test_torch_device.py",
    "packages/gdn-nki/tests/test_torch_conv_device.py",
    "packages/gdn-nki/tests/test_context_parallel.py",
    "packages/gdn-nki/tests/test_context_parallel_device.py",
    "packages/gdn-nki/tests/test_torch_conv.py",
    "packages/gdn-nki/tests/test_torch_conv_varlen.py",
    "packages/gdn-nki/tests/test_torch_norm.py",
    "packages/gdn-nki/tests/test_torch_gating.py",
    "packages/gdn-nki/tests/test_torch_traced_rejections.py",
    "packages/gdn-nki/tests/test_torch_drop_in_signatures.py",
    "packages/gdn-nki/tests/test_torch_conv_serving.py",
    "packages/gdn-nki/tests/test_torch_conv_norm_rejection_names.py",
    "packages/gdn-nki/tests/test_torch_overflow.py",
    "packages/gdn-nki/tests/test_torch_grad_mode.py",
    "packages/gdn-nki/tests/test_torch_state_layout.py",
    "packages/gdn-nki/tests/test_torch_vllm_decode.py",
    "packages/gdn-nki/tests/test_torch_strided_pools.py",
    "packages/gdn-nki/tests/test_torch_paged_pools.py",
    "packages/gdn-nki/tests/test_torch_bucket_normed.py",
)
# Tests in the packages' other files that skip without torch (the tests session installs none): run here, where it
# is, selected by name so the rest of those files is not run twice. Per package: each tests/ dir has its own conftest.
TORCH_GATED_TESTS = {
    "nki-cpu": ("packages/nki-cpu/tests/test_nki_torch.py",),
    "gdn-ref": ("packages/gdn-ref/tests/test_block.py",),  # the decode block oracle against a torch layer
    # the torch drop-in's bucket= and its trace count; the conv decode's SBUF refusal through the torch drop-in
    "gdn-nki": ("packages/gdn-nki/tests/test_nki_bucket.py", "packages/gdn-nki/tests/test_conv_step_sbuf.py"),
    "gdn-spec": ("packages/gdn-spec/tests/test_adapters.py", "packages/gdn-spec/tests/test_power_adapters.py"),
}
TORCH_GATED_SELECTION = "torch or hf_transformers"


@nox.session
def integration(session: nox.Session) -> None:
    """gdn-nki in PyTorch model code: torch tensors at the host entry points, the FLA-compatible entry point
    (varlen, state pools, bad input), a Qwen3-Next layer and model against HF's own torch path, and a serving loop
    (continuous batching, speculative decoding, prefix cache) token for token against HF; then the torch tests of
    nki-cpu (torch tensors as launch arguments) and gdn-spec (the torch adapters, torch mutants)."""
    _install_repo(session, *INTEGRATION_DEPS)
    session.run("pytest", "-n", _xdist_workers(), "-q", *INTEGRATION_TESTS, *session.posargs, env=SINGLE_THREAD_BLAS)
    for paths in TORCH_GATED_TESTS.values():
        session.run(
            "pytest", "-n", _xdist_workers(), "-q", "-k", TORCH_GATED_SELECTION, *paths, env=SINGLE_THREAD_BLAS
        )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint and format check over the whole repo."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: reference accuracy/speed, interpreter overhead, kernel and decode cost-model tables, each script
    writing its files (named after it) into ``bench-out/``; ``nox -s bench -- --smoke`` runs the smallest sizes."""
    _install_repo(session, "matplotlib>=3.7")
    out = ROOT / "bench-out"
    out.mkdir(exist_ok=True)
    for script in _bench_scripts():
        session.run("python", str(script), "--out", str(out), *session.posargs)


# AWS's package index for the Neuron SDK (the real `nki` / `neuronx-cc`; PyPI's packages of those names are
# placeholders). Override with GDN_NEURON_INDEX (a mirror, say).
NEURON_INDEX = "https://pip.repos.neuron.amazonaws.com"
# The kernel needs NKI 0.7.0 = Neuron SDK 2.33 (gdn_nki.common.backend.MIN_NKI_VERSION).
NEURON_PACKAGES = ["nki>=0.7.0", "neuronx-cc>=2.0"]


def _neuron_machine() -> bool:
    """A Trainium/Inferentia host: a NeuronDevice is attached or the Neuron tools are installed."""
    return any(Path("/dev").glob("neuron[0-9]*")) or shutil.which("neuron-ls") is not None


@nox.session
def neuron(session: nox.Session) -> None:
    """On the real Neuron SDK: gdn-nki's tests and the gdn-spec suite through nki.simulate, then both algorithms
    compiled and (with a device) benchmarked at Qwen3-Next shapes into bench-out/. Prints "skipped: Neuron SDK not
    installed" and succeeds where the SDK cannot be had (no Neuron host and no GDN_NEURON_INDEX)."""
    if not (_neuron_machine() or os.environ.get("GDN_NEURON_INDEX")):
        session.log(f"skipped: Neuron SDK not installed; on a Neuron host this session would run: {NEURON_PLAN}")
        return
    _install_repo(session)
    session.install("--extra-index-url", os.environ.get("GDN_NEURON_INDEX", NEURON_INDEX), *NEURON_PACKAGES)
    if not _real_nki_in_session(session):
        session.log(f"skipped: Neuron SDK not installed; on a Neuron host this session would run: {NEURON_PLAN}")
        return
    env = {
        **SINGLE_THREAD_BLAS,
        "NEURON_PLATFORM_TARGET_OVERRIDE": os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2"),
    }
    out = ROOT / "bench-out"
    out.mkdir(exist_ok=True)
    session.run("pytest", "-q", "-n", _xdist_workers(), str(ROOT / "packages/gdn-nki/tests"), env=env)
    session.run("gdn-spec", "check", "gdn_nki:simulate", "-n", _xdist_workers(), env=env)
    session.run("python", str(ROOT / "packages/gdn-nki/bench/neuron_kernel.py"), "--out", str(out), env=env)
    # The torch ops on the device: torch-neuronx from the same index, then the ops' tests (fake tensors, opcheck,
    # compile, export, the device path's layouts) and the conformance suite through the drop-in on device tensors.
    # Never run yet (README, "Running on Trainium"): a failure here is the first news of the device path.
    session.install("--extra-index-url", os.environ.get("GDN_NEURON_INDEX", NEURON_INDEX), *NEURON_TORCH_PACKAGES)
    session.run("pytest", "-q", *TORCH_OPS_TESTS, env={**env, "GDN_TORCH_DEVICE": NEURON_TORCH_DEVICE,
                                                     "GDN_TORCH_COMPILE_BACKEND": NEURON_COMPILE_BACKEND})  # fmt: skip
    session.run("gdn-spec", "check", "gdn_nki.torch:chunk_gated_delta_rule", "--adapter", "fla-torch:varlen=yes",
                "--device", NEURON_TORCH_DEVICE, env=env)  # fmt: skip


# torch-neuronx (its torch and the XLA device), from AWS's index like the SDK; the ops' tests and their device.
NEURON_TORCH_PACKAGES = ["torch-neuronx>=2.14", "transformers>=5.24"]
NEURON_TORCH_DEVICE = "xla"
NEURON_COMPILE_BACKEND = "neuron"  # torch-neuronx's torch.compile backend (the recipe)
TORCH_OPS_TESTS = tuple(
    f"packages/gdn-nki/tests/{name}"
    for name in (
        "test_torch_ops.py",
        "test_torch_compile.py",
        "test_torch_device.py",
        "test_torch_conv_device.py",
        "test_torch_gating.py",
        "test_torch_traced_rejections.py",
    )
)
NEURON_PLAN = (
    "gdn-nki's tests and gdn-spec check gdn_nki:simulate on the real nki; bench/neuron_kernel.py (compile, and "
    "nki.benchmark with a device); torch-neuronx's ops: pytest " + " ".join(TORCH_OPS_TESTS) + f" on "
    f"GDN_TORCH_DEVICE={NEURON_TORCH_DEVICE}, GDN_TORCH_COMPILE_BACKEND={NEURON_COMPILE_BACKEND}; gdn-spec check "
    f"gdn_nki.torch:chunk_gated_delta_rule --adapter fla-torch:varlen=yes --device {NEURON_TORCH_DEVICE}"
)


def _real_nki_in_session(session: nox.Session) -> bool:
    """True when the session's interpreter runs gdn-nki on the real nki (which also passed its version check)."""
    probe = "import gdn_nki.common.backend as b, sys; sys.exit(0 if b.USING_REAL_NKI else 1)"
    try:
        session.run("python", "-c", probe, silent=True)
    except nox.command.CommandFailed:
        return False
    return True
