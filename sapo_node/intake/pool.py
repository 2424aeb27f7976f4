"""The rollout pool: peers' groups that passed every check, bounded, persisted, sampled.

A group reaches the pool only after the receiver has decoded it strictly, regenerated its
task, compared the question and scored every completion with its own verifier
(intake/checks.py); the pool keeps those rewards, never a sender's. It is

- bounded in groups and in bytes: past either bound the oldest group of the author
  holding the most goes first, so many peers share the room;
- fair: each author holds at most ``max_per_author`` groups (its oldest makes way) and
  passes a token bucket (``rate_per_author`` groups/s, bursts of ``burst_per_author``)
  before any costly check runs;
- free of duplicates: the digest of (author, task, completions) is remembered for
  ``max_age_s`` after the group was seen, even once the group was used or evicted;
- fresh: groups older than ``max_age_s`` (300 s by default) are refused and expire. A
  group's age counts from its creation (the author's ``created``, which the intake took
  within the clock skew it allows), or from its arrival if that is earlier: a group that
  arrives 299 s old leaves 1 s later, and one dated ahead of this node's clock ages from
  its arrival, never longer than ``max_age_s`` in the pool. The
  paper trains each round on the rollouts peers made in the current rounds; a pool that
  draws uniformly over an hour of arrivals trains on groups tens of rounds old (a
  simulation with 7 peers publishing 4 groups a round and J = 4 drew groups ~60 rounds
  old on average). An age bound in seconds, rather than in rounds, is what a receiver can
  enforce without trusting anyone: peers' rounds have different lengths, and a round
  number is the sender's word. Within the bound, draws stay uniform (no author or moment
  is favoured); the age of what each round trains on is a metric
  (``groups/external_age_s``), and so is the same age in the receiver's own rounds
  (``groups/external_age_rounds``: each group keeps the round in which it arrived,
  ``round_clock``). Ages are read from ``clock``, one parameter of the pool (the wall
  clock by default), which the intake reads too;
- persistent: one SQLite file in the data directory, so a restart keeps it. A file written
  before groups kept their arrival round, or their creation time, gains the column when
  opened (its groups' round is unknown: NULL; a group without a creation time ages from
  its arrival); a version that does not know a column ignores it;
- accountable: per author, how many groups were accepted and refused, by reason, and
  what became of accepted ones that were never trained on: ``expired`` (aged out of the
  pool unused; a group already too old on arrival is the intake's ``too_old``),
  ``evicted_quota`` and ``evicted_full``. Every peer's group ends in exactly one count.

A group may be pooled before it is scored (``rewards`` None), by a node whose rule keeps J
at 0: scoring every peer's group costs as much as the peer's generation did, and one
never drawn gives nothing for it. Such a group is scored (``unscored``, ``set_rewards``)
before any draw that could take it, and no draw takes one unscored.

Sampling takes groups out (a node trains on each group once), by one of the pure
policies of ``intake/sampling.py`` (``pool.sampling``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgpack
import structlog

from sapo_node.intake import peerstate, wire
from sapo_node.intake.sampling import POLICIES, Candidate, reward_spread
from sapo_node.intake.wire import RolloutGroup

log = structlog.get_logger(__name__)

SCHEMA_VERSION = 1
MAX_AUTHOR_CHARS = 128
# Authors whose counts are kept one by one; the rest are summed under OTHERS, so a
# swarm of throw-away identities cannot grow the table without bound.
MAX_TRACKED_AUTHORS = 10_000
OTHERS = "(others)"
_TOGETHER = object()  # the share-cap key of the authors ``sample`` counts as one
ACCEPTED = "accepted"
AGED_OUT = "expired"  # a pooled group older than max_age_s, never drawn


@dataclass(frozen=True)
class PooledGroup:
    """A peer's group with the rewards this node's own verifier gave its completions.

    ``received``: when it entered the pool (this node's clock, seconds; it ages from
    ``group.created_ms`` or from this, whichever is earlier: ``Pool``);
    ``received_round``: this node's round then (``Pool.round_clock``; None if unknown);
    ``rewards``: None while it waits to be scored (the module's docstring).
    """

    group: RolloutGroup
    author: str
    rewards: tuple[float, ...] | None
    received: float = 0.0
    received_round: int | None = None

    @property
    def has_signal(self) -> bool:
        return self.rewards is not None and len(set(self.rewards)) > 1


def group_digest(author: str, group: RolloutGroup) -> bytes:
    """What makes two groups the same: author, task reference and completions."""
    r = group.ref
    key = [author, r.family, r.config_json, r.seed, r.index, list(group.completions)]
    return hashlib.sha256(msgpack.packb(key, use_bin_type=True)).digest()


class RateLimiter:
    """A token bucket per author: ``rate`` groups per second, bursts of ``burst``."""

    def __init__(self, rate: float, burst: int, max_authors: int = MAX_TRACKED_AUTHORS):
        self.rate, self.burst, self.max_authors = rate, burst, max_authors
        self._buckets: dict[str, tuple[float, float]] = {}

    def allow(self, author: str, now: float) -> bool:
        tokens, last = self._buckets.pop(author, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0.0, now - last) * self.rate)
        if len(self._buckets) >= self.max_authors:
            self._forget(now)
        allowed = tokens >= 1.0
        self._buckets[author] = (tokens - 1.0 if allowed else tokens, now)  # most recent last
        return allowed

    def _forget(self, now: float) -> None:
        """Drop buckets that have refilled (they hold nothing worth keeping), then, if there
        are still too many, the least recently used."""
        for author, (tokens, last) in list(self._buckets.items()):
            if tokens + (now - last) * self.rate >= self.burst:
                del self._buckets[author]
        while len(self._buckets) >= self.max_authors:
            del self._buckets[next(iter(self._buckets))]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS groups (
    key INTEGER PRIMARY KEY AUTOINCREMENT,
    digest BLOB NOT NULL UNIQUE,
    author TEXT NOT NULL,
    family TEXT NOT NULL,
    spread REAL NOT NULL,
    rewards TEXT NOT NULL,
    received REAL NOT NULL,
    size INTEGER NOT NULL,
    message BLOB NOT NULL,
    received_round INTEGER,
    born REAL,
    config TEXT
);
CREATE INDEX IF NOT EXISTS groups_author ON groups (author, key);
CREATE INDEX IF NOT EXISTS groups_received ON groups (received);
CREATE TABLE IF NOT EXISTS seen (digest BLOB PRIMARY KEY, time REAL NOT NULL);
CREATE INDEX IF NOT EXISTS seen_time ON seen (time);
CREATE TABLE IF NOT EXISTS counts (
    author TEXT NOT NULL, outcome TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (author, outcome)
);
"""


class PoolError(RuntimeError):
    """The pool's file cannot be used."""


class Pool:
    """The bounded, persisted rollout pool (``path=None`` keeps it in memory).

    ``clock``: seconds now, the time groups arrive and age by (the wall clock unless
    given; the author's ``created`` is on the same scale); ``round_clock``: the owning
    node's round now, kept with each group as it is added (``PooledGroup.received_round``;
    None: not known).
    """

    def __init__(
        self,
        path: Path | None = None,
        *,
        sampling: str = "paper",
        max_groups: int = 4096,
        max_bytes: int = 256 * 2**20,
        max_per_author: int = 512,
        rate_per_author: float = 2.0,
        burst_per_author: int = 64,
        max_age_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        round_clock: Callable[[], int | None] = lambda: None,
    ) -> None:
        if sampling not in POLICIES:
            raise ValueError(f"unknown sampling policy {sampling!r}; known: {sorted(POLICIES)}")
        self.sampling = sampling
        self.max_groups, self.max_bytes = max_groups, max_bytes
        self.max_per_author, self.max_age_s = max_per_author, max_age_s
        self.clock, self.round_clock = clock, round_clock
        self.path = path
        self.limiter = RateLimiter(rate_per_author, burst_per_author)
        self._lock = threading.Lock()
        self._db = _open(path)
        self._counts: Counter[tuple[str, str]] = Counter()
        self._authors = {a for (a,) in self._db.execute("SELECT DISTINCT author FROM counts")}
        # What sampling and the bounds need, mirrored in memory so that neither scans the
        # table: candidates by key, and each author's keys (oldest first) and bytes.
        self._index: dict[int, Candidate] = {}
        self._held: dict[str, dict[int, int]] = {}
        self._author_bytes: Counter[str] = Counter()
        # Why a draw came up short (``train/j_unfilled_*``): how many groups it could take
        # the last sample's per-author cap held back, and how many such groups aged out
        # (exclusions aside) since this object opened.
        self.last_capped = 0
        self.expired_drawable = 0
        with self._lock, self._db:
            self._load_index()
            self._expire(self.clock())

    @classmethod
    def from_config(
        cls,
        path: Path | None,
        section,
        clock: Callable[[], float] = time.time,
        round_clock: Callable[[], int | None] = lambda: None,
    ):
        return cls(
            path,
            sampling=section.sampling,
            max_groups=section.max_groups,
            max_bytes=section.max_mb * 2**20,
            max_per_author=section.max_per_author,
            rate_per_author=section.rate_per_author,
            burst_per_author=section.burst_per_author,
            max_age_s=section.max_age_s,
            clock=clock,
            round_clock=round_clock,
        )

    # --- admission ----------------------------------------------------------------------

    def check(self, author: str, digest: bytes, arrived: float | None = None) -> str | None:
        """Before any costly check: 'duplicate', 'rate_limited', or None to go on. The
        author's rate is measured at ``arrived``, when the group reached this node (now if
        not given): a node takes in what came during a round once the round ends, and an
        author within its rate for the whole round is within it for the pool too."""
        with self._lock:
            now = self.clock()
            if self._db.execute(
                "SELECT 1 FROM seen WHERE digest = ? AND time >= ?",
                (digest, now - self.max_age_s),
            ).fetchone():
                return "duplicate"
            if not self.limiter.allow(author, now if arrived is None else min(arrived, now)):
                return "rate_limited"
            return None

    def add(self, item: PooledGroup, data: bytes, digest: bytes) -> None:
        """Keep a verified group (its wire bytes and this node's rewards)."""
        now = self.clock()
        with self._lock, self._consistent():
            # Stale groups go first: they must not push out fresh ones, nor hold the digest
            # of a group that is sent again after max_age_s.
            self._expire(now)
            self._db.execute("INSERT OR REPLACE INTO seen VALUES (?, ?)", (digest, now))
            ref, rewards = item.group.ref, item.rewards
            spread = None if rewards is None else reward_spread(rewards)
            cur = self._db.execute(
                "INSERT OR IGNORE INTO groups (digest, author, family, spread, received, "
                "rewards, size, message, received_round, born, config) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    digest,
                    item.author,
                    ref.family,
                    0.0 if spread is None else spread,  # the column predates unscored groups
                    now,
                    json.dumps(None if rewards is None else list(rewards)),
                    len(data),
                    bytes(data),
                    self.round_clock(),
                    min(item.group.created_ms / 1000.0, now),  # ages from here (docstring)
                    ref.config_json,
                ),
            )
            if cur.rowcount:
                cand = Candidate(
                    cur.lastrowid, item.author, ref.family, spread, now, config=ref.config_json
                )
                self._remember(cand, len(data))
                self._count(item.author, ACCEPTED)
            self._evict(item.author)
            self._flush_counts()

    def record(self, author: str, outcome: str, n: int = 1) -> None:
        """Count ``n`` groups from ``author`` that were refused for ``outcome``."""
        with self._lock:
            self._count(author, outcome, n)

    # --- sampling -------------------------------------------------------------------------

    def sample(
        self,
        count: int,
        rng: random.Random,
        *,
        per_author: int | None = None,
        exclude: Collection[str] = (),
        together: Collection[str] = (),
        need: Mapping[str, float] | None = None,
        prefer: Collection[tuple[str, str]] = (),
    ) -> list[PooledGroup]:
        """Take up to ``count`` scored groups out, chosen by the sampling policy; with
        ``per_author``, at most that many from any one author (the policy's order, the
        rest skipped), the authors in ``together`` counted as one, and none from the
        authors in ``exclude`` (they stay pooled). ``need``: this node's failure rate
        per family, for the policies that weigh it (``Candidate.need``; 1 if absent).
        ``prefer``: (family, config) pairs, the task levels drawn from first; the rest
        only fill what those could not."""
        self.last_capped = 0
        if count <= 0:
            return []
        with self._lock, self._consistent():
            self._expire(self.clock())
            cands = [
                c for c in self._index.values() if c.author not in exclude and c.spread is not None
            ]
            if need is not None:
                cands = [replace(c, need=need.get(c.family, 1.0)) for c in cands]
            first = [c for c in cands if (c.family, c.config) in prefer]
            rest = [c for c in cands if (c.family, c.config) not in prefer] if first else cands
            taken: Counter[object] = Counter()
            keys: list[int] = []
            for tier in (first, rest):
                if tier and len(keys) < count:
                    keys += self._choose(tier, count - len(keys), rng, per_author, together, taken)
            out = []
            for key in keys:
                author, rewards, received, received_round, message = self._db.execute(
                    "SELECT author, rewards, received, received_round, message FROM groups "
                    "WHERE key = ?",
                    (key,),
                ).fetchone()
                self._delete([key])
                group = wire.decode(message)
                if isinstance(group, wire.Rejection):  # written by an older version of us
                    log.warning("dropping an unreadable pooled group", reason=group.reason)
                    continue
                scored = tuple(json.loads(rewards))
                out.append(PooledGroup(group, author, scored, received, received_round))
            self._flush_counts()
            return out

    def _choose(
        self,
        cands: Sequence[Candidate],
        count: int,
        rng: random.Random,
        per_author: int | None,
        together: Collection[str],
        taken: Counter[object],
    ) -> list[int]:
        """The policy's pick of ``count`` keys, at most ``per_author`` an author counting
        what ``taken`` already holds (updated); adds the groups the cap held back to
        ``last_capped``."""
        policy = POLICIES[self.sampling]
        if per_author is None or (per_author >= count and not taken):
            keys = policy(cands, count, rng)
            for key in keys:
                taken[self._author_key(key, together)] += 1
            return keys
        keys = []
        for key in policy(cands, len(cands), rng):
            who = self._author_key(key, together)
            if taken[who] < per_author:
                taken[who] += 1
                keys.append(key)
            else:
                self.last_capped += 1
            if len(keys) == count:
                break
        return keys

    def _author_key(self, key: int, together: Collection[str]) -> object:
        author = self._index[key].author
        return _TOGETHER if author in together else author

    def unscored(self, exclude: Collection[str] = ()) -> list[tuple[int, PooledGroup]]:
        """The pooled groups not scored yet (none from the authors in ``exclude``), oldest
        first, with their keys for ``set_rewards``."""
        with self._lock, self._consistent():
            self._expire(self.clock())
            keys = [
                k for k, c in self._index.items() if c.spread is None and c.author not in exclude
            ]
            out = []
            for key in keys:
                author, received, received_round, message = self._db.execute(
                    "SELECT author, received, received_round, message FROM groups WHERE key = ?",
                    (key,),
                ).fetchone()
                group = wire.decode(message)
                if isinstance(group, wire.Rejection):  # written by an older version of us
                    log.warning("dropping an unreadable pooled group", reason=group.reason)
                    self._delete([key])
                    continue
                out.append((key, PooledGroup(group, author, None, received, received_round)))
            return out

    def set_rewards(self, key: int, rewards: Sequence[float]) -> None:
        """This node's rewards for a group pooled unscored (gone meanwhile: nothing)."""
        with self._lock, self._consistent():
            cand = self._index.get(key)
            if cand is None:
                return
            spread = reward_spread(rewards)
            self._db.execute(
                "UPDATE groups SET rewards = ?, spread = ? WHERE key = ?",
                (json.dumps(list(rewards)), spread, key),
            )
            self._index[key] = replace(cand, spread=spread)

    def drop(self, key: int, outcome: str) -> None:
        """Remove a pooled group that cannot be used after all, counted as ``outcome``."""
        with self._lock, self._consistent():
            if key in self._index:
                self._delete([key], outcome)
                self._flush_counts()

    # --- state ----------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def size_bytes(self) -> int:
        with self._lock:
            return sum(self._author_bytes.values())

    def counts(self) -> dict[str, dict[str, int]]:
        """Per author: groups accepted, and refused by reason (persisted across restarts)."""
        with self._lock, self._db:
            self._flush_counts()
            return _read_counts(self._db)

    def close(self) -> None:
        with self._lock:
            try:
                with self._db:
                    self._flush_counts()
            except sqlite3.Error as exc:
                log.warning("pool counts not saved", error=str(exc))
            self._db.close()

    # --- internals (called with the lock held) ----------------------------------------------

    def _count(self, author: str, outcome: str, n: int = 1) -> None:
        if author not in self._authors:
            if len(self._authors) >= MAX_TRACKED_AUTHORS:
                author = OTHERS
            self._authors.add(author)
        self._counts[(author, outcome)] += n

    def _flush_counts(self) -> None:
        if self._counts:
            self._db.executemany(
                "INSERT INTO counts VALUES (?, ?, ?) "
                "ON CONFLICT (author, outcome) DO UPDATE SET n = n + excluded.n",
                [(a, o, n) for (a, o), n in self._counts.items()],
            )
            self._counts.clear()

    @contextlib.contextmanager
    def _consistent(self) -> Iterator[None]:
        """One transaction; if it fails, the in-memory mirror is rebuilt from the file."""
        try:
            with self._db:
                yield
        except sqlite3.Error:
            self._load_index()
            raise

    def _load_index(self) -> None:
        self._index.clear()
        self._held.clear()
        self._author_bytes.clear()
        for key, author, family, spread, received, size, config in self._db.execute(
            "SELECT key, author, family, CASE WHEN rewards = 'null' THEN NULL ELSE spread END, "
            "received, size, COALESCE(config, '') FROM groups ORDER BY key"
        ):
            self._remember(Candidate(key, author, family, spread, received, config=config), size)

    def _remember(self, cand: Candidate, size: int) -> None:
        self._index[cand.key] = cand
        self._held.setdefault(cand.author, {})[cand.key] = size
        self._author_bytes[cand.author] += size

    def _delete(self, keys: Sequence[int], outcome: str | None = None) -> None:
        self._db.executemany("DELETE FROM groups WHERE key = ?", [(k,) for k in keys])
        for key in keys:
            author = self._index.pop(key).author
            held = self._held[author]
            self._author_bytes[author] -= held.pop(key)
            if not held:
                del self._held[author]
                del self._author_bytes[author]
            if outcome:
                self._count(author, outcome)

    def _evict(self, author: str) -> None:
        held = self._held.get(author, {})
        if len(held) > self.max_per_author:
            self._delete(list(held)[: len(held) - self.max_per_author], "evicted_quota")
        # Past a bound, the oldest group of the author holding the most (groups or bytes).
        while len(self._index) > self.max_groups:
            largest = max(self._held, key=lambda a: len(self._held[a]))
            self._delete([next(iter(self._held[largest]))], "evicted_full")
        while sum(self._author_bytes.values()) > self.max_bytes:
            largest = max(self._author_bytes, key=self._author_bytes.__getitem__)
            self._delete([next(iter(self._held[largest]))], "evicted_full")

    def _drawable(self, c: Candidate) -> bool:
        """Whether the sampling policy could take this group (``uniform`` takes any; an
        unscored one might have had signal)."""
        return c.spread is None or c.has_signal or self.sampling == "uniform"

    def _expire(self, now: float) -> None:
        cutoff = now - self.max_age_s
        stale = [
            k
            for (k,) in self._db.execute(
                "SELECT key FROM groups WHERE COALESCE(born, received) < ?", (cutoff,)
            )
        ]
        if stale:
            self.expired_drawable += sum(self._drawable(self._index[k]) for k in stale)
            self._delete(stale, AGED_OUT)
        self._db.execute("DELETE FROM seen WHERE time < ?", (cutoff,))


def _read_counts(db: sqlite3.Connection) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for author, outcome, n in db.execute("SELECT author, outcome, n FROM counts"):
        out.setdefault(author, {})[outcome] = n
    return out


def summary(path: Path) -> dict[str, Any]:
    """What a pool file holds, read without writing (a running node may hold it), and the
    peers banned and distrusted now, with seconds left (peerstate.py, same directory)."""
    if not path.exists():
        raise PoolError(f"no pool at {path}")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            groups, size, with_signal = db.execute(
                "SELECT count(*), coalesce(sum(size), 0), coalesce(sum(spread > 0), 0) FROM groups"
            ).fetchone()
            families = dict(db.execute("SELECT family, count(*) FROM groups GROUP BY family"))
            held = dict(db.execute("SELECT author, count(*) FROM groups GROUP BY author"))
            peers = _read_counts(db)
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise PoolError(f"cannot read the pool at {path}: {exc}") from None
    return {
        "path": str(path),
        "groups": groups,
        "mb": round(size / 2**20, 3),
        "groups_with_signal": with_signal,
        "families": families,
        "peers": {a: {"held": held.get(a, 0), **c} for a, c in sorted(peers.items())},
        # the peers banned by the network and distrusted by the defences, time left
        **peerstate.summary(path.parent),
    }


def _open(path: Path | None) -> sqlite3.Connection:
    """Open (or create) the pool's database; a file that is not one is moved aside."""
    if path is None:
        return _connect(":memory:")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _connect(str(path))
    except sqlite3.OperationalError as exc:  # cannot open, read-only, disk I/O, locked
        raise PoolError(f"cannot open the pool at {path}: {exc}") from None
    except sqlite3.DatabaseError as exc:  # not a database, or not ours
        aside = path.with_name(f"{path.name}.unusable-{time.time_ns()}")
        path.rename(aside)
        for suffix in ("-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        log.warning(
            "pool file unusable: moved aside, starting empty", error=str(exc), kept=str(aside)
        )
        try:
            return _connect(str(path))
        except sqlite3.Error as exc2:
            raise PoolError(f"cannot create the pool at {path}: {exc2}") from None


def _connect(where: str) -> sqlite3.Connection:
    db = sqlite3.connect(where, check_same_thread=False, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version not in (0, SCHEMA_VERSION):
            raise sqlite3.DatabaseError(
                f"schema version {version}, this node uses {SCHEMA_VERSION}"
            )
        db.executescript(_SCHEMA)
        columns = {name for _, name, *_ in db.execute("PRAGMA table_info(groups)")}
        if "received_round" not in columns:  # written before groups kept their round
            db.execute("ALTER TABLE groups ADD COLUMN received_round INTEGER")
        if "born" not in columns:  # written before groups aged from their creation
            db.execute("ALTER TABLE groups ADD COLUMN born REAL")
        if "config" not in columns:  # written before draws could prefer a level
            db.execute("ALTER TABLE groups ADD COLUMN config TEXT")
        db.execute("CREATE INDEX IF NOT EXISTS groups_age ON groups (COALESCE(born, received))")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.isolation_level = ""  # "with db:" makes one transaction
    except sqlite3.Error:
        db.close()
        raise
    return db
