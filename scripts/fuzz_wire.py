#!/usr/bin/env python3
"""Fuzz what a peer's bytes go through: ``wire.decode``, then the receiver's intake.

    python scripts/fuzz_wire.py --inputs 1000000 --out /tmp/fuzz

Inputs, in equal shares, from a seeded generator (the tests' hypothesis fuzzers do the
same kinds, 10,500 inputs, inside ``make test``):

- mutated vectors: a golden vector (protocol/vectors) after 1-4 edits (bit flip, byte
  overwrite with a MessagePack type byte or any byte, insert, delete, truncate, splice);
- random MessagePack: nested maps, lists, strings, integers at their edges, floats,
  binary, ext types, with spec keys among random ones;
- spec-shaped maps: a valid vector's message with 1-4 fields replaced by edge values
  or random ones, removed, or added.

Every input must decode to a group that encodes back to itself, or to a rejection with
one of wire.py's reasons; every input is then given to a real ``Intake`` (its own pool,
the sandboxed scorer, this node's default curriculum), which must answer with a verdict
and a known reason. Anything else (an exception, an unknown reason, a group that does
not round-trip) is a failure: the input is written to OUT/failures/ and counted. Prints
inputs/s for decoding and for the intake, outcomes by reason, and failures; exits 1 if
any. Results: docs/fuzzing.md.
"""

from __future__ import annotations

import argparse
import collections
import copy
import hashlib
import json
import logging
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import msgpack

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sapo_node.config import load_config  # noqa: E402
from sapo_node.curriculum import Curriculum  # noqa: E402
from sapo_node.intake import checks as intake_module  # noqa: E402
from sapo_node.intake import wire  # noqa: E402
from sapo_node.intake.checks import Intake  # noqa: E402
from sapo_node.intake.pool import Pool  # noqa: E402
from sapo_node.logs import configure_logging  # noqa: E402
from sapo_node.tasks import Scorer, generator_of, make_task  # noqa: E402
from scripts.support.report import write_json  # noqa: E402

VECTORS = Path(__file__).resolve().parents[1] / "protocol" / "vectors"
MARKERS = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, *range(0xC0, 0xE0), 0xE0, 0xFF]
REASONS = (
    {v for k, v in vars(wire).items() if k.isupper() and isinstance(v, str) and v == k.lower()}
    | {
        v
        for k, v in vars(intake_module).items()
        if k.isupper() and isinstance(v, str) and v == k.lower()
    }
    | {"accepted", "duplicate", "rate_limited"}
)
INTS = [-1, 0, 1, 2, 64, 65, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]
EDGES: list[Any] = [
    "",
    "a" * 129,
    "é" * 4097,
    "x" * (wire.MAX_QUESTION_BYTES + 1),
    '{"b":1,"a":2}',
    '{"a":NaN}',
    "a:b",
    "reasoning_gym 0.1.25",
    ["a"],
    ["a"] * 64,
    ["a"] * 65,
    ["a", None],
    [True, False],
    [1, 0],
    {"family": "f", "config": "{}", "seed": 0, "index": 0},
    wire.MAX_UINT,
    wire.MAX_UINT + 1,
    -1,
    True,
    0.0,
    None,
]


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def accepted_message(index: int) -> dict[str, Any]:
    """A message a default node accepts (a task of its curriculum, fresh): mutants of it
    reach the intake's later steps (regeneration, comparison, scoring)."""
    cfg = load_config(environ={})
    ref = Curriculum(cfg.tasks.families, cfg.curriculum).sample(7, index, 1)[0]
    task = make_task(ref)
    group = wire.RolloutGroup(
        ref=ref,
        generator=generator_of(ref.family),
        question=task.question,
        completions=(f"<answer>{task.answer}</answer>", "<answer>no</answer>", "x", "7"),
        model="fuzz",
        round=index,
        created_ms=int(time.time() * 1000),
    )
    return group.to_wire()


class Inputs:
    """The three kinds of input, from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        paths = sorted(VECTORS.glob("*/*.msgpack"))
        self.seeds = [p.read_bytes() for p in paths]
        self.messages = [
            json.loads(p.with_suffix(".json").read_text(encoding="utf-8"))["message"]
            for p in sorted((VECTORS / "valid").glob("*.msgpack"))
            if p.stat().st_size < 8192
        ]
        self.keys = [*wire.FIELDS, *wire.TASK_FIELDS, "", 0, None, "extra"]
        self.messages += [accepted_message(i) for i in range(len(self.messages))]

    def __call__(self, i: int) -> tuple[str, bytes]:
        kind = ("mutant", "messagepack", "spec_shaped")[i % 3]
        if kind == "mutant":
            return kind, self.mutant()
        if kind == "messagepack":
            return kind, pack(self.value(3))
        return kind, pack(self.spec_shaped())

    def byte(self) -> int:
        return self.rng.choice(MARKERS) if self.rng.random() < 0.5 else self.rng.randrange(256)

    def mutant(self) -> bytes:
        r = self.rng
        data = bytearray(r.choice(self.seeds))
        for _ in range(r.randint(1, 4)):
            op = r.choice(("flip", "set", "insert", "delete", "truncate", "splice"))
            at = r.randrange(max(len(data), 1))
            if op == "flip" and data:
                data[at] ^= 1 << r.randrange(8)
            elif op == "set" and data:
                data[at] = self.byte()
            elif op == "insert":
                data[at:at] = bytes(self.byte() for _ in range(r.randint(1, 8)))
            elif op == "delete":
                del data[at : at + r.randint(1, 8)]
            elif op == "truncate":
                del data[at:]
            elif op == "splice":
                other = r.choice(self.seeds)
                data[at:] = other[r.randrange(len(other) + 1) :]
        return bytes(data)

    def leaf(self) -> Any:
        r = self.rng
        choice = r.randrange(9)
        if choice == 0:
            return None
        if choice == 1:
            return r.random() < 0.5
        if choice == 2:
            return r.choice(INTS) if r.random() < 0.5 else r.randint(-(2**63), 2**64 - 1)
        if choice == 3:
            return r.choice([0.5, -0.0, float("inf"), float("nan"), 1e308])
        if choice == 4:
            return "".join(chr(r.randrange(0x20, 0x3000)) for _ in range(r.randrange(20)))
        if choice == 5:
            return r.choice(["text", "image", "{}", "[]", '{"a":1}', "basic_arithmetic", "a b"])
        if choice == 6:
            return r.randbytes(r.randrange(20))
        if choice == 7:
            return msgpack.ExtType(r.randrange(128), r.randbytes(r.randrange(12)))
        return copy.deepcopy(r.choice(EDGES))

    def value(self, depth: int) -> Any:
        r = self.rng
        if depth == 0 or r.random() < 0.4:
            return self.leaf()
        if r.random() < 0.5:
            return [self.value(depth - 1) for _ in range(r.randrange(5))]
        out: dict[Any, Any] = {}
        for _ in range(r.randrange(9)):
            key = r.choice(self.keys) if r.random() < 0.7 else self.leaf()
            if isinstance(key, (dict, list)):
                continue
            out[key] = self.value(depth - 1)
        return out

    def spec_shaped(self) -> dict[str, Any]:
        r = self.rng
        message = json.loads(json.dumps(r.choice(self.messages)))
        if r.random() < 0.5:  # fresh, so that the intake's later steps see it too
            message["created"] = int(time.time() * 1000)
        for _ in range(r.randint(1, 4)):
            in_task = r.random() < 0.5 and isinstance(message.get("task"), dict)
            where = message["task"] if in_task else message
            key = r.choice([*(wire.TASK_FIELDS if in_task else wire.FIELDS), "extra"])
            if r.random() < 0.2:
                where.pop(key, None)
            else:
                where[key] = copy.deepcopy(r.choice(EDGES)) if r.random() < 0.6 else self.value(1)
        return message


class Fuzz:
    """One run's counts: each input decoded (and encoded again, if it decodes), then taken
    in by the intake unless ``intake`` is off; a crash or an unknown reason is a failure,
    its input and why kept in ``failures_dir``."""

    def __init__(self, failures_dir: Path, receiver: Intake, intake: bool) -> None:
        self.failures_dir, self.receiver, self.intake = failures_dir, receiver, intake
        self.decoded: collections.Counter[str] = collections.Counter()
        self.verdicts: collections.Counter[str] = collections.Counter()
        self.kinds: collections.Counter[str] = collections.Counter()
        self.failures = 0
        self.t_decode = self.t_intake = 0.0

    def fail(self, kind: str, data: bytes, why: str) -> None:
        self.failures += 1
        name = hashlib.sha256(data).hexdigest()[:16]
        (self.failures_dir / f"{kind}-{name}.msgpack").write_bytes(data)
        (self.failures_dir / f"{kind}-{name}.txt").write_text(why, encoding="utf-8")

    def feed(self, i: int, kind: str, data: bytes) -> None:
        self.kinds[kind] += 1
        t0 = time.perf_counter()
        try:
            got = wire.decode(data)
            if isinstance(got, wire.Rejection):
                ok = got.reason in REASONS
                self.decoded[got.reason] += 1
            else:
                ok = wire.decode(wire.encode(got)) == got
                self.decoded["decoded"] += 1
        except Exception:
            self.fail(kind, data, traceback.format_exc())
            return
        self.t_decode += time.perf_counter() - t0
        if not ok:
            self.fail(kind, data, f"decode gave {got!r}")
            return
        if not self.intake:
            return
        t0 = time.perf_counter()
        try:
            verdict = self.receiver.receive(data, f"fuzz-{i % 97}")
        except Exception:
            self.fail(kind, data, traceback.format_exc())
            return
        self.t_intake += time.perf_counter() - t0
        self.verdicts[f"{verdict.outcome}:{verdict.reason}"] += 1
        if verdict.reason not in REASONS:
            self.fail(kind, data, f"intake gave {verdict!r}")
        if (i + 1) % 100_000 == 0:
            print(f"{i + 1:,} inputs, {self.failures} failures", file=sys.stderr, flush=True)

    def report(self, seed: int, wall: float) -> dict[str, Any]:
        n = sum(self.kinds.values())
        return {
            "inputs": n,
            "seed": seed,
            "kinds": dict(self.kinds),
            "failures": self.failures,
            "wall_s": round(wall, 1),
            "decode_inputs_per_s": round(n / self.t_decode) if self.t_decode else None,
            "intake_inputs_per_s": round(n / self.t_intake) if self.t_intake else None,
            "decode": dict(self.decoded.most_common()),
            "intake": dict(self.verdicts.most_common()),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"))
    parser.add_argument("--no-intake", action="store_true", help="decode only")
    args = parser.parse_args(argv)
    configure_logging(level=logging.WARNING)  # a refusal a line would be a million lines
    failures_dir = args.out / "failures"
    failures_dir.mkdir(parents=True, exist_ok=True)

    cfg = load_config(environ={})
    scorer = Scorer(max_completion_chars=cfg.scoring.max_completion_chars)
    pool = Pool(None, rate_per_author=1e9, burst_per_author=10**9)
    receiver = Intake(
        pool, scorer, known_configs=Curriculum(cfg.tasks.families, cfg.curriculum).known_configs()
    )
    make = Inputs(args.seed)
    fuzz = Fuzz(failures_dir, receiver, intake=not args.no_intake)
    start = time.perf_counter()
    try:
        for i in range(args.inputs):
            fuzz.feed(i, *make(i))
    finally:
        scorer.close()
        pool.close()
    report = fuzz.report(args.seed, time.perf_counter() - start)
    write_json(args.out / "report.json", report)
    print(json.dumps(report, indent=1))
    return 1 if fuzz.failures else 0


if __name__ == "__main__":
    sys.exit(main())
