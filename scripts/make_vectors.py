"""Write the golden vectors of the wire format into protocol/vectors/ (deterministic).

Each vector is a pair: NAME.msgpack (the exact bytes) and NAME.json (what they are).
Valid vectors come from real ReasoningGym tasks regenerated from fixed references;
invalid ones are edits of them, one or more per rejection reason. Every vector is
checked against sapo_node.intake.wire before anything is written.

Usage: python scripts/make_vectors.py [--out DIR]   (default: protocol/vectors)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sapo_node.intake import wire  # noqa: E402
from sapo_node.intake.wire import Rejection, RolloutGroup  # noqa: E402
from sapo_node.tasks import TaskRef, canonical_json  # noqa: E402
from scripts.support.vectors import (  # noqa: E402
    ARITHMETIC,
    CREATED_MS,
    MODEL,
    Invalid,
    Valid,
    bytes_and_schema_vectors,
    edit,
    rg_group,
    size_limit_group,
)


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


def invalid_vectors(minimal: RolloutGroup) -> list[Invalid]:
    """Every invalid vector: those of the bytes and the schema, then of the values."""
    base = minimal.to_wire()
    return bytes_and_schema_vectors(minimal) + [
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
