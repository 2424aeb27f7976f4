"""The rollout pool: bounds, quotas, rate limits, duplicates, expiry, persistence, sampling.

Real SQLite (files under tmp_path, or in memory), real wire messages, a fake clock.
"""

from __future__ import annotations

import doctest
import functools
import random
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from sapo_node.intake import pool as pool_module
from sapo_node.intake import wire
from sapo_node.intake.pool import OTHERS, Pool, PooledGroup, RateLimiter, group_digest
from sapo_node.intake.sampling import (
    POLICIES,
    Candidate,
    reward_spread,
    sample_balanced,
    sample_teaching,
)
from sapo_node.tasks import TaskRef, generator_of, make_task

T0 = 1_700_000_000.0
SIGNAL = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0)
FLAT = (0.0,) * 8
REF = TaskRef.make(
    "basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, 5, 0
)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@functools.cache
def _question(ref: TaskRef) -> str:
    return make_task(ref).question


def entry(
    author: str,
    n: int,
    rewards: tuple[float, ...] = SIGNAL,
    family: str = "basic_arithmetic",
    created: float = T0,
) -> tuple[PooledGroup, bytes, bytes]:
    """Group number ``n`` of ``author``, made at ``created``: a real encoded message of
    fixed size."""
    if family == "basic_arithmetic":
        ref, question = REF, _question(REF)
    else:
        ref, question = TaskRef.make(family, {}, 5, 0), "What is it?"
    group = wire.RolloutGroup(
        ref=ref,
        generator=generator_of(family),
        question=question,
        completions=tuple(f"<answer>{n:06d}-{i}</answer>" for i in range(len(rewards))),
        model="tiny",
        round=1,
        created_ms=int(created * 1000),
    )
    data = wire.encode(group)
    return PooledGroup(group, author, rewards), data, group_digest(author, group)


def put(pool: Pool, author: str, n: int, **kw) -> bytes:
    """Add group ``n`` of ``author``, made just now unless ``created`` says; return its
    digest."""
    kw.setdefault("created", pool.clock())
    item, data, digest = entry(author, n, **kw)
    pool.add(item, data, digest)
    return digest


def number(g: PooledGroup) -> int:
    return int(g.group.completions[0][len("<answer>") :].split("-")[0])


def drain(pool: Pool) -> set[tuple[str, int]]:
    """Take every group out (the pool's policy must be 'uniform') as (author, n)."""
    return {(g.author, number(g)) for g in pool.sample(10**6, random.Random(0))}


def make_pool(path: Path | None = None, clock: Clock | None = None, **kw) -> Pool:
    kw.setdefault("sampling", "uniform")
    kw.setdefault("burst_per_author", 10_000)
    return Pool(path, clock=clock or Clock(), **kw)


def test_doctests() -> None:
    assert doctest.testmod(pool_module).failed == 0


# --- bounds, quotas, rate ------------------------------------------------------------------


def test_group_bound_evicts_the_oldest_group_of_the_largest_author() -> None:
    pool = make_pool(max_groups=5)
    for n in (0, 1, 2):
        put(pool, "a", n)
    for n in (10, 11):
        put(pool, "b", n)
    put(pool, "c", 20)  # 6 > 5: a holds the most, its oldest goes
    assert len(pool) == 5
    put(pool, "b", 12)  # a: 2, b: 3, c: 1 -> b's oldest goes
    assert pool.counts()["a"]["evicted_full"] == 1
    assert pool.counts()["b"]["evicted_full"] == 1
    assert drain(pool) == {("a", 1), ("a", 2), ("b", 11), ("b", 12), ("c", 20)}


def test_byte_bound_evicts_until_under_it() -> None:
    size = len(entry("a", 0)[1])
    assert all(len(entry(a, n)[1]) == size for a in "ab" for n in range(20))
    pool = make_pool(max_bytes=3 * size + size // 2)
    put(pool, "a", 0)
    put(pool, "a", 1)
    put(pool, "b", 10)
    assert pool.size_bytes() == 3 * size
    put(pool, "b", 11)  # a and b hold 2 each: the author with the oldest group gives way
    assert pool.size_bytes() == 3 * size
    assert len(pool) == 3
    assert drain(pool) == {("a", 1), ("b", 10), ("b", 11)}
    assert pool.size_bytes() == 0


def test_per_author_quota_evicts_that_authors_oldest() -> None:
    pool = make_pool(max_per_author=2)
    put(pool, "b", 10)
    for n in (0, 1, 2, 3):
        put(pool, "a", n)
    counts = pool.counts()
    assert counts["a"] == {"accepted": 4, "evicted_quota": 2}
    assert counts["b"] == {"accepted": 1}
    assert drain(pool) == {("a", 2), ("a", 3), ("b", 10)}


def test_rate_limit_allows_a_burst_then_refills_with_the_clock() -> None:
    clock = Clock()
    pool = make_pool(clock=clock, rate_per_author=1.0, burst_per_author=3)
    digests = iter(bytes([i]) * 32 for i in range(100))
    assert [pool.check("a", next(digests)) for _ in range(4)] == [None] * 3 + ["rate_limited"]
    assert pool.check("b", next(digests)) is None  # one bucket per author
    clock.advance(1.0)
    assert [pool.check("a", next(digests)) for _ in range(2)] == [None, "rate_limited"]
    clock.advance(100.0)  # refills up to the burst, no further
    assert [pool.check("a", next(digests)) for _ in range(4)] == [None] * 3 + ["rate_limited"]


def test_rate_limit_is_measured_when_groups_arrived_not_when_they_are_checked() -> None:
    clock = Clock()
    pool = make_pool(clock=clock, rate_per_author=1.0, burst_per_author=3)
    digests = iter(bytes([i]) * 32 for i in range(100))
    clock.advance(100.0)
    # one a second for 20 s, all checked at the end: within the rate
    arrived = [T0 + 80.0 + t for t in range(20)]
    assert [pool.check("a", next(digests), arrived=at) for at in arrived] == [None] * 20
    # four at once, a second later: the bucket holds three
    assert [pool.check("a", next(digests), arrived=T0 + 100.0) for _ in range(4)] == [None] * 3 + [
        "rate_limited"
    ]
    # an arrival "in the future" counts as now
    assert pool.check("a", next(digests), arrived=T0 + 500.0) == "rate_limited"
    # checked at the same moment, the same 20 arrivals would not have fitted
    late = make_pool(clock=clock, rate_per_author=1.0, burst_per_author=3)
    assert [late.check("a", next(digests)) for _ in range(20)].count(None) == 3


# --- duplicates and age ----------------------------------------------------------------------


def test_duplicates_are_refused_after_sampling_and_accepted_after_max_age() -> None:
    clock = Clock()
    pool = make_pool(clock=clock, max_age_s=100.0)
    digest = put(pool, "a", 0)
    assert pool.check("a", digest) == "duplicate"
    assert pool.check("b", entry("b", 0)[2]) is None  # the same group from another author
    assert len(pool.sample(1, random.Random(0))) == 1
    assert len(pool) == 0
    assert pool.check("a", digest) == "duplicate"  # used, still remembered
    clock.advance(99.0)
    assert pool.check("a", digest) == "duplicate"
    clock.advance(2.0)
    assert pool.check("a", digest) is None  # forgotten after max_age, with no add in between
    put(pool, "a", 0)
    assert len(pool) == 1


def test_a_group_sent_again_after_max_age_replaces_its_stale_copy() -> None:
    clock = Clock()
    pool = make_pool(clock=clock, max_age_s=100.0)
    digest = put(pool, "a", 0)
    clock.advance(101.0)  # nothing ran since: the stale copy is still in the table
    assert pool.check("a", digest) is None
    put(pool, "a", 0)
    assert pool.counts()["a"] == {"accepted": 2, "expired": 1}
    assert [g.received for g in pool.sample(5, random.Random(0))] == [T0 + 101.0]


def test_groups_expire_by_age_on_add_and_on_sample() -> None:
    clock = Clock()
    pool = make_pool(clock=clock, max_age_s=100.0)
    put(pool, "a", 0)
    clock.advance(50.0)
    put(pool, "a", 1)
    clock.advance(60.0)  # a0 is 110 s old
    put(pool, "b", 10)
    assert len(pool) == 2
    assert pool.counts()["a"]["expired"] == 1
    clock.advance(60.0)  # a1 is 110 s old, b10 60 s
    assert [(g.author, number(g)) for g in pool.sample(5, random.Random(0))] == [("b", 10)]
    assert pool.counts()["a"]["expired"] == 2


def test_a_group_ages_from_its_creation_bounded_by_its_arrival() -> None:
    """Issue 47: a group that arrives 99 s old (max_age_s 100) is gone 2 s later, not
    100 s later; one dated 50 s ahead of this node's clock (a skew the intake allows)
    ages from its arrival, so it stays no longer than max_age_s either."""
    clock = Clock()
    pool = make_pool(clock=clock, max_age_s=100.0)
    put(pool, "old", 0, created=clock() - 99.0)
    put(pool, "ahead", 1, created=clock() + 50.0)
    put(pool, "fresh", 2)
    clock.advance(2.0)
    put(pool, "later", 3)  # an add expires what is stale
    assert len(pool) == 3 and pool.counts()["old"] == {"accepted": 1, "expired": 1}
    clock.advance(99.0)  # 101 s since the first three arrived, 51 s after "ahead"'s date
    assert drain(pool) == {("later", 3)}
    assert pool.counts()["ahead"]["expired"] == pool.counts()["fresh"]["expired"] == 1


def test_a_file_from_before_creation_times_ages_its_groups_from_arrival(tmp_path: Path) -> None:
    path = tmp_path / "pool.sqlite3"
    clock = Clock()
    pool = make_pool(path, clock, max_age_s=100.0)
    put(pool, "a", 0, created=clock() - 90.0)
    pool.close()
    db = sqlite3.connect(path)
    db.execute("DROP INDEX groups_age")
    db.execute("ALTER TABLE groups DROP COLUMN born")  # as the old schema had it
    db.commit()
    db.close()
    clock.advance(50.0)
    again = make_pool(path, clock, max_age_s=100.0)
    put(again, "a", 1, created=clock() - 90.0)
    clock.advance(20.0)  # "a" 0 arrived 70 s ago (its creation unknown), "a" 1 is 110 s old
    assert drain(again) == {("a", 0)}
    again.close()


def test_stale_groups_expire_before_fresh_ones_are_evicted() -> None:
    clock = Clock()
    pool = make_pool(clock=clock, max_groups=5, max_age_s=100.0)
    put(pool, "b", 10)
    put(pool, "b", 11)
    clock.advance(50.0)
    for n in (0, 1, 2):
        put(pool, "a", n)
    clock.advance(60.0)  # b's groups are stale, a's are not
    put(pool, "c", 20)
    assert pool.counts()["b"] == {"accepted": 2, "expired": 2}
    assert "evicted_full" not in pool.counts()["a"]
    assert drain(pool) == {("a", 0), ("a", 1), ("a", 2), ("c", 20)}


# --- persistence and accounting --------------------------------------------------------------


def test_close_and_reopen_keeps_groups_seen_digests_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "data" / "pool.sqlite3"
    clock = Clock()
    pool = make_pool(path, clock, max_per_author=2)
    used = put(pool, "a", 0)
    assert len(pool.sample(1, random.Random(0))) == 1
    kept = [put(pool, "a", n, rewards=SIGNAL) for n in (1, 2, 3)]  # a1 evicted by quota
    put(pool, "b", 10, rewards=FLAT)
    pool.record("b", "question_mismatch")
    before = pool.counts()
    pool.close()

    clock.advance(10.0)
    again = make_pool(path, clock, max_per_author=2)
    assert len(again) == 3
    assert again.counts() == before
    assert before == {
        "a": {"accepted": 4, "evicted_quota": 1},
        "b": {"accepted": 1, "question_mismatch": 1},
    }
    for digest in [used, *kept]:
        assert again.check("a", digest) == "duplicate"
    got = {(g.author, number(g)): g.rewards for g in again.sample(10, random.Random(0))}
    assert got == {("a", 2): SIGNAL, ("a", 3): SIGNAL, ("b", 10): FLAT}
    again.record("b", "question_mismatch")
    again.close()
    third = make_pool(path, clock)
    assert len(third) == 0
    assert third.counts()["b"]["question_mismatch"] == 2
    third.close()


def test_a_group_keeps_the_round_it_arrived_in_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "pool.sqlite3"
    now = {"round": 3}
    pool = make_pool(path, round_clock=lambda: now["round"])
    put(pool, "a", 0)
    now["round"] = 5
    put(pool, "a", 1)
    pool.close()
    again = make_pool(path)  # whatever its clock says now, what was kept is kept
    got = {number(g): g.received_round for g in again.sample(10, random.Random(0))}
    assert got == {0: 3, 1: 5}
    put(again, "a", 2)  # no round clock: not known
    assert [g.received_round for g in again.sample(10, random.Random(0))] == [None]
    again.close()


def test_a_file_from_before_arrival_rounds_gains_the_column(tmp_path: Path) -> None:
    path = tmp_path / "pool.sqlite3"
    pool = make_pool(path)
    put(pool, "a", 0)
    pool.close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE groups DROP COLUMN received_round")  # as the old schema had it
    db.commit()
    db.close()
    again = make_pool(path, round_clock=lambda: 7)
    put(again, "a", 1)
    got = {number(g): g.received_round for g in again.sample(10, random.Random(0))}
    assert got == {0: None, 1: 7}
    again.close()


def test_a_corrupt_file_is_moved_aside_and_the_pool_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "pool.sqlite3"
    junk = b"this is not an SQLite database\n" * 200
    path.write_bytes(junk)
    with structlog.testing.capture_logs() as logs:
        pool = make_pool(path)
    assert len(pool) == 0 and pool.counts() == {}
    assert [e["log_level"] for e in logs] == ["warning"]
    assert "unusable" in logs[0]["event"]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("pool.sqlite3.unusable-")]
    assert len(aside) == 1 and aside[0].read_bytes() == junk
    put(pool, "a", 0)
    pool.close()
    reopened = make_pool(path)
    assert len(reopened) == 1
    reopened.close()


def test_counts_by_reason() -> None:
    clock = Clock()
    pool = make_pool(clock=clock, max_groups=3, max_per_author=2, max_age_s=100.0)
    pool.record("a", "question_mismatch")
    pool.record("a", "question_mismatch")
    pool.record("b", "rate_limited")
    put(pool, "a", 0)
    put(pool, "a", 1)
    put(pool, "a", 2)  # quota: a0 goes
    put(pool, "b", 10)
    put(pool, "b", 11)  # a and b hold 2 each, 4 > 3: a's a1 is the oldest
    clock.advance(101.0)
    put(pool, "c", 20)  # the rest expire
    assert pool.counts() == {
        "a": {"question_mismatch": 2, "accepted": 3, "evicted_quota": 1, "evicted_full": 1,
              "expired": 1},
        "b": {"rate_limited": 1, "accepted": 2, "expired": 2},
        "c": {"accepted": 1},
    }  # fmt: skip


def test_authors_past_the_tracked_limit_are_summed_under_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "MAX_TRACKED_AUTHORS", 3)
    path = tmp_path / "pool.sqlite3"
    pool = make_pool(path)
    for i in range(6):
        pool.record(f"peer-{i}", "bad_task")
    put(pool, "peer-7", 0)
    counts = pool.counts()
    assert set(counts) == {"peer-0", "peer-1", "peer-2", OTHERS}
    assert counts[OTHERS] == {"bad_task": 3, "accepted": 1}
    pool.close()
    reopened = make_pool(path)
    reopened.record("peer-0", "bad_task")
    reopened.record("peer-9", "bad_task")
    assert reopened.counts()["peer-0"] == {"bad_task": 2}
    assert reopened.counts()[OTHERS]["bad_task"] == 4
    reopened.close()


# --- sampling from the pool -------------------------------------------------------------------


def test_sampling_takes_groups_out_with_this_nodes_rewards() -> None:
    clock = Clock()
    pool = make_pool(clock=clock, sampling="paper")
    sent = {}
    for n, rewards in enumerate([SIGNAL, FLAT, SIGNAL, (1.0,) * 8, (0.0, 1.0) * 4]):
        item, data, digest = entry(f"peer-{n % 2}", n, rewards=rewards)
        pool.add(item, data, digest)
        sent[n] = item
        clock.advance(1.0)
    assert pool.sample(0, random.Random(0)) == []
    first = pool.sample(2, random.Random(0))
    rest = pool.sample(10, random.Random(0))
    assert len(first) == 2 and len(rest) == 1  # paper: only groups with signal
    for g in first + rest:
        n = number(g)
        assert g.group == sent[n].group
        assert g.author == sent[n].author
        assert g.rewards == sent[n].rewards and g.has_signal
        assert g.received == T0 + n
    assert {number(g) for g in first + rest} == {0, 2, 4}
    assert len(pool) == 2  # the flat groups stay, unused
    assert pool.sample(4, random.Random(0)) == []


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown sampling policy"):
        Pool(None, sampling="newest")


# --- sampling policies as pure functions ------------------------------------------------------

SPREADS = [0.0, reward_spread([1, 0, 0, 0, 0, 0, 0, 0]), reward_spread([1, 0] * 4), 0.25]
candidates = st.lists(
    st.builds(
        lambda author, family, spread: (author, family, spread),
        st.sampled_from(["a", "b", "c", "d"]),
        st.sampled_from(["f1", "f2", "f3"]),
        st.sampled_from(SPREADS),
    ),
    max_size=40,
).map(lambda rows: [Candidate(k * 3 + 1, a, f, s, T0) for k, (a, f, s) in enumerate(rows)])


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=150, deadline=None)
@given(cands=candidates, count=st.integers(0, 50), seed=st.integers(0, 2**32))
def test_policy_properties(name: str, cands: list[Candidate], count: int, seed: int) -> None:
    picks = POLICIES[name](cands, count, random.Random(seed))
    by_key = {c.key: c for c in cands}
    assert len(picks) <= count
    assert len(set(picks)) == len(picks)
    assert set(picks) <= set(by_key)
    eligible = [c for c in cands if c.has_signal or name == "uniform"]
    assert len(picks) == min(count, len(eligible))
    if name != "uniform":
        assert all(by_key[k].has_signal for k in picks)


def test_uniform_may_return_groups_without_signal() -> None:
    cands = [Candidate(k, "a", "f", 0.0, T0) for k in range(5)]
    assert sorted(POLICIES["uniform"](cands, 5, random.Random(0))) == list(range(5))
    assert POLICIES["paper"](cands, 5, random.Random(0)) == []
    assert POLICIES["balanced"](cands, 5, random.Random(0)) == []


def test_balanced_covers_every_author_of_a_skewed_pool() -> None:
    cands = [Candidate(k, "big", f"f{k % 3}", 0.5, T0) for k in range(90)]
    cands += [Candidate(100 + k, f"small-{k % 5}", "f0", 0.33, T0) for k in range(10)]
    for seed in range(50):
        picks = sample_balanced(cands, 6, random.Random(seed))
        authors = {c.author for c in cands if c.key in picks}
        assert len(authors) == 6
    paper = [POLICIES["paper"](cands, 6, random.Random(s)) for s in range(50)]
    covered = [len({c.author for c in cands if c.key in p}) for p in paper]
    assert sum(covered) / len(covered) < 4  # what uniform draws do, for contrast


def test_balanced_prefers_families_not_yet_picked() -> None:
    cands = [Candidate(k, "a", "common", 0.5, T0) for k in range(20)]
    cands += [Candidate(50, "a", "rare", 0.1, T0), Candidate(51, "a", "rarer", 0.1, T0)]
    for seed in range(30):
        picks = sample_balanced(cands, 3, random.Random(seed))
        assert {c.family for c in cands if c.key in picks} == {"common", "rare", "rarer"}


def test_balanced_favours_higher_spread() -> None:
    cands = [Candidate(1, "a", "f", 0.5, T0), Candidate(2, "a", "f", 0.1, T0)]
    rng = random.Random(1234)
    chosen = Counter(sample_balanced(cands, 1, rng)[0] for _ in range(3000))
    # Expected 5:1 (weights 0.5 and 0.1); a wide margin on both sides.
    assert 3 * chosen[2] < chosen[1] < 8 * chosen[2]


def test_teaching_weighs_reward_variance_times_the_nodes_need() -> None:
    # one author: a 4-of-8 group (spread 0.5) on a family this node fails, the same on a
    # family it solves, and a 1-of-8 group (spread 0.33) on the failed family
    cands = [
        Candidate(1, "a", "failed", 0.5, T0, need=1.0),
        Candidate(2, "a", "solved", 0.5, T0, need=0.05),
        Candidate(3, "a", "failed", 0.33, T0, need=1.0),
    ]
    rng = random.Random(7)
    chosen = Counter(sample_teaching(cands, 1, rng)[0] for _ in range(4000))
    # weights 0.25, 0.0125 and 0.109: 1 about 2.3x as often as 3, 3 about 9x as often as 2
    assert 1.6 * chosen[3] < chosen[1] < 3.2 * chosen[3]
    assert 5 * chosen[2] < chosen[3]


def test_a_peer_aiming_at_the_teaching_weights_gets_no_more_than_its_turns() -> None:
    """A hostile peer fills the pool with the heaviest groups there can be (half right,
    on the family this node fails most); two honest peers send ordinary ones. Turns
    between authors give it at most its share of the picks, whatever the weights."""
    attacker = [Candidate(k, "attacker", "failed", 0.5, T0, need=1.0) for k in range(200)]
    honest = [
        Candidate(1000 + k, f"honest-{k % 2}", "solved", 0.2, T0, need=0.05) for k in range(6)
    ]
    for seed in range(100):
        picks = sample_teaching(attacker + honest, 3, random.Random(seed))
        assert sum(k < 1000 for k in picks) == 1
        picks = sample_teaching(attacker + honest, 6, random.Random(seed))
        assert sum(k < 1000 for k in picks) == 2
    # without turns (one weighted draw over all groups) it would take nearly every pick
    pool = attacker + honest
    weights = [c.spread**2 * c.need for c in pool]
    rng = random.Random(0)
    drawn = [rng.choices(pool, weights=weights)[0].author for _ in range(1000)]
    assert drawn.count("attacker") > 990


def test_the_pool_gives_its_candidates_the_nodes_need(tmp_path: Path) -> None:
    p = make_pool(tmp_path / "pool.sqlite3", sampling="teaching")
    for n in range(40):
        p.add(*entry("a", n, family="basic_arithmetic"))
        p.add(*entry("a", 100 + n, family="tests.support.families:Sevens"))
    need = {"basic_arithmetic": 0.05, "tests.support.families:Sevens": 1.0}
    taken = Counter()
    for r in range(10):
        taken.update(g.group.ref.family for g in p.sample(2, random.Random(r), need=need))
    # weights 1.0 against 0.05 per group: about 19 of 20 picks on the family it needs
    assert taken["tests.support.families:Sevens"] >= 16, taken
    p.close()


def test_the_rate_limiter_never_tracks_more_than_its_bound() -> None:
    limiter = RateLimiter(rate=0.001, burst=2, max_authors=100)
    for i in range(1000):  # throw-away identities, none refilled
        assert limiter.allow(f"sybil-{i}", T0)
    assert len(limiter._buckets) <= 100
    assert limiter.allow("sybil-999", T0) and not limiter.allow("sybil-999", T0)


def test_the_byte_bound_takes_from_the_author_holding_the_most_bytes() -> None:
    small = len(entry("a", 0)[1])
    big_item, big_data, big_digest = entry("big", 1, rewards=SIGNAL * 8)
    assert len(big_data) > 3 * small
    pool = make_pool(max_bytes=len(big_data) + 3 * small)
    for n in range(3):
        put(pool, "a", n)
    pool.add(big_item, big_data, big_digest)
    put(pool, "a", 3)  # a holds more groups, "big" more bytes: "big" goes
    assert pool.counts()["big"] == {"accepted": 1, "evicted_full": 1}
    assert len(pool) == 4


def test_the_in_memory_mirror_matches_the_file(tmp_path: Path) -> None:
    clock = Clock()
    pool = make_pool(tmp_path / "p.sqlite3", clock, max_groups=40, max_per_author=15)
    rng = random.Random(3)
    for n in range(300):
        put(pool, rng.choice("abcd"), n, rewards=rng.choice([SIGNAL, FLAT]))
        clock.advance(rng.choice([1.0, 5.0, 40.0]))
        if n % 7 == 0:
            pool.sample(rng.randint(1, 6), rng)
    pool.max_age_s = 600.0
    pool.sample(1, rng)  # expires too
    n, size = pool._db.execute("SELECT count(*), coalesce(sum(size), 0) FROM groups").fetchone()
    assert (len(pool), pool.size_bytes()) == (n, size)
    keys = sorted(k for (k,) in pool._db.execute("SELECT key FROM groups"))
    assert sorted(pool._index) == keys
    pool.close()
    reopened = make_pool(tmp_path / "p.sqlite3", clock, max_age_s=600.0)  # the same bound
    assert (len(reopened), reopened.size_bytes()) == (n, size)
    reopened.close()
