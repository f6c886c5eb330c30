"""Every gdn_spec_capabilities key's value is checked when the implementation is loaded: the type, the range and
the allowed names, with an error naming the key, the value, the rule and the fix (and the CLI prints it cleanly)."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from gdn_spec.capability_rules import CHECKS
from gdn_spec.cli import main
from gdn_spec.impl import ADAPTER_ONLY_FIELDS, Capabilities, ImplementationError, load

# (declaration, words the error must contain): per key, a value of the wrong type and one out of range.
BAD = [
    ({"name": ""}, ("name=''", "non-empty string", "'my-kernel'")),
    ({"name": 7}, ("name=7", "non-empty string")),
    ({"algorithms": "schur"}, ("algorithms='schur'", "not a bare string", "write ('schur',)")),
    ({"algorithms": ("schur", "nuemann")}, ("'nuemann'", "not one of", "did you mean 'neumann'?")),
    ({"algorithms": []}, ("algorithms=[]", "non-empty collection of names", "leave the key out (both)")),
    ({"dtypes": "float32"}, ("dtypes='float32'", "not a bare string", "write ('float32',)")),
    ({"dtypes": ("fp32",)}, ("dtypes=('fp32',)", "'fp32', which is not one of 'float32', 'bfloat16'")),
    ({"dtypes": None}, ("dtypes=None", "non-empty collection of names", "(a list, tuple, set")),
    ({"max_seq_len": "1024"}, ("max_seq_len='1024'", "positive integer, not a str", "write 1024 without quotes")),
    ({"max_seq_len": -5}, ("max_seq_len=-5", "positive integer", "largest S")),
    ({"max_seq_len": 0}, ("max_seq_len=0", "positive integer")),
    ({"max_seq_len": 1024.0}, ("max_seq_len=1024.0", "not a float", "write 1024 (an int")),
    ({"max_seq_len": True}, ("max_seq_len=True", "not a bool")),
    ({"max_lanes": 2.5}, ("max_lanes=2.5", "positive integer, not a float", "B·Hv")),
    ({"max_lanes": -1}, ("max_lanes=-1", "positive integer")),
    ({"max_work": "big"}, ("max_work='big'", "positive integer, not a str", "1 << 24")),
    ({"max_work": 0}, ("max_work=0", "positive integer")),
    ({"example_scale": "0.5"}, ("example_scale='0.5'", "number in (0, 1], not a str", "write 0.5 without quotes")),
    ({"example_scale": 0}, ("example_scale=0", "(0, 1]")),
    ({"example_scale": 1.5}, ("example_scale=1.5", "(0, 1]", "0.25")),
    ({"example_scale": float("nan")}, ("example_scale=nan", "(0, 1]")),
    ({"example_scale": True}, ("example_scale=True", "not a bool")),
    ({"validates_arguments": "no"}, ("validates_arguments='no'", "must be a bool", "write False without quotes")),
    ({"state_in_place": "False"}, ("state_in_place='False'", "must be a bool", "write False without quotes")),
    ({"content_checks": 1}, ("content_checks=1", "must be a bool", "True or False")),
    ({"varlen": "yes"}, ("varlen='yes'", "must be a bool", "write True without quotes", "cu_seqlens")),
    ({"varlen": None}, ("varlen=None", "must be a bool")),
    ({"state_pool": "yes"}, ("state_pool='yes'", "must be a bool", "write True without quotes")),
    ({"bucket": 1}, ("bucket=1", "must be a bool")),
    ({"checkpoints": "no"}, ("checkpoints='no'", "must be a bool", "write False without quotes")),
    ({"read_rows": 1}, ("read_rows=1", "must be a bool")),
    ({"fixed_scale": 1}, ("fixed_scale=1", "must be a bool", "Dk**-0.5")),
    ({"any_seq_len": "yes"}, ("any_seq_len='yes'", "must be a bool", "chunk multiple")),
    ({"equal_head_dims": "yes"}, ("equal_head_dims='yes'", "must be a bool", "Dk == Dv")),
    ({"inexpressible_rules": "recurrent_state.writable"}, ("inexpressible_rules=", "not a bare string")),
    ({"inexpressible_rules": ("no.such_rule",)}, ("'no.such_rule', which is not one of",)),
    ({"max_head_dim": 256}, ("max_head_dim=256", "[1, 128]", "largest Dk and Dv")),
    (
        {"head_dims": [64.0, 128]},
        ("head_dims=[64.0, 128]", "lists 64.0, which is not an integer in [1, 128]", "(64, 128)"),
    ),
]


@pytest.mark.parametrize(("raw", "words"), BAD, ids=[f"{next(iter(r))}={r[next(iter(r))]!r}" for r, _ in BAD])
def test_a_bad_value_names_the_key_the_value_the_rule_and_the_fix(raw: dict, words: tuple[str, ...]) -> None:
    with pytest.raises(ImplementationError) as info:
        Capabilities.from_mapping(raw, "k")
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# A quoted value and the fix its message gives: "write X without quotes" only when X itself passes the key's rule.
QUOTED = [
    ({"max_seq_len": "1024"}, "write 1024 without quotes"),
    ({"max_lanes": " 16 "}, "write 16 without quotes"),
    ({"example_scale": "0.5"}, "write 0.5 without quotes"),
    ({"example_scale": "1"}, "write 1.0 without quotes"),
    ({"max_seq_len": "-3"}, "give the largest S (tokens per call) the kernel accepts as an int, e.g. 1024, or leave"),
    ({"max_seq_len": "0"}, "give the largest S (tokens per call) the kernel accepts as an int, e.g. 1024, or leave"),
    ({"max_work": "-1"}, "give the largest B·Hv·S·Dk·Dv per call as an int, e.g. 1 << 24, or leave the key out"),
    ({"example_scale": "2"}, "give the fraction of the profile's Hypothesis examples, e.g. 0.25, or leave"),
    ({"example_scale": "nan"}, "give the fraction of the profile's Hypothesis examples, e.g. 0.25, or leave"),
    ({"example_scale": "inf"}, "give the fraction of the profile's Hypothesis examples, e.g. 0.25, or leave"),
    ({"example_scale": "-0.5"}, "give the fraction of the profile's Hypothesis examples, e.g. 0.25, or leave"),
]


@pytest.mark.parametrize(("raw", "fix"), QUOTED, ids=[repr(raw) for raw, _ in QUOTED])
def test_a_quoted_value_is_suggested_unquoted_only_when_that_is_valid(raw: dict, fix: str) -> None:
    """max_seq_len='-3' was told "write -3 without quotes", example_scale='2' "write 2.0 without quotes": values
    the same rule refuses. The fix for those is the key's own."""
    with pytest.raises(ImplementationError) as info:
        Capabilities.from_mapping(raw, "k")
    message = str(info.value)
    assert "; " + fix in message, message  # the fix, right after the rule
    if "without quotes" not in fix:
        assert "without quotes" not in message, message


def test_every_key_is_checked() -> None:
    """The checks cover exactly the Capabilities fields: a new field without a rule would go unchecked."""
    assert set(CHECKS) == {f.name for f in dataclasses.fields(Capabilities)} - set(ADAPTER_ONLY_FIELDS)
    assert all(any(next(iter(raw)) == key for raw, _ in BAD) for key in CHECKS), "a key without a bad-value case"


@pytest.mark.parametrize(("key", "close"), [("dtype", "dtypes"), ("max_seq", "max_seq_len"), ("varlen_", "varlen")])
def test_an_unknown_key_lists_the_valid_keys_and_the_closest(key: str, close: str) -> None:
    with pytest.raises(ImplementationError) as info:
        Capabilities.from_mapping({key: 1}, "k")
    message = str(info.value)
    assert f"unknown capability key {key!r}" in message and f"did you mean {close!r}?" in message, message
    assert all(valid in message for valid in CHECKS), message


@pytest.mark.parametrize(
    ("raw", "needed"),
    [
        ({"state_pool": True}, "varlen=True"),
        ({"bucket": True}, "varlen=True"),
        ({"varlen": True, "checkpoints": True}, "state_pool=True"),
        ({"varlen": True, "read_rows": True}, "state_pool=True"),
        ({"varlen": True, "state_pool": True, "state_in_place": False}, "state_in_place"),
    ],
)
def test_a_serving_keyword_without_what_it_needs_is_an_error(raw: dict, needed: str) -> None:
    """A pool, bucket or checkpoints claim the suite could not test as claimed (no cu_seqlens call to put it in,
    checkpoint rows without a pool, a pool never written in place) fails at load, naming what it needs."""
    with pytest.raises(ImplementationError, match=re.escape(needed)):
        Capabilities.from_mapping(raw, "k")
    serving = {"varlen": True, "state_pool": True, "bucket": True, "checkpoints": True, "read_rows": True}
    declared = Capabilities.from_mapping(serving, "k")
    assert declared.checkpoints and declared.read_rows


def test_a_declaration_that_is_not_a_dict_is_an_error() -> None:
    with pytest.raises(ImplementationError, match=r"gdn_spec_capabilities=\['schur'\] must be a dict.*not a list"):
        Capabilities.from_mapping(["schur"], "k")  # type: ignore[arg-type]


def test_good_values_are_normalized() -> None:
    caps = Capabilities.from_mapping(
        {
            "name": "k2",
            "algorithms": ["schur", "schur"],
            "dtypes": ["bfloat16"],
            "max_seq_len": np.int64(512),
            "max_lanes": 4,
            "max_work": 1 << 20,
            "example_scale": np.float32(0.5),
            "varlen": True,
            "head_dims": [128, 64],
        },
        "k",
    )
    assert (caps.name, caps.algorithms, caps.dtypes, caps.head_dims) == ("k2", ("schur",), ("bfloat16",), (64, 128))
    assert type(caps.max_seq_len) is int and caps.max_seq_len == 512 and caps.example_scale == 0.5
    assert Capabilities.from_mapping(None, "k") == Capabilities("k")
    assert Capabilities.from_mapping({"max_seq_len": None}, "k").max_seq_len is None  # None = no limit, as omitted


# Collections and numpy scalars the old implementation accepted: (declaration, the normalized value). Sets come back
# in a deterministic order: names in the allowed order, sizes sorted.
ACCEPTED = [
    ({"head_dims": range(16, 129, 16)}, (16, 32, 48, 64, 80, 96, 112, 128)),
    ({"head_dims": np.array([128, 64])}, (64, 128)),
    ({"head_dims": {128, 16, 64}}, (16, 64, 128)),
    ({"head_dims": frozenset({100})}, (100,)),
    ({"head_dims": (np.int32(64), np.uint8(16))}, (16, 64)),
    ({"algorithms": {"schur"}}, ("schur",)),
    ({"algorithms": {"neumann", "schur"}}, ("schur", "neumann")),
    ({"algorithms": frozenset({"neumann", "schur"})}, ("schur", "neumann")),
    ({"algorithms": ["neumann", "schur"]}, ("neumann", "schur")),  # an ordered collection keeps its order
    ({"algorithms": np.array(["neumann"])}, ("neumann",)),
    ({"dtypes": {"bfloat16", "float32"}}, ("float32", "bfloat16")),
    ({"inexpressible_rules": {"recurrent_state.writable"}}, ("recurrent_state.writable",)),
    ({"varlen": np.True_}, True),
    ({"state_in_place": np.False_}, False),
    ({"equal_head_dims": np.bool_(True)}, True),
    ({"max_seq_len": np.int32(64)}, 64),
    ({"max_lanes": np.uint16(2)}, 2),
    ({"max_head_dim": np.int64(64)}, 64),
]


def _ids(cases: list[tuple[dict, object]]) -> list[str]:
    """Stable test ids (a set's or a generator's repr can differ between xdist workers)."""
    return [f"{i}-{key}-{type(value).__name__}" for i, ((key, value),) in enumerate(raw.items() for raw, _ in cases)]


@pytest.mark.parametrize(("raw", "normalized"), ACCEPTED, ids=_ids(ACCEPTED))
def test_collections_and_numpy_scalars_are_accepted_and_normalized(raw: dict, normalized: object) -> None:
    """head_dims=range(16, 129, 16) or np.array([64, 128]), algorithms={'schur'} and flags given as np.True_ were
    refused (only lists and tuples, only Python bools): any collection but a string or a mapping is accepted, as
    plain tuples of str and int, bools and ints."""
    ((key, value),) = raw.items()
    got = getattr(Capabilities.from_mapping(raw, "k"), key)
    assert got == normalized and type(got) is type(normalized), (value, got)
    if isinstance(got, tuple):
        assert [type(x) for x in got] == [type(x) for x in normalized], got


# Still refused: (declaration, words the error must contain).
STILL_REFUSED = [
    ({"algorithms": "schur"}, ("algorithms='schur'", "not a bare string", "write ('schur',)")),
    ({"algorithms": b"schur"}, ("algorithms=b'schur'", "not a bare string")),
    ({"algorithms": {"schur": True}}, ("algorithms={'schur': True}", "not a mapping")),
    ({"algorithms": np.array([["schur"]])}, ("algorithms=array([['schur']], dtype='<U5')", "1-D", "2-D")),
    ({"algorithms": np.array("schur")}, ("algorithms=array('schur', dtype='<U5')", "1-D", "0-D")),
    ({"algorithms": (n for n in ["schur"])}, ("algorithms=<generator", "non-empty collection of names")),
    ({"dtypes": set()}, ("dtypes=set()", "non-empty collection of names")),
    ({"head_dims": "64"}, ("head_dims='64'", "not a bare string")),
    ({"head_dims": 64}, ("head_dims=64", "collection of integers", "write (64,)")),
    ({"head_dims": ["64"]}, ("head_dims=['64']", "lists '64', which is not an integer in [1, 128]")),
    ({"head_dims": [True, 64]}, ("head_dims=[True, 64]", "lists True, which is not an integer")),
    (
        {"head_dims": np.array([64.0, 128.0])},
        ("head_dims=array([ 64., 128.])", "lists np.float64(64.0), which is not an integer"),
    ),
    ({"head_dims": range(0, 129, 64)}, ("head_dims=range(0, 129, 64)", "lists 0, which is not an integer in [1, 128]")),
    ({"head_dims": {64: "yes"}}, ("head_dims={64: 'yes'}", "not a mapping")),
    ({"max_seq_len": True}, ("max_seq_len=True", "not a bool")),
    ({"max_seq_len": np.True_}, ("max_seq_len=np.True_", "not a bool")),
    ({"max_seq_len": 1024.0}, ("max_seq_len=1024.0", "not a float", "write 1024 (an int")),
    ({"max_seq_len": "1024"}, ("max_seq_len='1024'", "not a str", "write 1024 without quotes")),
    ({"max_head_dim": np.float64(64.0)}, ("max_head_dim=np.float64(64.0)", "integer in [1, 128]")),
    ({"varlen": 1}, ("varlen=1", "must be a bool")),
    ({"varlen": np.int64(1)}, ("varlen=np.int64(1)", "must be a bool")),
    ({"varlen": "True"}, ("varlen='True'", "must be a bool", "write True without quotes")),
]


@pytest.mark.parametrize(("raw", "words"), STILL_REFUSED, ids=_ids(STILL_REFUSED))
def test_strings_mappings_bools_as_ints_and_floats_as_ints_are_still_refused(raw: dict, words: tuple) -> None:
    with pytest.raises(ImplementationError) as info:
        Capabilities.from_mapping(raw, "k")
    for word in words:
        assert word in str(info.value), (word, str(info.value))


BAD_KERNEL = """
def gdn_cte(**call):
    raise AssertionError("never called: the declaration is refused first")

gdn_cte.gdn_spec_capabilities = {"example_scale": "0.5"}
"""


def test_the_cli_prints_a_bad_declaration_as_one_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A string example_scale used to end ``gdn-spec check`` in a TypeError traceback; now it is a usage error
    (exit 2) whose one line names the spec, the attribute, the key, the value, the rule and the fix."""
    (tmp_path / "bad_caps_kernel.py").write_text(BAD_KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("bad_caps_kernel", None)
    assert main(["check", "bad_caps_kernel:gdn_cte"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert err.startswith("gdn-spec: 'bad_caps_kernel:gdn_cte'.gdn_spec_capabilities: capability example_scale='0.5'")
    assert err.endswith("must be a number in (0, 1], not a str; write 0.5 without quotes"), err
    with pytest.raises(ImplementationError, match="bad_caps_kernel:gdn_cte"):
        load("bad_caps_kernel:gdn_cte")
