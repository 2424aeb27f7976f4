"""Write the golden vectors of the wire format into protocol/vectors/ (deterministic).

Each vector is a pair: NAME.msgpack (the exact bytes) and NAME.json (what they are).
Valid vectors come from real ReasoningGym tasks regenerated from fixed references;
invalid ones are edits of them, one or more per rejection reason. Every vector is
checked against sapo_node.intake.wire before anything is written.

Usage: python scripts/make_vectors.py [--out DIR]   (default: protocol/vectors)
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgpack

from sapo_node.intake import wire
from sapo_node.intake.wire import Rejection, RolloutGroup
from sapo_node.tasks import TaskRef, canonical_json, generator_of, make_task

REPO = Path(__file__).resolve().parents[1]
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


def valid_vectors() -> list[Valid]:
    minimal = rg_group(
        "basic_arithmetic",
        ARITHMETIC,
        42,
        7,
        ["75 + -60 = 15.\n<answer>15</answer>", "<answer>135</answer>"],
        round_=0,
    )
    answers = [str(100 + (i * 37) % 11) for i in range(64)]
    many = rg_group(
        "base_conversion",
        {"min_base": 2, "max_base": 16, "min_value": 0, "max_value": 1000},
        7,
        0,
        [f"Attempt {i}: <answer>{a}</answer>" for i, a in enumerate(answers)],
        round_=12,
        unfinished=frozenset(range(4, 64, 5)),
        created_ms=CREATED_MS + 1,
    )
    unicode = rg_group(
        "propositional_logic",
        {},
        3,
        1,
        [
            "Réponse : <answer>(P ∧ Q)</answer> — c'est évident 🎉",
            "e\u0301 (combining accent) vs é; 答案是 <answer>¬P</answer> 🦜🇫🇷👩\u200d💻",
            "الجواب\t<answer>(Q ∨ ¬Q)</answer>\n𝔸 ∑ 𝟘 \U0010fffd",
        ],
        round_=5,
        created_ms=CREATED_MS + 2,
        model="modèle-测试/ünï-0.5B 🦙",
    )
    custom = RolloutGroup(
        ref=TaskRef.make("acme_tasks.puzzles:Sudoku4", {"blanks": 6, "size": 4}, 1234, 99),
        generator="acme_tasks 2.1.0",
        question="Fill the 4x4 grid so that every row, column and box holds 1-4:\n"
        "1 _ 3 _\n_ 4 _ 2\n2 _ 4 _\n_ 3 _ 1",
        answer="1234\n3412\n2143\n4321",
        metadata='{"difficulty": "easy", "givens": [[0, 0, 1], [0, 2, 3]], "note": null}',
        completions=(
            "<answer>1234\n3412\n2143\n4321</answer>",
            "<answer>1234\n3421\n2143\n4312</answer>",
            "I give up.",
        ),
        model=MODEL,
        round=77,
        created_ms=CREATED_MS + 3,
    )
    limits = RolloutGroup(
        ref=TaskRef(
            "p" * 60 + "." + "m" * 60 + ":" + "N" * 6,
            canonical_json({"pad": "x" * (wire.MAX_CONFIG_BYTES - len('{"pad":""}'))}),
            wire.MAX_UINT,
            wire.MAX_UINT,
        ),
        generator="g" * 31 + " 1." + "0" * 30,
        question="Q" * wire.MAX_QUESTION_BYTES,
        answer="ü" * (wire.MAX_ANSWER_BYTES // 2),
        metadata=deep_object(8, wire.MAX_METADATA_BYTES),
        completions=(
            "é" * (wire.MAX_COMPLETION_BYTES // 2),
            "🦜" * (wire.MAX_COMPLETION_BYTES // 4),
        ),
        model="org/" + "m" * (wire.MAX_MODEL_BYTES - 4),
        round=wire.MAX_UINT,
        created_ms=wire.MAX_UINT,
    )
    return [
        Valid("minimal", "A real basic_arithmetic task, 2 completions, no answer.", minimal),
        Valid(
            "completions_64",
            "The most completions a group may hold: 64; every fifth one was cut at the "
            "author's limit (finished false).",
            many,
        ),
        Valid(
            "unicode",
            "Non-BMP emoji, a ZWJ sequence, a flag, combining and precomposed accents, CJK, "
            "Arabic, a tab and newlines in completions; a non-ASCII model name.",
            unicode,
        ),
        Valid(
            "custom_family",
            "A custom family (package.module:Name) with its own generator, an answer, and "
            "metadata that is JSON object text (not necessarily canonical).",
            custom,
        ),
        Valid(
            "field_limits",
            "Every text field at its byte limit (in 2- and 4-byte characters where possible), "
            "metadata nested exactly 8 deep, seed, index, round and created all 2^63-1.",
            limits,
        ),
        Valid(
            "size_limit",
            "Exactly MAX_MESSAGE_BYTES (524288) bytes: 63 completions of "
            "MAX_COMPLETION_BYTES and a last one that fills the message.",
            size_limit_group(0),
        ),
    ]


def deep_object(depth: int, size: int) -> str:
    """JSON object text nested ``depth`` deep, padded to exactly ``size`` bytes."""
    shell = '{"a":' * (depth - 1) + '{"pad":""' + "}" * depth
    pad = "x" * (size - len(shell))
    return '{"a":' * (depth - 1) + '{"pad":"' + pad + '"' + "}" * depth


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


def invalid_vectors(minimal: RolloutGroup) -> list[Invalid]:
    base = minimal.to_wire()
    good = wire.encode(minimal)
    pairs = list(base.items())
    task_pairs = list(base["task"].items())

    def replaced(key: str, value: Any) -> bytes:
        return pack_pairs([(k, value if k == key else v) for k, v in pairs])

    def replaced_task(key: str, value: Any) -> bytes:
        task = pack_pairs([(k, value if k == key else v) for k, v in task_pairs])
        return replaced("task", Raw(task))

    def raw_str(data: bytes) -> Raw:
        """A MessagePack str holding ``data`` as they are (not necessarily UTF-8)."""
        return Raw(b"\xd9" + bytes([len(data)]) + data)

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
            data=replaced("task", Raw(b"\x81\xa1a" * 2000 + b"\xc0")),
            note="task = {'a': {'a': ... 2000 levels ... nil}}: deeper than any decoder "
            "stack should go",
        ),
        Invalid(
            "malformed_nested_depth_9",
            "The minimal message with answer replaced by arrays nested 8 deep: the message "
            f"nests 9 deep, one more than MAX_MSGPACK_DEPTH ({wire.MAX_MSGPACK_DEPTH}).",
            wire.MALFORMED,
            data=replaced("answer", Raw(b"\x91" * 8 + b"\xc0")),
            note="answer = [[[[[[[[nil]]]]]]]]: refused before any field is read",
        ),
        Invalid(
            "wrong_type_answer_nested_depth_8",
            "The minimal message with answer replaced by arrays nested 7 deep: the message "
            "nests 8 deep, within MAX_MSGPACK_DEPTH, so the field checks refuse it.",
            wire.WRONG_TYPE,
            data=replaced("answer", Raw(b"\x91" * 7 + b"\xc0")),
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
            data=replaced("question", raw_str(b"What is 2 \xff 2?")),
            note="question str contains byte 0xff",
        ),
        Invalid(
            "bad_utf8_surrogate",
            "A completion holds a UTF-16 surrogate encoded as 3 bytes (CESU-8 style).",
            wire.BAD_UTF8,
            data=replaced("completions", Raw(b"\x92" + msgpack.packb("ok") + b"\xa3\xed\xa0\x80")),
            note="completions[1] is the bytes ed a0 80 (U+D800), which UTF-8 forbids",
        ),
        Invalid(
            "bad_utf8_overlong",
            "The model name holds an overlong encoding of '/'.",
            wire.BAD_UTF8,
            data=replaced("model", raw_str(b"Qwen\xc0\xafQwen")),
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
            data=replaced("task", Raw(pack_pairs([*task_pairs, ("seed", 43)]))),
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
            data=replaced_task("seed", True),
            note="task.seed is c3 (true): a bool is not an int",
        ),
        Invalid(
            "wrong_type_float_round",
            "round is the float 3.0.",
            wire.WRONG_TYPE,
            data=replaced("round", 3.0),
            note="round is cb 4008000000000000 (float64 3.0)",
        ),
        Invalid(
            "wrong_type_bin_question",
            "question is a bin, not a str.",
            wire.WRONG_TYPE,
            data=replaced("question", minimal.question.encode()),
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
        # --- too_long -------------------------------------------------------------------
        Invalid(
            "too_long_config",
            "task.config is canonical JSON of 3010 bytes (> 2048).",
            wire.TOO_LONG,
            message=edit(base, "task.config", canonical_json({"pad": "x" * 3000})),
        ),
        Invalid(
            "too_long_question",
            "question of 16385 bytes.",
            wire.TOO_LONG,
            message=edit(base, "question", "Q" * (wire.MAX_QUESTION_BYTES + 1)),
        ),
        Invalid(
            "too_long_completion",
            "A completion of 8193 bytes (4096 two-byte characters and one more byte).",
            wire.TOO_LONG,
            message=edit(base, "completions", ["ok", "é" * 4096 + "!"]),
        ),
        Invalid(
            "too_long_family",
            "task.family of 129 bytes.",
            wire.TOO_LONG,
            message=edit(base, "task.family", "f" * (wire.MAX_FAMILY_BYTES + 1)),
        ),
        Invalid(
            "too_long_answer",
            "answer of 4097 bytes.",
            wire.TOO_LONG,
            message=edit(base, "answer", "1" * (wire.MAX_ANSWER_BYTES + 1)),
        ),
        Invalid(
            "too_long_metadata",
            "metadata of 16385 bytes.",
            wire.TOO_LONG,
            message=edit(base, "metadata", deep_object(1, wire.MAX_METADATA_BYTES + 1)),
        ),
        Invalid(
            "too_long_generator",
            "generator of 65 bytes.",
            wire.TOO_LONG,
            message=edit(base, "generator", "g" * 32 + " " + "1" * 32),
        ),
        Invalid(
            "too_long_model",
            "model of 257 bytes.",
            wire.TOO_LONG,
            message=edit(base, "model", "m" * (wire.MAX_MODEL_BYTES + 1)),
        ),
        # --- bad_count ------------------------------------------------------------------
        Invalid(
            "bad_count_0",
            "No completions.",
            wire.BAD_COUNT,
            message=edit(base, "completions", []),
        ),
        Invalid(
            "bad_count_1",
            "One completion (GRPO needs at least 2).",
            wire.BAD_COUNT,
            message=edit(base, "completions", ["<answer>15</answer>"]),
        ),
        Invalid(
            "bad_count_65",
            "65 completions (at most 64).",
            wire.BAD_COUNT,
            message=edit(base, "completions", [f"<answer>{i}</answer>" for i in range(65)]),
        ),
        Invalid(
            "bad_count_finished_3",
            "Three finished flags for two completions.",
            wire.BAD_COUNT,
            message=edit(base, "finished", [True, True, False]),
        ),
        # --- bad_value ------------------------------------------------------------------
        Invalid(
            "bad_value_config_not_canonical",
            "task.config is the right JSON object, but with spaces and unsorted keys.",
            wire.BAD_VALUE,
            message=edit(base, "task.config", json.dumps(dict(reversed(ARITHMETIC.items())))),
        ),
        Invalid(
            "bad_value_config_not_json",
            "task.config is not JSON.",
            wire.BAD_VALUE,
            message=edit(base, "task.config", "min_terms=2"),
        ),
        Invalid(
            "bad_value_config_array",
            "task.config is a JSON array, not an object.",
            wire.BAD_VALUE,
            message=edit(base, "task.config", "[2,4]"),
        ),
        Invalid(
            "bad_value_config_nan",
            "task.config holds NaN, which JSON does not have.",
            wire.BAD_VALUE,
            message=edit(base, "task.config", '{"min_terms":NaN}'),
        ),
        Invalid(
            "bad_value_seed_negative",
            "task.seed is -1.",
            wire.BAD_VALUE,
            message=edit(base, "task.seed", -1),
        ),
        Invalid(
            "bad_value_seed_2_63",
            "task.seed is 2^63, one more than the largest allowed (uint64 on the wire).",
            wire.BAD_VALUE,
            message=edit(base, "task.seed", 2**63),
        ),
        Invalid(
            "bad_value_index_negative",
            "task.index is -1.",
            wire.BAD_VALUE,
            message=edit(base, "task.index", -1),
        ),
        Invalid(
            "bad_value_round_2_64_minus_1",
            "round is 2^64-1.",
            wire.BAD_VALUE,
            message=edit(base, "round", 2**64 - 1),
        ),
        Invalid(
            "bad_value_created_negative",
            "created is -1.",
            wire.BAD_VALUE,
            message=edit(base, "created", -1),
        ),
        Invalid(
            "bad_value_family_slash",
            "task.family holds a slash.",
            wire.BAD_VALUE,
            message=edit(base, "task.family", "reasoning_gym/basic_arithmetic"),
        ),
        Invalid(
            "bad_value_family_empty",
            "task.family is empty.",
            wire.BAD_VALUE,
            message=edit(base, "task.family", ""),
        ),
        Invalid(
            "bad_value_generator_no_version",
            "generator is a name without a version.",
            wire.BAD_VALUE,
            message=edit(base, "generator", "reasoning_gym"),
        ),
        Invalid(
            "bad_value_metadata_array",
            "metadata is a JSON array, not an object.",
            wire.BAD_VALUE,
            message=edit(base, "metadata", "[1,2,3]"),
        ),
        Invalid(
            "bad_value_metadata_not_json",
            "metadata is not JSON.",
            wire.BAD_VALUE,
            message=edit(base, "metadata", "{'single': 'quotes'}"),
        ),
        Invalid(
            "bad_value_metadata_depth_9",
            "metadata is a JSON object nested 9 deep (at most 8).",
            wire.BAD_VALUE,
            message=edit(base, "metadata", deep_object(9, 200)),
        ),
        Invalid(
            "bad_value_metadata_depth_600",
            "metadata is a JSON object nested 600 deep: refused as bad_value, "
            "like any depth over 8, not as a decoder failure.",
            wire.BAD_VALUE,
            message=edit(base, "metadata", deep_object(600, 4000)),
        ),
    ]


def check(valid: list[Valid], invalid: list[Invalid]) -> None:
    """Every vector must decode as it says, or nothing is written."""
    names = [v.name for v in valid] + [v.name for v in invalid]
    assert len(names) == len(set(names)), "vector names repeat"
    for v in valid:
        data = wire.encode(v.group)
        assert wire.decode(data) == v.group, v.name
    for v in invalid:
        got = wire.decode(v.to_bytes())
        assert isinstance(got, Rejection), f"{v.name}: decoded"
        assert got.reason == v.reason, f"{v.name}: {got.reason} ({got.detail}), not {v.reason}"


def write(out: Path, valid: list[Valid], invalid: list[Invalid]) -> None:
    for sub in ("valid", "invalid"):
        (out / sub).mkdir(parents=True, exist_ok=True)
        for old in [*(out / sub).glob("*.msgpack"), *(out / sub).glob("*.json")]:
            old.unlink()
    for v in valid:
        doc = {"description": v.description, "message": v.group.to_wire()}
        _write_pair(out / "valid" / v.name, wire.encode(v.group), doc)
    for v in invalid:
        doc: dict[str, Any] = {"description": v.description, "expect": {"reason": v.reason}}
        if v.data is None:
            doc["message"] = v.message
        else:
            doc["hex"] = v.data.hex()
            doc["note"] = v.note
        _write_pair(out / "invalid" / v.name, v.to_bytes(), doc)


def _write_pair(stem: Path, data: bytes, doc: dict[str, Any]) -> None:
    stem.with_suffix(".msgpack").write_bytes(data)
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    stem.with_suffix(".json").write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "protocol" / "vectors")
    args = parser.parse_args()
    valid = valid_vectors()
    invalid = invalid_vectors(valid[0].group)
    check(valid, invalid)
    write(args.out, valid, invalid)
    print(f"{len(valid)} valid and {len(invalid)} invalid vectors in {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
