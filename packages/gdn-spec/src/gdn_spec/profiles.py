"""Contract profiles: which of gdn_cte's promises a run holds the implementation to.

Every suite test checks the numbers; some also check an *API promise* beyond them, and say so with
``@pytest.mark.gdn_requires(PROMISE)``. A profile is the set of promises a run enforces:

- ``api``: all of them — gdn_cte's full contract. The default for callables with gdn_cte's signature.
- ``math``: none — numerics over every regime, head mapping, chunk-boundary invariance, batch and head
  independence, determinism, the initial state in and the final state out as values. For kernels that do not
  implement gdn_cte's argument validation or in-place state (FLA- and HF-style functions); the default of the
  seq-first adapters.

A test needing a promise the profile leaves out, or one the implementation's capabilities decline
(``validates_arguments=False``, ``state_in_place=False``), is SKIPPED with the reason — never passed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core import Capabilities

MARKER = "gdn_requires"

# promise -> what it means (the skip reason quotes it)
PROMISES = {
    "validation": "invalid calls are rejected naming the argument, with every buffer left untouched",
    "in_place_state": "a supplied recurrent_state is updated in place and returned as the same object; "
    "an omitted one comes back as a fresh float32 array",
    "dtypes": "out in query's dtype, the state float32",
}

PROFILES = {
    "api": tuple(PROMISES),
    "math": (),
}
PROFILE_DOCS = {
    "api": "gdn_cte's full contract: every area",
    "math": "numerics, head mapping, chunk boundaries, independence, determinism, state in/out as values",
}
# The same profiles as a decode run (``--family decode``) applies them: to the decode contract's areas.
DECODE_PROFILE_DOCS = {
    "api": "the decode step's full contract (gdn_nki.decode_step's): every decode area",
    "math": "decode numerics, consistency with prefill, speculative steps as values; no in-place pool or rejections",
}

# promise -> the capability that can decline it within the api profile
_CAPABILITY_OF = {"validation": "validates_arguments", "in_place_state": "state_in_place"}


def unmet(promise: str, profile: str, caps: Capabilities) -> str | None:
    """Why a test needing ``promise`` does not run under ``profile`` for an implementation, or None."""
    if promise not in PROMISES:
        raise ValueError(f"unknown promise {promise!r} in @pytest.mark.{MARKER}; known: {sorted(PROMISES)}")
    if promise not in PROFILES[profile]:
        return f"profile {profile!r} leaves out the API promise {promise!r} ({PROMISES[promise]})"
    capability = _CAPABILITY_OF.get(promise)
    if capability and not getattr(caps, capability):
        return f"{caps.declaring(capability)} ({PROMISES[promise]})"
    return None
