"""The pieces of scripts/make_vectors.py's golden vectors: what a vector is, groups of
real ReasoningGym tasks, the edits an invalid vector is made with, and the invalid
vectors that break the message's bytes or its schema (the others, of its values, are in
the script)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from sapo_node.intake import wire
from sapo_node.intake.wire import RolloutGroup
from sapo_node.tasks import TaskRef, generator_of, make_task

CREATED_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
ARITHMETIC = {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 2}


@dataclass(frozen=True)
class Valid:
    name: str
    description: str
    group: RolloutGroup


@dataclass(frozen=True)
class Invalid:
    """A refused message: ``message`` (packed in key order) or, if JSON cannot say it,
    raw ``data`` and a ``note`` on what is wrong with it."""

    name: str
    description: str
    reason: str
    message: Any = None
    data: bytes | None = None
    note: str = ""

    def to_bytes(self) -> bytes:
        if self.data is not None:
            return self.data
        return msgpack.packb(self.message, use_bin_type=True)


@dataclass(frozen=True)
class Raw:
    """Bytes written as they are in place of a key or value (see pack_pairs)."""

    data: bytes


DELETE = object()


def rg_group(
    family: str,
    config: dict[str, Any],
    seed: int,
    index: int,
    completions: list[str],
    *,
    round_: int,
    unfinished: frozenset[int] = frozenset(),
    created_ms: int = CREATED_MS,
    model: str = MODEL,
) -> RolloutGroup:
    """A group of a real ReasoningGym task, its question regenerated here."""
    ref = TaskRef.make(family, config, seed, index)
    return RolloutGroup(
        ref=ref,
        generator=generator_of(family),
        question=make_task(ref).question,
        completions=tuple(completions),
        unfinished=unfinished,
        model=model,
        round=round_,
        created_ms=created_ms,
    )


def filler(label: str, size: int) -> str:
    """Plain ASCII text of exactly ``size`` bytes, starting with ``label``."""
    line = "The sum of the first terms is checked again, step by step. "
    text = label + line * (size // len(line) + 1)
    return text[:size]


def size_limit_group(extra: int) -> RolloutGroup:
    """64 completions, the first 63 of MAX_COMPLETION_BYTES; the message is exactly
    MAX_MESSAGE_BYTES + ``extra`` bytes."""
    base = rg_group("basic_arithmetic", ARITHMETIC, 9, 3, ["", ""], round_=40)
    full = [filler(f"Completion {i}. ", wire.MAX_COMPLETION_BYTES) for i in range(63)]
    last = 1000  # any length from 256 on keeps the str16 header, so sizes add up
    probe = replace(base, completions=(*full, filler("Last. ", last)))
    size = len(msgpack.packb(probe.to_wire(), use_bin_type=True))
    last += wire.MAX_MESSAGE_BYTES + extra - size
    assert 256 <= last <= wire.MAX_COMPLETION_BYTES
    return replace(base, completions=(*full, filler("Last. ", last)))


def edit(message: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``message`` with ``path`` ("task.seed") set to ``value`` (DELETE removes
    it); keys keep their order, a new key goes last."""
    out = copy.deepcopy(message)
    *parents, key = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return out


def pack_pairs(pairs: list[tuple[Any, Any]]) -> bytes:
    """A MessagePack map of ``pairs`` as given: keys may repeat, a Raw key or value is
    copied as it is."""
    packer = msgpack.Packer(use_bin_type=True)
    out = bytearray(packer.pack_map_header(len(pairs)))
    for item in (x for pair in pairs for x in pair):
        out += item.data if isinstance(item, Raw) else packer.pack(item)
    return bytes(out)


def replaced(message: dict[str, Any], key: str, value: Any) -> bytes:
    """``message`` packed with ``key``'s value replaced (a Raw one copied as it is)."""
    return pack_pairs([(k, value if k == key else v) for k, v in message.items()])


def replaced_task(message: dict[str, Any], key: str, value: Any) -> bytes:
    """``message`` packed with its task's ``key`` replaced."""
    task = pack_pairs([(k, value if k == key else v) for k, v in message["task"].items()])
    return replaced(message, "task", Raw(task))


def raw_str(data: bytes) -> Raw:
    """A MessagePack str holding ``data`` as they are (not necessarily UTF-8)."""
    return Raw(b"\xd9" + bytes([len(data)]) + data)


def bytes_and_schema_vectors(minimal: RolloutGroup) -> list[Invalid]:
    """The invalid vectors of malformed bytes, size, UTF-8, shape, and of the schema:
    duplicate, unknown, missing fields, versions and types."""
    base = minimal.to_wire()
    good = wire.encode(minimal)
    pairs = list(base.items())
    task_pairs = list(base["task"].items())
    big = size_limit_group(1).to_wire()
    return [
        # --- malformed: not one well-formed MessagePack value -----------------------
        Invalid(
            "malformed_trailing_bytes",
            "The minimal vector followed by one extra byte (nil).",
            wire.MALFORMED,
            data=good + b"\xc0",
            note="one complete message, then 0xc0: a message is exactly one value",
        ),
        Invalid(
            "malformed_truncated",
            "The minimal vector without its last 3 bytes.",
            wire.MALFORMED,
            data=good[:-3],
            note="the input ends inside the last value",
        ),
        Invalid(
            "malformed_empty",
            "No bytes at all.",
            wire.MALFORMED,
            data=b"",
            note="empty input",
        ),
        Invalid(
            "malformed_reserved_byte",
            "0xc1, the one byte MessagePack never uses.",
            wire.MALFORMED,
            data=b"\xc1",
            note="0xc1 is reserved ('never used') in MessagePack",
        ),
        Invalid(
            "malformed_map_claims_2_32_entries",
            "A map32 header claiming 2^32-1 entries, followed by one entry.",
            wire.MALFORMED,
            data=b"\xdf\xff\xff\xff\xff" + msgpack.packb("version") + msgpack.packb(1),
            note="map32 of 4294967295 entries in a few bytes: refused before allocating",
        ),
        Invalid(
            "malformed_array_claims_2_32_items",
            "An array32 header claiming 2^32-1 items and nothing after it.",
            wire.MALFORMED,
            data=b"\xdd\xff\xff\xff\xff",
            note="array32 of 4294967295 items in 5 bytes",
        ),
        Invalid(
            "malformed_str_claims_4_gib",
            "A str32 header claiming 2^32-1 bytes, followed by 3.",
            wire.MALFORMED,
            data=b"\xdb\xff\xff\xff\xff" + b"abc",
            note="str32 of length 4294967295 with 3 bytes of content",
        ),
        Invalid(
            "malformed_nested_depth",
            "The minimal message with task replaced by maps nested 2000 deep.",
            wire.MALFORMED,
            data=replaced(base, "task", Raw(b"\x81\xa1a" * 2000 + b"\xc0")),
            note="task = {'a': {'a': ... 2000 levels ... nil}}: deeper than any decoder "
            "stack should go",
        ),
        Invalid(
            "malformed_nested_depth_9",
            "The minimal message with answer replaced by arrays nested 8 deep: the message "
            f"nests 9 deep, one more than MAX_MSGPACK_DEPTH ({wire.MAX_MSGPACK_DEPTH}).",
            wire.MALFORMED,
            data=replaced(base, "answer", Raw(b"\x91" * 8 + b"\xc0")),
            note="answer = [[[[[[[[nil]]]]]]]]: refused before any field is read",
        ),
        Invalid(
            "wrong_type_answer_nested_depth_8",
            "The minimal message with answer replaced by arrays nested 7 deep: the message "
            "nests 8 deep, within MAX_MSGPACK_DEPTH, so the field checks refuse it.",
            wire.WRONG_TYPE,
            data=replaced(base, "answer", Raw(b"\x91" * 7 + b"\xc0")),
            note="answer = [[[[[[[nil]]]]]]]: as deep as a message may nest",
        ),
        # --- oversize ---------------------------------------------------------------
        Invalid(
            "oversize_by_one",
            "The size_limit vector with its last completion one byte longer: "
            "MAX_MESSAGE_BYTES + 1 bytes, every field within its own limit.",
            wire.OVERSIZE,
            message=big,
        ),
        # --- bad_utf8 ---------------------------------------------------------------
        Invalid(
            "bad_utf8_question",
            "The question is a str whose bytes are not UTF-8.",
            wire.BAD_UTF8,
            data=replaced(base, "question", raw_str(b"What is 2 \xff 2?")),
            note="question str contains byte 0xff",
        ),
        Invalid(
            "bad_utf8_surrogate",
            "A completion holds a UTF-16 surrogate encoded as 3 bytes (CESU-8 style).",
            wire.BAD_UTF8,
            data=replaced(
                base, "completions", Raw(b"\x92" + msgpack.packb("ok") + b"\xa3\xed\xa0\x80")
            ),
            note="completions[1] is the bytes ed a0 80 (U+D800), which UTF-8 forbids",
        ),
        Invalid(
            "bad_utf8_overlong",
            "The model name holds an overlong encoding of '/'.",
            wire.BAD_UTF8,
            data=replaced(base, "model", raw_str(b"Qwen\xc0\xafQwen")),
            note="model str contains c0 af, an overlong '/'",
        ),
        Invalid(
            "bad_utf8_key",
            "A top-level key is not UTF-8.",
            wire.BAD_UTF8,
            data=pack_pairs([*pairs[:-1], (Raw(b"\xa7cr\xe9ated"), base["created"])]),
            note="the key of 'created' is spelled with a Latin-1 e-acute (byte e9)",
        ),
        # --- not_a_map ----------------------------------------------------------------
        Invalid(
            "not_a_map_array",
            "The message is an array of key and value, not a map.",
            wire.NOT_A_MAP,
            message=["version", 1, "modality", "text"],
        ),
        Invalid("not_a_map_nil", "The message is nil.", wire.NOT_A_MAP, message=None),
        Invalid("not_a_map_str", "The message is a str.", wire.NOT_A_MAP, message="hello"),
        # --- duplicate_field ----------------------------------------------------------
        Invalid(
            "duplicate_field_question",
            "The message holds 'question' twice.",
            wire.DUPLICATE_FIELD,
            data=pack_pairs([*pairs, ("question", "Calculate 1 + 1.")]),
            note="12 pairs: the 11 fields of the minimal vector, then 'question' again",
        ),
        Invalid(
            "duplicate_field_task_seed",
            "The task holds 'seed' twice, with different values.",
            wire.DUPLICATE_FIELD,
            data=replaced(base, "task", Raw(pack_pairs([*task_pairs, ("seed", 43)]))),
            note="task map of 5 pairs: family, config, seed, index, then seed = 43",
        ),
        # --- unsupported_version ----------------------------------------------------
        Invalid(
            "unsupported_version_3",
            "Version 3, otherwise the minimal vector.",
            wire.UNSUPPORTED_VERSION,
            message=edit(base, "version", 3),
        ),
        Invalid(
            "unsupported_version_1",
            "A version-1 message (sapo-node 0.1: no finished flags), otherwise the minimal vector.",
            wire.UNSUPPORTED_VERSION,
            message=edit(edit(base, "finished", DELETE), "version", 1),
        ),
        Invalid(
            "unsupported_version_3_new_shape",
            "Version 3 with fields this version does not know and without most of its own: "
            "refused for its version, before any other check.",
            wire.UNSUPPORTED_VERSION,
            message={"version": 3, "modality": "text", "payload": {"groups": []}},
        ),
        Invalid(
            "unsupported_version_0",
            "Version 0.",
            wire.UNSUPPORTED_VERSION,
            message=edit(base, "version", 0),
        ),
        # --- unsupported_modality ---------------------------------------------------
        Invalid(
            "unsupported_modality_image",
            "Modality 'image', otherwise the minimal vector.",
            wire.UNSUPPORTED_MODALITY,
            message=edit(base, "modality", "image"),
        ),
        Invalid(
            "unsupported_modality_with_its_fields",
            "Modality 'audio' with a field of its own: refused for its modality first.",
            wire.UNSUPPORTED_MODALITY,
            message=edit(edit(base, "modality", "audio"), "sample_rate", 16000),
        ),
        # --- unknown_field ------------------------------------------------------------
        Invalid(
            "unknown_field_top",
            "An extra top-level field 'signature'.",
            wire.UNKNOWN_FIELD,
            message=edit(base, "signature", "00ff"),
        ),
        Invalid(
            "unknown_field_task",
            "An extra field 'difficulty' inside task.",
            wire.UNKNOWN_FIELD,
            message=edit(base, "task.difficulty", 3),
        ),
        # --- missing_field ------------------------------------------------------------
        Invalid(
            "missing_field_task_index",
            "task without 'index'.",
            wire.MISSING_FIELD,
            message=edit(base, "task.index", DELETE),
        ),
        Invalid(
            "missing_field_completions",
            "No 'completions'.",
            wire.MISSING_FIELD,
            message=edit(base, "completions", DELETE),
        ),
        Invalid(
            "missing_field_finished",
            "No 'finished' (a version-1 message on a version-2 topic would look so).",
            wire.MISSING_FIELD,
            message=edit(base, "finished", DELETE),
        ),
        Invalid(
            "missing_field_version",
            "No 'version'.",
            wire.MISSING_FIELD,
            message=edit(base, "version", DELETE),
        ),
        Invalid(
            "missing_field_answer",
            "No 'answer': an absent answer is nil, never a missing key.",
            wire.MISSING_FIELD,
            message=edit(base, "answer", DELETE),
        ),
        # --- wrong_type ---------------------------------------------------------------
        Invalid(
            "wrong_type_bool_seed",
            "task.seed is the bool true.",
            wire.WRONG_TYPE,
            data=replaced_task(base, "seed", True),
            note="task.seed is c3 (true): a bool is not an int",
        ),
        Invalid(
            "wrong_type_float_round",
            "round is the float 3.0.",
            wire.WRONG_TYPE,
            data=replaced(base, "round", 3.0),
            note="round is cb 4008000000000000 (float64 3.0)",
        ),
        Invalid(
            "wrong_type_bin_question",
            "question is a bin, not a str.",
            wire.WRONG_TYPE,
            data=replaced(base, "question", minimal.question.encode()),
            note="question is bin 8 (c4) holding UTF-8 text",
        ),
        Invalid(
            "wrong_type_int_key",
            "A top-level key is an int.",
            wire.WRONG_TYPE,
            data=pack_pairs([*pairs, (1, "one")]),
            note="12 pairs: the minimal vector's 11, then key 1 (an int) with value 'one'",
        ),
        Invalid(
            "wrong_type_version_nil",
            "version is present but nil.",
            wire.WRONG_TYPE,
            message=edit(base, "version", None),
        ),
        Invalid(
            "wrong_type_created_str",
            "created is a str of digits.",
            wire.WRONG_TYPE,
            message=edit(base, "created", str(CREATED_MS)),
        ),
        Invalid(
            "wrong_type_task_array",
            "task is an array of its values.",
            wire.WRONG_TYPE,
            message=edit(base, "task", list(base["task"].values())),
        ),
        Invalid(
            "wrong_type_completion_nil",
            "A completion is nil.",
            wire.WRONG_TYPE,
            message=edit(base, "completions", ["<answer>15</answer>", None]),
        ),
        Invalid(
            "wrong_type_finished_int",
            "A finished flag is the integer 1, not a boolean.",
            wire.WRONG_TYPE,
            message=edit(base, "finished", [True, 1]),
        ),
        Invalid(
            "wrong_type_finished_map",
            "finished is a map instead of an array.",
            wire.WRONG_TYPE,
            message=edit(base, "finished", {"0": True}),
        ),
        Invalid(
            "wrong_type_metadata_map",
            "metadata is a map instead of JSON text.",
            wire.WRONG_TYPE,
            message=edit(base, "metadata", {"difficulty": "easy"}),
        ),
        Invalid(
            "wrong_type_answer_int",
            "answer is the int 15 instead of text.",
            wire.WRONG_TYPE,
            message=edit(base, "answer", 15),
        ),
    ]
