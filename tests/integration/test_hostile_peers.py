"""The hostile-peer table: every bad message is refused or limited with a counted reason,
and the node trains on as before.

Each case comes from its own author, so the per-author counts show exactly one reason.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from sapo_node.build import build_node
from sapo_node.config import load_config
from sapo_node.intake import wire
from sapo_node.tasks import TaskRef, generator_of, make_task
from tests.support.nodes import sevens_overrides

SEVENS = "tests.support.families:Sevens"
ARITHMETIC = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
MATRIX = {"min_n": 2, "max_n": 2}


def group(family: str = SEVENS, config: dict | None = None, index: int = 0, **fields):
    ref = TaskRef.make(family, config or {}, 5, index)
    base = wire.RolloutGroup(
        ref=ref,
        generator=generator_of(family),
        question=make_task(ref).question,
        completions=("777", "x7", "abc", "7"),
        model="tiny",
        round=3,
        created_ms=int(time.time() * 1000),
    )
    return dataclasses.replace(base, **fields)


def packed(**changes) -> bytes:
    """A message with raw changes to its map, bypassing the encoder's own checks."""
    return msgpack.packb({**group().to_wire(), **changes}, use_bin_type=True)


def arithmetic(answer_text: str, claimed: str | None) -> bytes:
    g = group("basic_arithmetic", ARITHMETIC)
    return wire.encode(
        dataclasses.replace(g, answer=claimed, completions=(f"<answer>{answer_text}</answer>",) * 4)
    )


# (case, bytes, outcome, reason)
TABLE: list[tuple[str, Callable[[], bytes], str, str]] = [
    ("oversized message", lambda: b"\x00" * (wire.MAX_MESSAGE_BYTES + 1), "rejected", "oversize"),
    ("malformed MessagePack", lambda: b"\xc1\x93\x01", "rejected", "malformed"),
    ("truncated message", lambda: wire.encode(group())[:-3], "rejected", "malformed"),
    ("not a map", lambda: msgpack.packb([1, 2, 3]), "rejected", "not_a_map"),
    ("wrong version", lambda: packed(version=3), "ignored", "unsupported_version"),
    ("unknown modality", lambda: packed(modality="image"), "ignored", "unsupported_modality"),
    ("unknown field", lambda: packed(reward=[1.0, 1.0]), "rejected", "unknown_field"),
    ("wrong type", lambda: packed(round="3"), "rejected", "wrong_type"),
    ("bad UTF-8", lambda: packed(model="x").replace(b"\xa1x", b"\xa1\xff"), "rejected", "bad_utf8"),
    ("too many completions", lambda: packed(completions=["7"] * 65), "rejected", "bad_count"),
    (
        "huge config in the task",
        lambda: packed(
            task={**group().to_wire()["task"], "config": "{" + '"a":1,' * 1000 + '"b":1}'}
        ),
        "rejected",
        "too_long",
    ),
    (
        "unknown family",
        lambda: wire.encode(
            group("basic_arithmetic", ARITHMETIC, ref=TaskRef.make("no_such_family", {}, 1, 0))
        ),
        "ignored",
        "unknown_family",
    ),
    (
        "a module of the peer's choosing",
        lambda: wire.encode(group(ref=TaskRef.make("os:system", {}, 1, 0))),
        "ignored",
        "unknown_family",
    ),
    (
        "a config this node does not set",
        lambda: wire.encode(group("basic_arithmetic", {**ARITHMETIC, "max_terms": 3})),
        "ignored",
        "unknown_config",
    ),
    (
        "code smuggled in a config",
        lambda: wire.encode(
            group(
                ref=TaskRef.make(
                    "basic_arithmetic",
                    {**ARITHMETIC, "operators": ["+__import__('os').system('true')+"]},
                    1,
                    0,
                )
            )
        ),
        "ignored",
        "unknown_config",
    ),
    (
        "another ReasoningGym version",
        lambda: wire.encode(group("basic_arithmetic", ARITHMETIC, generator="reasoning_gym 9.9")),
        "ignored",
        "generator_mismatch",
    ),
    (
        "question that does not match its reference",
        lambda: wire.encode(group(question="Write eights (0).")),
        "rejected",
        "question_mismatch",
    ),
    (
        "an answer claimed correct that is wrong",
        lambda: arithmetic("999", claimed="999"),
        "rejected",
        "answer_mismatch",
    ),
    (
        "from the future",
        lambda: wire.encode(group(created_ms=int((time.time() + 86400) * 1000))),
        "ignored",  # this node's own clock may be the one behind
        "from_the_future",
    ),
    (
        "too old",
        lambda: wire.encode(group(created_ms=int((time.time() - 86400) * 1000))),
        "ignored",  # late delivery is not the author's fault
        "too_old",  # on arrival (a pooled group that ages out unused is "expired")
    ),
]


@pytest.fixture(scope="module")
def node(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    overrides = sevens_overrides(
        tiny_model_dir,
        tmp_path_factory.mktemp("hostile"),
        generation={"max_new_tokens": 6, "completions_per_task": 4},
        train={"lr": 1e-3, "local_groups": 1, "external_groups": 2},
    )
    # Peers' tasks are taken only in the families and configs this node sets itself.
    overrides["tasks"]["families"] += [
        {"name": "basic_arithmetic", "weight": 1e-9, "levels": [ARITHMETIC]},
        {"name": "binary_matrix", "weight": 1e-9, "levels": [MATRIX]},
    ]
    n = build_node(load_config(overrides=overrides, environ={}))
    yield n
    n.close()


@pytest.mark.parametrize(("case", "make", "outcome", "reason"), TABLE, ids=[t[0] for t in TABLE])
def test_each_hostile_message_is_refused_with_a_counted_reason(node, case, make, outcome, reason):
    author = f"peer-{case}"
    verdict = node.receive(make(), author)
    assert (verdict.outcome, verdict.reason) == (outcome, reason), verdict.detail
    assert node.pool.counts()[author] == {reason: 1}


def test_a_wrong_answer_claimed_in_completions_earns_nothing(node) -> None:
    """Without an attached answer the claim is just text that our own verifier scores
    (this node gives partial credit, so a wrong number earns a third, never a 1)."""
    verdict = node.receive(arithmetic("999", claimed=None), "peer-claims")
    assert verdict.outcome == "accepted" and max(verdict.item.rewards) < 1.0
    assert not verdict.item.has_signal  # so the paper's sampling never trains on it


def test_an_eval_payload_in_a_completion_runs_nothing(node, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    ref = TaskRef.make("binary_matrix", MATRIX, 1, 0)
    payload = f"<answer>__import__('os').system('touch {marker}')</answer>"
    g = dataclasses.replace(
        group(),
        ref=ref,
        generator=generator_of("binary_matrix"),
        question=make_task(ref).question,
        completions=(payload, f"<answer>[open('{marker}', 'w')]</answer>"),
    )
    verdict = node.receive(wire.encode(g), "peer-eval")
    assert verdict.outcome == "accepted" and verdict.item.rewards == (0.0, 0.0)
    assert not marker.exists()


def test_the_same_message_replayed_is_a_duplicate(node) -> None:
    data = wire.encode(group(index=7))
    assert node.receive(data, "peer-replay").outcome == "accepted"
    for _ in range(3):
        verdict = node.receive(data, "peer-replay")
        # ignored, not blamed: a node resumed from its checkpoint sends its last rounds
        # again, and was banned by every peer for it (docs/soak.md)
        assert (verdict.outcome, verdict.reason) == ("ignored", "duplicate")
    # the same group from another author is that author's own (dedup is per author)
    assert node.receive(data, "peer-replay-2").outcome == "accepted"
    assert node.pool.counts()["peer-replay"] == {"accepted": 1, "duplicate": 3}


def test_a_burst_of_ten_thousand_messages_from_one_author_is_rate_limited(node) -> None:
    messages = [wire.encode(group(index=1000 + i)) for i in range(10_000)]
    start = time.monotonic()
    verdicts = [node.receive(m, "peer-flood") for m in messages]
    elapsed = time.monotonic() - start
    accepted = sum(v.outcome == "accepted" for v in verdicts)
    pool = node.config.pool
    assert (
        pool.burst_per_author
        <= accepted
        <= pool.burst_per_author + pool.rate_per_author * elapsed + 1
    )
    counts = node.pool.counts()["peer-flood"]
    assert counts == {"accepted": accepted, "rate_limited": 10_000 - accepted}
    # a bound on this node's work, not blame: the network process drops such messages
    # without blame too
    assert {v.outcome for v in verdicts if v.reason == "rate_limited"} == {"ignored"}
    # another peer is not held back by the flood
    assert node.receive(wire.encode(group(index=99)), "peer-quiet").outcome == "accepted"


def test_an_author_at_its_full_rate_is_taken_in_whole_by_a_node_with_slow_rounds(node) -> None:
    """A node takes in what came during a round once the round ends: an author that sent
    at its full rate through a round longer than its burst lasts is within the rate when
    measured at arrival, as the network process measured it, and is taken in whole."""
    pool = node.config.pool
    n = 3 * pool.burst_per_author
    now = time.time()
    arrived = [now - (n - i) / pool.rate_per_author for i in range(n)]  # the last one now
    messages = [wire.encode(group(index=20_000 + i)) for i in range(n)]
    verdicts = [node.receive(m, "peer-steady", at) for m, at in zip(messages, arrived, strict=True)]
    assert [v.outcome for v in verdicts] == ["accepted"] * n
    # the same round measured at the time it was taken in: only the burst would fit
    late = [node.receive(wire.encode(group(index=30_000 + i)), "peer-late") for i in range(n)]
    assert sum(v.outcome == "accepted" for v in late) <= pool.burst_per_author + 1


def test_the_node_keeps_training_after_the_table(node) -> None:
    for _, make, _, _ in TABLE:
        node.receive(make(), "peer-again")
    # Two good groups from two peers (one peer may fill only part of J), so that the test
    # does not depend on which tests ran before it on this worker (the node is the module's).
    for index, author in ((500, "peer-good-1"), (501, "peer-good-2")):
        assert node.receive(wire.encode(group(index=index)), author).outcome == "accepted"
    record = node.run_round(0)
    assert record["groups/external"] == 2 and record["train/sequences"] > 0
