"""What a peer's bytes go through before this node may train on them.

In order, cheapest first, each step refusing with a counted reason (protocol/SPEC.md,
"What a receiver checks"):

1. the author (the signer the transport vouches for) is a sane string;
1b. the author is not distrusted by the poisoning defences (defence.py);
2. strict decoding of the message (wire.py): form, types, sizes, version, modality;
3. its time: not older than the pool keeps groups, not from the future;
4. the pool's admission: not a duplicate, within the author's rate limit;
5. a family and a config this node's own curriculum sets (any level), made by the same
   generator (ReasoningGym version). Task generators run on their config, and some of
   them ``eval`` expressions built from it: a peer's config must never reach them, so
   only configs this node would use itself are regenerated;
6. the task regenerated from its reference by this node, and its question compared with
   the text that came; an attached answer must be the task's own answer;
7. every completion scored by this node's own verifier, in the sandbox worker, as this
   node will train it: ``prepare`` re-tokenises it with this node's tokenizer and cuts it
   to this node's completion limit first, so a reward is never earned by text beyond
   the tokens that are trained. A node that would draw none of it now (J at 0) pools it
   unscored, and scores it only before a round that may draw it (``score_pooled``):
   scoring is the costly step, and every check that can refuse a group comes before it.

A sender's answer, reward or advantage is never trusted. Custom-family tasks this node
cannot regenerate are ignored unless ``pool.accept_unregenerable`` is set, in which case
they are scored against the answer they carry.

Outcomes: ``accepted`` (pooled), ``rejected`` (the sender broke a rule: the transport
may penalise it) or ``ignored`` (dropped without blame: a newer or differently set-up
peer, or a problem on this side). The last :data:`RECENT_REFUSALS` refusals are kept, with
their details, for the status page (``recent_refusals``); details hold peers' text, which
whoever shows them must escape.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Literal

import structlog

from sapo_node.intake import wire
from sapo_node.intake.pool import MAX_AUTHOR_CHARS, OTHERS, Pool, PooledGroup, group_digest
from sapo_node.tasks import Scorer, Task, generator_of, make_task

log = structlog.get_logger(__name__)

# Reasons found by the receiver, besides wire.decode's and the pool's admission
# ("duplicate", "rate_limited").
BAD_AUTHOR = "bad_author"
TOO_OLD = "too_old"  # on arrival; a pooled group that ages out unused is "expired"
FROM_THE_FUTURE = "from_the_future"
UNKNOWN_FAMILY = "unknown_family"
GENERATOR_MISMATCH = "generator_mismatch"
UNKNOWN_CONFIG = "unknown_config"
CANNOT_REGENERATE = "cannot_regenerate"
QUESTION_MISMATCH = "question_mismatch"
ANSWER_MISMATCH = "answer_mismatch"
POOL_UNAVAILABLE = "pool_unavailable"
UNSCORABLE = "unscorable"  # pooled unscored, then no longer a task this node makes
RECENT_REFUSALS = 50
MAX_DETAIL_CHARS = 300
DISTRUSTED = "distrusted"  # the poisoning defences ignore this peer for now (defence.py)
# Groups from this many peers dated beyond the skew allowed ahead, within CLOCK_WINDOW_S,
# say that this node's own clock is behind: it warns (at most once a window).
CLOCK_BEHIND_PEERS = 2
CLOCK_WINDOW_S = 600.0

# Dropped without blame. A duplicate or a too old group has honest causes: a node that
# resumes from its checkpoint redoes its last rounds and publishes the same groups again,
# a relay or this node's own inbox (drained once a round) delivers late; both are found
# by cheap checks before any regeneration or scoring, and the rate limit bounds them.
# Blaming them got resumed nodes banned by every peer (docs/soak.md). A group from the
# future says that one of two clocks is wrong, and the receiver cannot tell whose: when
# its own is behind, every honest peer's groups look ahead, and blaming them got the
# skewed node to ban every honest peer it met (docs/soak.md, beyond the tolerance). An
# author over its rate is a bound on this node's work, not a fault: the network process
# already drops such messages without blame (net/pubsub.py), and blaming the rest got an
# honest author at its full rate banned by a node whose rounds are slow (docs/soak.md).
IGNORED = wire.IGNORED | {
    "duplicate",
    "rate_limited",
    TOO_OLD,
    FROM_THE_FUTURE,
    UNKNOWN_FAMILY,
    UNKNOWN_CONFIG,
    GENERATOR_MISMATCH,
    CANNOT_REGENERATE,
    POOL_UNAVAILABLE,
    DISTRUSTED,
}

Outcome = Literal["accepted", "rejected", "ignored"]


@dataclass(frozen=True)
class Verdict:
    """What became of one message."""

    outcome: Outcome
    reason: str = "accepted"
    detail: str = ""
    item: PooledGroup | None = None


class _Refused(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason, self.detail = reason, detail


class Intake:
    """Checks peers' messages and pools the ones that pass."""

    def __init__(
        self,
        pool: Pool,
        scorer: Scorer,
        *,
        known_configs: Mapping[str, Collection[str]],
        accept_unregenerable: bool = False,
        max_clock_skew_s: float = 300.0,
        prepare: Callable[[str, bool], str] | None = None,
        distrusted: Callable[[str], bool] | None = None,
    ) -> None:
        """``prepare(text, finished)`` gives the text of a completion as this node would
        train it (None: as it came, for a node that trains nothing). ``distrusted(author)``:
        whether the poisoning defences ignore that peer for now (defence.py)."""
        self.pool = pool
        self.distrusted = distrusted
        self.prepare = prepare
        self.scorer = scorer
        self.known_configs = {family: frozenset(c) for family, c in known_configs.items()}
        self.accept_unregenerable = accept_unregenerable
        self.max_clock_skew_s = max_clock_skew_s
        # (time, author, outcome, reason, detail) of the last refusals, newest last. The
        # round thread appends while the status thread reads: a deque iterated during an
        # append raises, so both hold the lock.
        self.recent: deque[tuple[float, str, str, str, str]] = deque(maxlen=RECENT_REFUSALS)
        self._recent_lock = threading.Lock()
        self._ahead: dict[str, float] = {}  # author -> when its last group came from the future
        self._clock_warned = -math.inf

    def receive(
        self, data: bytes, author: str, arrived: float | None = None, *, score: bool = True
    ) -> Verdict:
        """Check one message from ``author``, which reached this node at ``arrived``
        (the pool's clock; now if not given), and pool it if it passes: scored, or with
        ``score`` False unscored, for ``score_pooled`` to score if it may be drawn."""
        if not isinstance(author, str) or not 0 < len(author) <= MAX_AUTHOR_CHARS:
            return self._refuse(OTHERS, BAD_AUTHOR, f"author {str(author)[:40]!r}")
        if self.distrusted is not None and self.distrusted(author):
            return self._refuse(author, DISTRUSTED)
        msg = wire.decode(data)
        if isinstance(msg, wire.Rejection):
            return self._refuse(author, msg.reason, msg.detail)
        now = self.pool.clock()  # one clock for ages here and in the pool
        created = msg.created_ms / 1000.0
        if created > now + self.max_clock_skew_s:
            self._check_own_clock(author, now, created - now)
            return self._refuse(author, FROM_THE_FUTURE, f"created {created - now:.0f} s ahead")
        if created < now - self.pool.max_age_s:
            return self._refuse(author, TOO_OLD, f"created {now - created:.0f} s ago")
        digest = group_digest(author, msg)
        admission = self.pool.check(author, digest, arrived)
        if admission is not None:
            return self._refuse(author, admission)
        try:
            task = self._task(msg)
        except _Refused as exc:
            return self._refuse(author, exc.reason, exc.detail)
        rewards = self._rewards(task, msg) if score else None
        item = PooledGroup(msg, author, rewards, now)
        try:
            self.pool.add(item, data, digest)
        except sqlite3.Error as exc:  # a full disk, a broken file: not the peer's doing
            log.error("cannot store a pooled group", error=str(exc))
            return Verdict("ignored", POOL_UNAVAILABLE, str(exc))
        return Verdict("accepted", item=item)

    def score_pooled(
        self, exclude: Collection[str] = (), should_stop: Callable[[], bool] = lambda: False
    ) -> int:
        """Score the pooled groups that wait for it (none of the authors in ``exclude``,
        whose groups no draw takes); returns how many were scored. A group whose task
        this node can no longer make (its config changed across a restart) leaves the
        pool, counted as ``unscorable``."""
        done = 0
        for key, item in self.pool.unscored(exclude):
            if should_stop():
                break
            try:
                task = self._task(item.group)
            except _Refused:
                self.pool.drop(key, UNSCORABLE)
                continue
            self.pool.set_rewards(key, self._rewards(task, item.group))
            done += 1
        return done

    def _rewards(self, task: Task, msg: wire.RolloutGroup) -> tuple[float, ...]:
        """This node's rewards for a message's completions, each as this node trains it."""
        texts = msg.completions
        if self.prepare is not None:
            texts = tuple(
                self.prepare(c, f) for c, f in zip(msg.completions, msg.finished, strict=True)
            )
        return tuple(r.reward for r in self.scorer.score(task, texts))

    def _check_own_clock(self, author: str, now: float, ahead_s: float) -> None:
        """Warn when groups from several peers come from the future: one peer ahead is that
        peer's clock, several are more likely this node's own, which then takes none of
        their groups until it is set right."""
        self._ahead = {a: t for a, t in self._ahead.items() if t > now - CLOCK_WINDOW_S}
        if len(self._ahead) < CLOCK_BEHIND_PEERS:  # enough to decide: many identities add nothing
            self._ahead[author] = now
        if len(self._ahead) >= CLOCK_BEHIND_PEERS and now - self._clock_warned >= CLOCK_WINDOW_S:
            self._clock_warned = now
            log.warning(
                "this node's clock looks behind: groups from several peers are dated ahead "
                "of it beyond the tolerance, and none of them is taken; set the clock "
                "(NTP: timedatectl set-ntp true)",
                peers=len(self._ahead),
                ahead_s=round(ahead_s),
                tolerance_s=self.max_clock_skew_s,
            )

    def _task(self, msg: wire.RolloutGroup) -> Task:
        """The task of a message, made by this node; _Refused if it is not one we can trust."""
        ref = msg.ref
        configs = self.known_configs.get(ref.family)
        if configs is None:
            # Also what keeps a peer from making this node import a module of its choosing.
            raise _Refused(UNKNOWN_FAMILY, ref.family)
        if ref.config_json not in configs:
            raise _Refused(UNKNOWN_CONFIG, ref.config_json[:200])
        ours = generator_of(ref.family)
        if msg.generator != ours:
            raise _Refused(GENERATOR_MISMATCH, f"{msg.generator!r}, ours {ours!r}")
        try:
            task = make_task(ref)
        except Exception as exc:  # a custom family's data may be missing on this node
            if self.accept_unregenerable and msg.answer is not None:
                metadata = json.loads(msg.metadata) if msg.metadata else {}
                return Task(ref, msg.question, msg.answer, metadata)
            raise _Refused(CANNOT_REGENERATE, f"{type(exc).__name__}: {exc}"[:200]) from None
        if task.question != msg.question:
            raise _Refused(QUESTION_MISMATCH, "the regenerated question differs")
        if msg.answer is not None and msg.answer != task.answer:
            raise _Refused(ANSWER_MISMATCH, "the attached answer is not the task's")
        return task

    def recent_refusals(self) -> list[tuple[float, str, str, str, str]]:
        """A copy of the last refusals, newest last; safe from any thread."""
        with self._recent_lock:
            return list(self.recent)

    def _refuse(self, author: str, reason: str, detail: str = "") -> Verdict:
        outcome: Outcome = "ignored" if reason in IGNORED else "rejected"
        self.pool.record(author, reason)
        refusal = (time.time(), author, outcome, reason, detail[:MAX_DETAIL_CHARS])
        with self._recent_lock:
            self.recent.append(refusal)
        log.debug("group refused", author=author, reason=reason, detail=detail, outcome=outcome)
        return Verdict(outcome, reason, detail)
