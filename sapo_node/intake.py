"""What a peer's bytes go through before this node may train on them.

In order, cheapest first, each step refusing with a counted reason (protocol/SPEC.md,
"What a receiver checks"):

1. the author (the signer the transport vouches for) is a sane string;
2. strict decoding of the message (wire.py): form, types, sizes, version, modality;
3. its time: not older than the pool keeps groups, not from the future;
4. the pool's admission: not a duplicate, within the author's rate limit;
5. a family this node knows, made by the same generator (ReasoningGym version);
6. the task regenerated from its reference by this node, in the sandbox worker, and
   its question compared with the text that came; an attached answer must match too;
7. every completion scored by this node's own verifier, in the sandbox worker.

A sender's answer, reward or advantage is never trusted. Custom-family tasks this node
cannot regenerate are ignored unless ``pool.accept_unregenerable`` is set, in which case
they are scored against the answer they carry.

Outcomes: ``accepted`` (pooled), ``rejected`` (the sender broke a rule: the transport
may penalise it) or ``ignored`` (dropped without blame: a newer or differently equipped
peer, or a problem on this side).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

import structlog

from sapo_node import wire
from sapo_node.pool import MAX_AUTHOR_CHARS, OTHERS, Pool, PooledGroup, group_digest
from sapo_node.tasks import (
    RegenerateError,
    Scorer,
    Task,
    generator_of,
)

log = structlog.get_logger(__name__)

# Reasons found by the receiver, after wire.decode's own.
BAD_AUTHOR = "bad_author"
EXPIRED = "expired"
FROM_THE_FUTURE = "from_the_future"
DUPLICATE = "duplicate"
RATE_LIMITED = "rate_limited"
UNKNOWN_FAMILY = "unknown_family"
GENERATOR_MISMATCH = "generator_mismatch"
CANNOT_REGENERATE = "cannot_regenerate"
BAD_TASK = "bad_task"
QUESTION_MISMATCH = "question_mismatch"
ANSWER_MISMATCH = "answer_mismatch"
POOL_UNAVAILABLE = "pool_unavailable"

IGNORED = wire.IGNORED | {UNKNOWN_FAMILY, GENERATOR_MISMATCH, CANNOT_REGENERATE, POOL_UNAVAILABLE}

Outcome = Literal["accepted", "rejected", "ignored"]


@dataclass(frozen=True)
class Verdict:
    """What became of one message."""

    outcome: Outcome
    reason: str = "accepted"
    detail: str = ""
    item: PooledGroup | None = None


class Intake:
    """Checks peers' messages and pools the ones that pass."""

    def __init__(
        self,
        pool: Pool,
        scorer: Scorer,
        *,
        custom_families: Collection[str] = (),
        accept_unregenerable: bool = False,
        max_clock_skew_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self.scorer = scorer
        self.custom_families = frozenset(custom_families)
        self.accept_unregenerable = accept_unregenerable
        self.max_clock_skew_s = max_clock_skew_s
        self.clock = clock

    def receive(self, data: bytes, author: str) -> Verdict:
        """Check one message from ``author`` and pool it if it passes."""
        if not isinstance(author, str) or not 0 < len(author) <= MAX_AUTHOR_CHARS:
            return self._refuse(OTHERS, BAD_AUTHOR, f"author {str(author)[:40]!r}")
        msg = wire.decode(data)
        if isinstance(msg, wire.Rejection):
            return self._refuse(author, msg.reason, msg.detail)
        now = self.clock()
        created = msg.created_ms / 1000.0
        if created > now + self.max_clock_skew_s:
            return self._refuse(author, FROM_THE_FUTURE, f"created {created - now:.0f} s ahead")
        if created < now - self.pool.max_age_s:
            return self._refuse(author, EXPIRED, f"created {now - created:.0f} s ago")
        digest = group_digest(author, msg)
        admission = self.pool.check(author, digest)
        if admission is not None:
            return self._refuse(author, admission)
        checked = self._regenerate(msg)
        if isinstance(checked, Verdict):
            return self._refuse(author, checked.reason, checked.detail)
        if checked is None:
            results = self.scorer.score_ref(msg.ref, msg.completions)
        else:
            results = self.scorer.score(checked, msg.completions)
        item = PooledGroup(msg, author, tuple(r.reward for r in results), now)
        try:
            self.pool.add(item, data, digest)
        except sqlite3.Error as exc:  # a full disk, a broken file: not the peer's doing
            log.error("cannot store a pooled group", error=str(exc))
            return Verdict("ignored", POOL_UNAVAILABLE, str(exc))
        return Verdict("accepted", item=item)

    def _regenerate(self, msg: wire.RolloutGroup) -> Task | Verdict | None:
        """None when the worker regenerated the task and it matches; a Task built from the
        message for trusted unregenerable custom tasks; else the Verdict refusing it."""
        family = msg.ref.family
        custom = ":" in family
        if custom and family not in self.custom_families:
            # A peer must never make this node import a module of its choosing.
            return Verdict("ignored", UNKNOWN_FAMILY, family)
        if not custom and not _is_reasoning_gym(family):
            return Verdict("ignored", UNKNOWN_FAMILY, family)
        ours = generator_of(family)
        if msg.generator != ours:
            return Verdict("ignored", GENERATOR_MISMATCH, f"{msg.generator!r}, ours {ours!r}")
        try:
            question, answer = self.scorer.regenerate(msg.ref)
        except RegenerateError as exc:
            if custom and self.accept_unregenerable and msg.answer is not None:
                metadata = json.loads(msg.metadata) if msg.metadata else {}
                return Task(msg.ref, msg.question, msg.answer, metadata)
            # A ReasoningGym reference that does not build is the sender's fault; a
            # custom family's dataset may simply be missing here.
            reason = CANNOT_REGENERATE if custom else BAD_TASK
            return Verdict("ignored" if custom else "rejected", reason, str(exc)[:200])
        if question != msg.question:
            return Verdict("rejected", QUESTION_MISMATCH, "the regenerated question differs")
        if msg.answer is not None and answer is not None and msg.answer != str(answer):
            return Verdict("rejected", ANSWER_MISMATCH, "the attached answer is not the task's")
        return None

    def _refuse(self, author: str, reason: str, detail: str = "") -> Verdict:
        outcome: Outcome = "ignored" if reason in IGNORED else "rejected"
        self.pool.record(author, reason)
        log.debug("group refused", author=author, reason=reason, detail=detail, outcome=outcome)
        return Verdict(outcome, reason, detail)


def _is_reasoning_gym(family: str) -> bool:
    from reasoning_gym.factory import DATASETS

    return family in DATASETS
