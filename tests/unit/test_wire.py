"""The wire format: golden vectors both ways, strict decoding, properties, fuzzing.

The fuzz tests feed decode 10,500 inputs in all (random bytes, mutated vectors,
random MessagePack values, spec-shaped maps with random values, deep nesting): decode
must answer each with a RolloutGroup or a Rejection, never raise, and a group it
returns must encode again.
"""

from __future__ import annotations

import copy
import doctest
import json
import string
import struct
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sapo_node.intake import wire
from sapo_node.intake.wire import (
    EncodeError,
    Rejection,
    RolloutGroup,
    clip_utf8,
    decode,
    encode,
    topic,
)
from sapo_node.tasks import TaskRef, canonical_json

REPO = Path(__file__).resolve().parents[2]
VECTORS = REPO / "protocol" / "vectors"
VALID = sorted((VECTORS / "valid").glob("*.json"))
INVALID = sorted((VECTORS / "invalid").glob("*.json"))

# The reason codes wire.py defines: constants named as their value, upper-cased.
REASONS = {
    value
    for name, value in vars(wire).items()
    if name.isupper() and isinstance(value, str) and value == name.lower()
}

FUZZ = settings(
    deadline=1000,  # ms per input: a decode that hangs fails
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def load(path: Path) -> tuple[dict[str, Any], bytes]:
    """A vector's .json document and its .msgpack bytes."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    return doc, path.with_suffix(".msgpack").read_bytes()


def group_of(message: dict[str, Any]) -> RolloutGroup:
    """The RolloutGroup that a valid vector's message describes."""
    task = message["task"]
    return RolloutGroup(
        ref=TaskRef(task["family"], task["config"], task["seed"], task["index"]),
        generator=message["generator"],
        question=message["question"],
        completions=tuple(message["completions"]),
        unfinished=frozenset(i for i, f in enumerate(message["finished"]) if not f),
        model=message["model"],
        round=message["round"],
        created_ms=message["created"],
        answer=message["answer"],
        metadata=message["metadata"],
        modality=message["modality"],
        version=message["version"],
    )


def minimal_group() -> RolloutGroup:
    return group_of(load(VECTORS / "valid" / "minimal.json")[0]["message"])


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def assert_decodes_safely(data: Any) -> None:
    """decode answers with a group or a known rejection; a group encodes again."""
    got = decode(data)
    event(got.reason if isinstance(got, Rejection) else "decoded")  # --hypothesis-show-statistics
    if isinstance(got, Rejection):
        assert got.reason in REASONS, got
    else:
        assert isinstance(got, RolloutGroup)
        assert decode(encode(got)) == got


def test_doctests() -> None:
    assert doctest.testmod(wire).failed == 0


# --- golden vectors --------------------------------------------------------------------


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_vector(path: Path) -> None:
    doc, data = load(path)
    message = doc["message"]
    group = group_of(message)
    assert decode(data) == group
    assert encode(group) == data
    # The .json is the exact map, in the spec's field order.
    assert group.to_wire() == message
    assert list(group.to_wire()) == list(message) == list(wire.FIELDS)
    assert list(message["task"]) == list(wire.TASK_FIELDS)
    assert pack(message) == data


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_vector(path: Path) -> None:
    doc, data = load(path)
    got = decode(data)
    assert isinstance(got, Rejection)
    assert got.reason == doc["expect"]["reason"], got.detail
    # The .json describes the bytes truly.
    if "message" in doc:
        assert pack(doc["message"]) == data
    else:
        assert bytes.fromhex(doc["hex"]) == data
        assert doc["note"]


def test_vectors_cover_every_reason() -> None:
    assert len(REASONS) >= 13
    assert len(VALID) >= 5
    expected = {load(path)[0]["expect"]["reason"] for path in INVALID}
    assert expected == REASONS


def test_every_vector_file_has_its_pair() -> None:
    for sub in ("valid", "invalid"):
        files = {p.name for p in (VECTORS / sub).iterdir()}
        stems = {name.rsplit(".", 1)[0] for name in files}
        assert files == {f"{s}.{ext}" for s in stems for ext in ("json", "msgpack")}, sub


def test_vectors_are_what_the_script_writes(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_vectors.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    for sub in ("valid", "invalid"):
        written = {p.name: p.read_bytes() for p in (tmp_path / sub).iterdir()}
        stored = {p.name: p.read_bytes() for p in (VECTORS / sub).iterdir()}
        assert written.keys() == stored.keys(), sub
        changed = sorted(name for name in written if written[name] != stored[name])
        assert not changed, f"regenerate protocol/vectors: {changed} differ"


# --- random valid groups ---------------------------------------------------------------

NAME_PART = st.text(string.ascii_letters + string.digits + "_", min_size=1, max_size=12)
FAMILIES = st.builds(
    lambda parts, attr: ".".join(parts) + (f":{attr}" if attr else ""),
    st.lists(NAME_PART, min_size=1, max_size=3),
    st.none() | NAME_PART,
)
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
JSON_OBJECTS = st.dictionaries(
    st.text(max_size=10),
    JSON_SCALARS
    | st.lists(JSON_SCALARS, max_size=4)
    | st.dictionaries(st.text(max_size=5), JSON_SCALARS, max_size=3),
    max_size=6,
)
CONFIGS = JSON_OBJECTS.map(canonical_json).filter(
    lambda c: len(c.encode()) <= wire.MAX_CONFIG_BYTES
)
TOKEN = st.text(string.ascii_letters + string.digits + "_.+-", min_size=1, max_size=31)
UINTS = st.integers(0, wire.MAX_UINT)
GROUPS = st.builds(
    RolloutGroup,
    ref=st.builds(TaskRef, FAMILIES, CONFIGS, UINTS, UINTS),
    generator=st.builds(lambda a, b: f"{a} {b}", TOKEN, TOKEN),
    question=st.text(max_size=200),
    completions=st.lists(st.text(max_size=100), min_size=2, max_size=64).map(tuple),
    model=st.text(max_size=60),
    round=UINTS,
    created_ms=UINTS,
    answer=st.none() | st.text(max_size=100),
    # Any JSON object text, canonical or not.
    metadata=st.none() | JSON_OBJECTS.map(json.dumps),
)


@settings(max_examples=300, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
@given(group=GROUPS, data=st.data())
def test_valid_groups_round_trip(group: RolloutGroup, data: st.DataObject) -> None:
    encoded = encode(group)
    assert len(encoded) <= wire.MAX_MESSAGE_BYTES
    assert decode(encoded) == group
    assert encode(decode(encoded)) == encoded
    # Field order is fixed when encoding, free when decoding.
    message = group.to_wire()
    order = data.draw(st.permutations(list(message)))
    assert decode(pack({key: message[key] for key in order})) == group


# --- fuzzing ---------------------------------------------------------------------------

SEEDS = [p.with_suffix(".msgpack").read_bytes() for p in VALID + INVALID]
SMALL_MESSAGES = [
    load(p)[0]["message"] for p in VALID if p.with_suffix(".msgpack").stat().st_size < 8192
]
# MessagePack type bytes worth writing over others.
MARKERS = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, *range(0xC0, 0xE0), 0xE0, 0xFF]
BYTES = st.sampled_from(MARKERS) | st.integers(0, 255)


@settings(FUZZ, max_examples=3000)
@given(data=st.binary(max_size=512))
def test_fuzz_random_bytes(data: bytes) -> None:
    assert_decodes_safely(data)


@st.composite
def mutants(draw: st.DrawFn) -> bytes:
    """A vector after 1-4 edits: bit flip, byte overwrite, insert, delete, truncation,
    or splicing in the tail of another vector."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "splice"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[at] = draw(BYTES)
        elif op == "insert":
            data[at:at] = draw(st.lists(BYTES, min_size=1, max_size=8))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif op == "truncate":
            del data[at:]
        elif op == "splice":
            other = draw(st.sampled_from(SEEDS))
            data[at:] = other[draw(st.integers(0, len(other))) :]
    return bytes(data)


@settings(FUZZ, max_examples=3000)
@given(data=mutants())
def test_fuzz_mutated_vectors(data: bytes) -> None:
    assert_decodes_safely(data)


SPEC_KEYS = [*wire.FIELDS, *wire.TASK_FIELDS]
INTS = st.integers(-(2**63), 2**64 - 1) | st.sampled_from(
    [-1, 0, 1, 2, 64, 65, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]
)
LEAVES = (
    st.none()
    | st.booleans()
    | INTS
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["text", "image", "{}", "[]", '{"a":1}', "basic_arithmetic", "a b"])
    | st.binary(max_size=20)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12))
    | st.builds(msgpack.Timestamp, st.integers(0, 2**34 - 1), st.integers(0, 10**9 - 1))
)
KEYS = st.sampled_from([*SPEC_KEYS, "", 0, 1, -1, None]) | st.text(max_size=6)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=10,
)
SHALLOW = LEAVES | st.lists(LEAVES, max_size=4) | st.dictionaries(KEYS, LEAVES, max_size=4)
# Values at or just past the edge of some field's rules.
EDGES = st.sampled_from(
    [
        "",
        "a" * 129,
        "é" * 4097,
        "x" * (wire.MAX_QUESTION_BYTES + 1),
        '{"b":1,"a":2}',
        '{"a": 1}',
        '{"a":NaN}',
        "[1]",
        "a:b",
        "a/b",
        "a..b",
        "reasoning_gym 0.1.25",
        ["a"],
        ["a", "b"],
        ["a"] * 64,
        ["a"] * 65,
        ["a", None],
        ["a", b"b"],
        {"family": "f", "config": "{}", "seed": 0, "index": 0},
        wire.MAX_UINT,
        wire.MAX_UINT + 1,
        -1,
        True,
        0.0,
    ]
)


@settings(FUZZ, max_examples=1500)
@given(value=VALUES | st.dictionaries(KEYS, VALUES, max_size=8))
def test_fuzz_random_messagepack(value: Any) -> None:
    assert_decodes_safely(pack(value))


@st.composite
def spec_shaped(draw: st.DrawFn) -> dict[str, Any]:
    """A valid vector's message with 1-4 fields (top-level or task) set to random values,
    removed, or added."""
    message = json.loads(json.dumps(draw(st.sampled_from(SMALL_MESSAGES))))
    for _ in range(draw(st.integers(1, 4))):
        in_task = draw(st.booleans()) and isinstance(message.get("task"), dict)
        where = message["task"] if in_task else message
        key = draw(st.sampled_from([*(wire.TASK_FIELDS if in_task else wire.FIELDS), "extra"]))
        if draw(st.integers(0, 4)) == 0:
            where.pop(key, None)
        else:
            # A copy: the strategies hand out shared constants, and a later step may
            # mutate this value in place (as the task map): a constant that came to hold
            # itself made the fuzzer's own packing fail (recursion limit).
            where[key] = copy.deepcopy(draw(st.one_of(EDGES, EDGES, SHALLOW)))
    return message


@settings(FUZZ, max_examples=2500)
@given(message=spec_shaped())
def test_fuzz_spec_shaped_maps(message: dict[str, Any]) -> None:
    assert_decodes_safely(pack(message))


NESTS = [
    b"\x91",
    b"\x92\xc0",
    b"\x81\xa1a",
    b"\x81\xa8question",
    b"\xdc\x00\x01",
    b"\xde\x00\x01\x01",
]


@settings(FUZZ, max_examples=500)
@given(
    pieces=st.lists(st.sampled_from(NESTS), min_size=1, max_size=4),
    repeat=st.integers(1, 2000),
    leaf=st.sampled_from([b"\xc0", b"\x01", b"\xa1x", b"", b"\x90", b"\x80", b"\xd4\xff\x00"]),
    field=st.sampled_from([None, *wire.FIELDS]),
)
def test_fuzz_deep_nesting(
    pieces: list[bytes], repeat: int, leaf: bytes, field: str | None
) -> None:
    nested = b"".join(pieces) * repeat + leaf
    if field is not None:  # inside a real message, in place of one field
        message = SMALL_MESSAGES[0]
        nested = msgpack.Packer().pack_map_header(len(message)) + b"".join(
            pack(key) + (nested if key == field else pack(value)) for key, value in message.items()
        )
    assert_decodes_safely(nested)


# --- edges -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["a str", None, 42, 1.5, ["list"], {"version": 1}])
def test_decode_refuses_what_is_not_bytes(value: Any) -> None:
    got = decode(value)
    assert isinstance(got, Rejection)
    assert got.reason == wire.MALFORMED


def test_decode_takes_any_bytes_like() -> None:
    group = minimal_group()
    data = encode(group)
    assert decode(data) == group
    assert decode(bytearray(data)) == group
    assert decode(memoryview(data)) == group


def test_message_size_limit_is_inclusive() -> None:
    doc, data = load(VECTORS / "valid" / "size_limit.json")
    group = group_of(doc["message"])
    assert len(data) == wire.MAX_MESSAGE_BYTES
    assert isinstance(decode(data), RolloutGroup)

    longer = replace(group, completions=(*group.completions[:-1], group.completions[-1] + "!"))
    assert all(len(c.encode()) <= wire.MAX_COMPLETION_BYTES for c in longer.completions)
    assert len(pack(longer.to_wire())) == wire.MAX_MESSAGE_BYTES + 1
    with pytest.raises(EncodeError, match="oversize"):
        encode(longer)
    assert decode(pack(longer.to_wire())) == Rejection(wire.OVERSIZE)
    # The size is checked before parsing: padding past the limit is oversize, padding up
    # to it is trailing garbage.
    small = encode(minimal_group())
    pad = wire.MAX_MESSAGE_BYTES - len(small)
    assert decode(small + b"\xc0" * pad) == Rejection(wire.MALFORMED)
    assert decode(small + b"\xc0" * (pad + 1)) == Rejection(wire.OVERSIZE)


def pack_wide(value: Any) -> bytes:
    """Like pack, but every non-negative int as a uint64 (0xcf) whatever its size."""
    if isinstance(value, dict):
        head = msgpack.Packer().pack_map_header(len(value))
        return head + b"".join(pack(k) + pack_wide(v) for k, v in value.items())
    if type(value) is int and value >= 0:
        return b"\xcf" + struct.pack(">Q", value)
    return pack(value)


def test_decode_ignores_integer_width() -> None:
    group = minimal_group()
    wide = pack_wide(group.to_wire())
    assert len(wide) > len(encode(group))
    assert decode(wide) == group


@pytest.mark.parametrize(
    "data",
    [
        b"\x91" * wire.MAX_MESSAGE_BYTES,  # arrays nested 512 Ki deep
        b"\xdd\x00\x07\xff\xff" * (wire.MAX_MESSAGE_BYTES // 5),  # each claims 512 Ki items
        b"\x81\xa1a" * (wire.MAX_MESSAGE_BYTES // 3),  # maps nested 170 Ki deep
        b"\xdf\xff\xff\xff\xff" + b"\xa1a\x01" * 1000,  # a map claiming 2^32-1 entries
        b"\xdd\xff\xff\xff\xff" + b"\x01" * 1000,  # an array claiming 2^32-1 items
    ],
    ids=["nested-arrays", "nested-huge-arrays", "nested-maps", "map-2^32", "array-2^32"],
)
def test_hostile_structures_are_refused_quickly(data: bytes) -> None:
    start = time.perf_counter()
    got = decode(data)
    assert time.perf_counter() - start < 1.0
    assert got == Rejection(wire.MALFORMED)


def nested_in(field: str, depth: int, **changes: Any) -> bytes:
    """The minimal message (with ``changes``) whose ``field`` is arrays nested so that
    the whole message nests ``depth`` deep (its own map counting 1)."""
    message = {**minimal_group().to_wire(), **changes}
    inner = b"\x91" * (depth - 1) + b"\xc0"
    return msgpack.Packer().pack_map_header(len(message)) + b"".join(
        pack(key) + (inner if key == field else pack(value)) for key, value in message.items()
    )


@pytest.mark.parametrize("field", ["version", "task", "answer", "completions"])
def test_one_nesting_depth_bounds_every_message(field: str) -> None:
    deepest = wire.MAX_MSGPACK_DEPTH
    assert decode(nested_in(field, deepest)).reason != wire.MALFORMED  # the field checks'
    too_deep = decode(nested_in(field, deepest + 1))
    assert too_deep == Rejection(wire.MALFORMED) and str(deepest) in too_deep.detail
    # whatever the version: a node reads version and modality of any message
    assert decode(nested_in(field, deepest + 1, version=3)) == Rejection(wire.MALFORMED)


def test_the_spec_states_the_depth_and_the_generator_grammar() -> None:
    spec = " ".join((REPO / "protocol" / "SPEC.md").read_text(encoding="utf-8").split())
    assert f"nest at most **{wire.MAX_MSGPACK_DEPTH}** deep" in spec
    assert f"`generator` matches `{wire.GENERATOR_PATTERN.pattern}`" in spec


def test_a_version_2_message_nests_two_deep() -> None:
    raw = msgpack.unpackb(encode(minimal_group()), object_pairs_hook=wire._Map)
    assert wire._nesting(raw, 9) == 2


@pytest.mark.parametrize(
    "change",
    [
        {"completions": ("only one",)},
        {"question": "lone surrogate \ud800"},
        {"round": -1},
        {"round": 2**64},  # does not fit MessagePack at all
        {"created_ms": True},
        {"completions": ("text", b"bytes")},
        {"metadata": "[]"},
        {"ref": TaskRef("basic_arithmetic", '{"a": 1}', 0, 0)},
        {"version": 3},
    ],
    ids=lambda c: next(iter(c)),
)
def test_encode_refuses_what_a_receiver_would(change: dict[str, Any]) -> None:
    with pytest.raises(EncodeError):
        encode(replace(minimal_group(), **change))


def test_rejection_compares_by_reason_and_knows_what_is_ignored() -> None:
    assert Rejection(wire.BAD_VALUE, "one detail") == Rejection(wire.BAD_VALUE, "another")
    assert Rejection(wire.UNSUPPORTED_VERSION).ignored
    assert Rejection(wire.UNSUPPORTED_MODALITY).ignored
    assert not any(Rejection(r).ignored for r in REASONS - wire.IGNORED)


@pytest.mark.parametrize(
    ("swarm", "expected"),
    [
        ("demo", "sapo/demo/rollouts/v2"),
        ("a", "sapo/a/rollouts/v2"),
        ("0-swarm-9", "sapo/0-swarm-9/rollouts/v2"),
        ("x" * 63, f"sapo/{'x' * 63}/rollouts/v2"),
    ],
)
def test_topic(swarm: str, expected: str) -> None:
    assert topic(swarm) == expected


@pytest.mark.parametrize(
    "swarm", ["", "Demo", "-demo", "x" * 64, "a/b", "a b", "démo", "demo\n", "a_b", "a.b"]
)
def test_topic_refuses_bad_swarm_names(swarm: str) -> None:
    with pytest.raises(ValueError):
        topic(swarm)


@settings(max_examples=300, deadline=1000)
@given(text=st.text(max_size=40), limit=st.integers(0, 100))
def test_clip_utf8_never_splits_a_character(text: str, limit: int) -> None:
    clipped = clip_utf8(text, limit)
    assert text.startswith(clipped)
    assert len(clipped.encode()) <= limit
    if clipped != text:  # the longest prefix that fits
        assert len(text[: len(clipped) + 1].encode()) > limit


def test_finished_flags_travel_per_completion() -> None:
    group = replace(minimal_group(), unfinished=frozenset({1}))
    got = decode(encode(group))
    assert got == group and got.finished == (True, False)
    assert msgpack.unpackb(encode(group))["finished"] == [True, False]
    with pytest.raises(EncodeError, match="names no completion"):
        encode(replace(minimal_group(), unfinished=frozenset({2})))


def test_the_long_fuzz_script_runs(tmp_path: Path) -> None:
    """scripts/fuzz_wire.py (1,000,000 inputs in docs/fuzzing.md) still runs, briefly."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "scripts/fuzz_wire.py", "--inputs", "600", "--out", str(tmp_path)],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["inputs"] == 600 and report["failures"] == 0
    assert sum(report["intake"].values()) == 600
