from __future__ import annotations

import pytest

from sapo_node.config import CurriculumSection, FamilySection
from sapo_node.curriculum import Curriculum, reasoning_gym_levels
from sapo_node.tasks import PAPER_FAMILIES, make_task

LEVELS = [{"max_digits": 1}, {"max_digits": 2}, {"max_digits": 3}]


def _curriculum(window: int = 4, **kw) -> Curriculum:
    fam = FamilySection(name="basic_arithmetic", levels=LEVELS, config={"max_terms": 2}, **kw)
    return Curriculum([fam], CurriculumSection(window=window, raise_above=0.75, lower_below=0.0))


def test_level_rises_when_mastered_and_falls_when_nothing_is_right() -> None:
    c = _curriculum()
    assert c.record("basic_arithmetic", [1, 1, 1]) == 0  # window not full yet
    assert c.record("basic_arithmetic", [1]) == 1
    assert c.level["basic_arithmetic"] == 1
    assert c.config_for("basic_arithmetic") == {"max_terms": 2, "max_digits": 2}
    assert c.record("basic_arithmetic", [0, 1, 0, 0]) == 0  # in between: stay
    assert c.record("basic_arithmetic", [0, 0, 0, 0]) == -1  # window slid to all zeros
    assert c.level["basic_arithmetic"] == 0
    assert c.record("basic_arithmetic", [0, 0, 0, 0]) == 0  # already at the bottom


def test_level_stays_at_the_top() -> None:
    c = _curriculum(start_level=2)
    assert c.record("basic_arithmetic", [1, 1, 1, 1]) == 0
    assert c.level["basic_arithmetic"] == 2


def test_disabled_curriculum_never_moves() -> None:
    fam = FamilySection(name="basic_arithmetic", levels=LEVELS)
    c = Curriculum([fam], CurriculumSection(enabled=False, window=1))
    assert c.record("basic_arithmetic", [1.0]) == 0


def test_state_round_trip() -> None:
    a = _curriculum()
    a.record("basic_arithmetic", [1, 1, 1, 1])
    a.record("basic_arithmetic", [0.5])
    b = _curriculum()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()


def test_sampling_is_reproducible_and_weighted() -> None:
    fams = [
        FamilySection(name="basic_arithmetic", weight=3.0),
        FamilySection(name="bf"),
        FamilySection(name="arc_1d", weight=0.0),
    ]
    c = Curriculum(fams, CurriculumSection())
    refs = c.sample(seed=11, round_=5, count=400)
    assert refs == c.sample(seed=11, round_=5, count=400)
    assert refs != c.sample(seed=11, round_=6, count=400)
    names = [r.family for r in refs]
    assert "arc_1d" not in names
    assert 0.65 < names.count("basic_arithmetic") / len(names) < 0.85
    assert len({(r.seed, r.index) for r in refs}) == len(refs)


@pytest.mark.parametrize("family", PAPER_FAMILIES)
def test_reasoning_gym_levels_make_valid_tasks(family: str) -> None:
    levels = reasoning_gym_levels(family)
    assert len(levels) >= 2
    c = Curriculum([FamilySection(name=family)], CurriculumSection())
    for level in (0, len(levels) - 1):
        c.level[family] = level
        task = make_task(c.sample(seed=3, round_=level, count=1)[0])
        assert task.question
