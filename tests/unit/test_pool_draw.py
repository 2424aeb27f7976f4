"""The pool's draw beyond the sampling policies: groups pooled unscored (never drawn until
this node scores them) and the task levels a draw prefers.

Real SQLite (files under tmp_path, or in memory), real wire messages, a fake clock.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from sapo_node.intake import wire
from sapo_node.intake.pool import PooledGroup, group_digest
from sapo_node.tasks import TaskRef, generator_of
from tests.unit.test_pool import FLAT, SIGNAL, Clock, entry, make_pool, number


def unscored(author: str, n: int, clock: Clock) -> tuple[PooledGroup, bytes, bytes]:
    item, data, digest = entry(author, n, created=clock())
    return replace(item, rewards=None), data, digest


def test_an_unscored_group_is_never_drawn_until_scored(tmp_path: Path) -> None:
    clock = Clock()
    pool = make_pool(tmp_path / "p.sqlite3", clock, sampling="uniform")
    for n in range(3):
        pool.add(*unscored("a", n, clock))
    pool.add(*entry("b", 9, rewards=FLAT, created=clock()))
    assert len(pool) == 4
    assert [g.author for g in pool.sample(10, random.Random(0))] == ["b"]  # uniform: any scored
    waiting = pool.unscored()
    assert [number(g) for _, g in waiting] == [0, 1, 2]
    assert all(g.rewards is None and not g.has_signal for _, g in waiting)
    assert pool.unscored(exclude={"a"}) == []
    pool.set_rewards(waiting[0][0], SIGNAL)
    pool.drop(waiting[1][0], "unscorable")
    pool.close()
    pool = make_pool(tmp_path / "p.sqlite3", clock, sampling="paper")  # across a restart
    assert [number(g) for _, g in pool.unscored()] == [2]
    drawn = pool.sample(10, random.Random(0))
    assert [(number(g), g.rewards) for g in drawn] == [(0, SIGNAL)]
    assert pool.counts()["a"] == {"accepted": 3, "unscorable": 1}
    pool.set_rewards(10**6, SIGNAL)  # gone: nothing happens


def test_an_unscored_group_that_ages_out_counts_as_one_a_draw_might_have_taken() -> None:
    clock = Clock()
    pool = make_pool(clock=clock, sampling="paper", max_age_s=10.0)
    pool.add(*unscored("a", 0, clock))
    pool.add(*entry("a", 1, rewards=FLAT, created=clock()))
    clock.advance(11.0)
    assert pool.sample(1, random.Random(0)) == []
    assert pool.expired_drawable == 1  # the unscored one; the flat one was never drawable
    assert pool.counts()["a"]["expired"] == 2


def _at(level: int, author: str, n: int, clock: Clock) -> tuple[PooledGroup, bytes, bytes]:
    ref = TaskRef.make("sevens", {"level": level}, 5, n)
    group = wire.RolloutGroup(
        ref=ref,
        generator=generator_of("sevens"),
        question="Write sevens.",
        completions=tuple(f"<answer>{n}-{i}</answer>" for i in range(len(SIGNAL))),
        model="tiny",
        round=1,
        created_ms=int(clock() * 1000),
    )
    return PooledGroup(group, author, SIGNAL), wire.encode(group), group_digest(author, group)


def test_a_draw_takes_the_preferred_levels_first_and_fills_from_the_rest(tmp_path: Path) -> None:
    clock = Clock()
    pool = make_pool(tmp_path / "p.sqlite3", clock, sampling="paper")
    for n in range(6):
        pool.add(*_at(n % 2, f"peer-{n % 3}", n, clock))
    pool.close()
    pool = make_pool(tmp_path / "p.sqlite3", clock, sampling="paper")  # the level is kept
    level_1 = TaskRef.make("sevens", {"level": 1}, 5, 0).config_json
    prefer = {("sevens", level_1)}
    first = pool.sample(2, random.Random(0), prefer=prefer)
    assert sorted(number(g) % 2 for g in first) == [1, 1]
    rest = pool.sample(3, random.Random(0), prefer=prefer)  # one at level 1 left, then level 0
    assert [number(g) % 2 for g in rest][0] == 1 and sorted(number(g) % 2 for g in rest) == [
        0,
        0,
        1,
    ]
    # The per-author cap counts across both tiers.
    for n in range(6, 10):
        pool.add(*_at(n % 2, "solo", n, clock))
    capped = pool.sample(4, random.Random(1), per_author=1, prefer=prefer)
    assert len(capped) == 2  # "solo" once, and peer-? left from before
    assert sum(g.author == "solo" for g in capped) == 1
