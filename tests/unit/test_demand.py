"""A round's mix (sapo_node/intake/demand.py): J from the own groups' signal, format or skill,
bounded in level and in rise, the need per family, and its state through a checkpoint."""

from __future__ import annotations

import doctest

import pytest

from sapo_node.config import load_config
from sapo_node.intake import demand as mix_module
from sapo_node.intake.demand import (
    MAX_RISE,
    MIN_NEED,
    OwnGroupStats,
    choose_external,
    formatted_share,
    j_from_rate,
)


def test_doctests() -> None:
    assert doctest.testmod(mix_module).failed == 0


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.33, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("most", [0, 1, 4, 8])
def test_j_stays_within_its_bound_and_falls_as_own_signal_rises(rate: float, most: int) -> None:
    j, why = choose_external(2, most, rate, 10)
    assert 0 <= j <= most and str(j) in why
    assert j >= choose_external(2, most, min(1.0, rate + 0.25), 10)[0]


def test_fixed_j_ignores_what_the_node_sees() -> None:
    assert choose_external(3, None, 0.0, 10) == (3, "fixed")
    assert choose_external(3, None, None, 0) == (3, "fixed")


def test_a_node_with_nothing_pooled_takes_nothing() -> None:
    assert choose_external(2, 4, 0.0, 0) == (0, "nothing pooled")


def test_own_rounds_move_the_signal_rate_and_the_need() -> None:
    m = OwnGroupStats()
    flat, mixed = [0.0] * 4, [1.0, 0.0, 0.0, 0.0]
    m.observe([("a", flat), ("a", flat), ("b", mixed), ("b", flat)])
    assert m.signal_rate == 0.25
    assert m.need() == {"a": 1.0, "b": pytest.approx(1 - 1 / 8)}
    for _ in range(30):  # it learns family a: every completion right, no signal left
        m.observe([("a", [1.0] * 4), ("b", mixed)])
    assert m.signal_rate == pytest.approx(0.5, abs=0.01)
    assert m.need()["a"] == MIN_NEED
    m.observe([])  # a round with no own group (J took them all) changes nothing
    assert m.signal_rate == pytest.approx(0.5, abs=0.01)
    again = OwnGroupStats()
    again.load_state_dict(m.state_dict())
    assert again == m
    fresh = OwnGroupStats()
    fresh.load_state_dict({})  # a checkpoint from before the mix was kept
    assert fresh == OwnGroupStats()


def test_the_format_rate_chooses_j_when_asked_and_survives_a_checkpoint() -> None:
    m = OwnGroupStats()
    flat = [0.0] * 4
    assert m.own_rate("format") == (None, "own finished completions in the answer format")
    m.observe([("a", flat)], format_rate=0.25)
    assert m.format_rate == 0.25 and m.signal_rate == 0.0
    assert choose_external(2, 4, m.own_rate("format")[0], 10)[0] == 3
    for _ in range(30):  # it learns the format; its groups still have no signal
        m.observe([("a", flat)], format_rate=1.0)
    rate, what = m.own_rate("format")
    assert rate == pytest.approx(1.0, abs=0.01)
    assert choose_external(2, 4, rate, 10, what) == (
        0,
        f"own finished completions in the answer format {rate:.2f}: J 0 of at most 4",
    )
    assert choose_external(2, 4, m.own_rate("signal")[0], 10)[0] == 4  # by signal: take all
    m.observe([], format_rate=0.0)  # a round with no own group changes nothing
    assert m.format_rate == rate
    again = OwnGroupStats()
    again.load_state_dict(m.state_dict())
    assert again == m


@pytest.mark.parametrize("by", ["format", "skill"])
def test_a_rule_that_measures_own_groups_must_leave_one(by: str) -> None:
    train = {"local_groups": 2, "external_groups": 2, "external_by": by}
    with pytest.raises(ValueError, match="needs external_max \\(4\\) below"):
        load_config(overrides={"train": {**train, "external_max": 4}}, environ={})
    assert load_config(overrides={"train": {**train, "external_max": 3}}, environ={})
    fixed = {**train, "external_by": "fixed", "external_max": 4}
    assert load_config(overrides={"train": fixed}, environ={}).train.external_max == 4
    signal = {**train, "external_by": "signal", "external_max": 4}  # as past runs' files say
    assert load_config(overrides={"train": signal}, environ={}).train.j_bound() == 3
    with pytest.raises(ValueError, match="must be at most local_groups"):
        load_config(overrides={"train": {**signal, "external_max": 5}}, environ={})


def test_j_by_signal_never_takes_the_last_own_group_so_its_rate_moves_again() -> None:
    """With no own group a round measures nothing: J by signal, once at I + J, stayed
    there for as long as the pool could fill it. Now a round keeps an own group, and
    when the node's own groups gain signal, J falls."""
    train = load_config(overrides={"train": {"external_by": "signal"}}, environ={}).train
    total = train.local_groups + train.external_groups
    m, js = OwnGroupStats(), []
    for r in range(30):
        j, _ = choose_external(train.external_groups, train.j_bound(), m.signal_rate, 10)
        own = total - j
        assert own >= 1, f"round {r}: J {j} leaves no own group"
        m.observe([("a", [0.0, 1.0] if r >= 5 else [0.0, 0.0])] * own)
        js.append(j)
    assert js[4] == train.j_bound() and js[-1] == 0


@pytest.mark.parametrize("most", [1, 2, 3, 4, 7])
def test_j_bands_round_halves_up_alike(most: int) -> None:
    """At every rate where most x (1 - rate) is a half, J is the upper neighbour (Python's
    round sends halves to the even one: the bands' ends alternated)."""
    for j in range(most):
        rate = 1.0 - (j + 0.5) / most
        assert choose_external(2, most, rate, 10)[0] == j + 1
        assert j_from_rate(most, rate + 1e-6) == j
    assert [j_from_rate(most, r / 100) for r in range(101)] == sorted(
        (j_from_rate(most, r / 100) for r in range(101)), reverse=True
    )


def test_j_rises_by_at_most_one_a_round_and_falls_at_once() -> None:
    """A rate that drops at once (a peer shaping what this node writes, say) moves J up
    one step a round; a rate that rises takes J down in one round."""
    m, js = OwnGroupStats(), []
    m.observe([("a", [0.0])], format_rate=1.0)
    for r in range(6):
        if r == 1:
            m.format_rate = 0.0
        j, why = choose_external(2, 3, m.format_rate, 10, "x", previous=m.last_j)
        m.chose(j, 10)
        js.append(j)
    assert js == [0, 1, 2, 3, 3, 3] and MAX_RISE == 1
    m.format_rate = 1.0
    assert choose_external(2, 3, m.format_rate, 10, previous=m.last_j)[0] == 0
    m.chose(0, 0)  # nothing pooled: nothing chosen, the bound still rises from 3
    assert m.last_j == 3
    assert "rising by at most 1" in choose_external(2, 3, 0.0, 10, previous=1)[1]


def test_the_format_rate_counts_finished_completions_only() -> None:
    """A completion cut at the token limit says nothing about the format."""
    assert formatted_share([(True, True), (True, False), (False, False), (False, False)]) == 0.5
    assert formatted_share([(False, False)] * 3) is None
    m = OwnGroupStats()
    m.observe([("a", [0.0])], format_rate=0.5)
    m.observe([("a", [0.0])], format_rate=None)  # nothing finished: the rate holds
    assert m.format_rate == 0.5


def test_skill_is_kept_per_family_and_level_and_reopens_j_after_a_level_up() -> None:
    m = OwnGroupStats()
    weights = {"a": 1.0, "b": 1.0}
    levels = {"a": 0, "b": 0}
    assert m.own_rate("skill", levels, weights) == (0.0, "own reward at the current levels")
    for _ in range(40):  # both families solved at level 0
        m.observe([("a", [1.0, 1.0]), ("b", [1.0, 1.0])], levels=levels)
        j, _ = choose_external(2, 3, m.own_rate("skill", levels, weights)[0], 10)
        m.chose(j, 10)
    assert j == 0 and m.skill[("a", 0)] == pytest.approx(1.0, abs=1e-3)
    levels = {"a": 1, "b": 0}  # the curriculum moved a up: nothing shown there yet
    rate, what = m.own_rate("skill", levels, weights)
    assert rate == pytest.approx(0.5, abs=1e-3)
    assert choose_external(2, 3, rate, 10, what, previous=m.last_j)[0] == 1  # rising
    assert j_from_rate(3, rate) == 2
    m.observe([("a", [0.0, 0.5])], levels=levels)  # from no skill, not from level 0's
    assert m.skill[("a", 1)] == pytest.approx(0.2 * 0.25)
    again = OwnGroupStats()
    again.load_state_dict(m.state_dict())
    assert again == m and again.skill[("a", 1)] == m.skill[("a", 1)]


def test_the_default_j_is_chosen_by_format_up_to_one_below_i_plus_j() -> None:
    """The defaults (docs/results/families-confirm-cpu/): J by the answer format, up to 3
    of 2 + 2; the bound follows I + J when unset, J = 0 takes nothing whatever the rule,
    and "fixed" keeps J at external_groups."""

    def train(**t):
        return load_config(overrides={"train": t}, environ={}).train

    assert (train().external_by, train().j_bound()) == ("format", 3)
    assert train(local_groups=4, external_groups=4).j_bound() == 7
    assert train(local_groups=1, external_groups=1).j_bound() == 1
    assert train(external_by="signal").j_bound() == 3  # an own group left to measure
    assert train(external_by="skill").j_bound() == 3
    assert train(external_by="fixed").j_bound() is None
    assert train(local_groups=4, external_groups=0).j_bound() is None  # --external 0: alone
    with pytest.raises(ValueError, match="needs external_groups above 0"):
        train(local_groups=4, external_groups=0, external_max=2)
    with pytest.raises(ValueError, match="external_by = 'fixed'"):
        train(local_groups=1, external_groups=1, external_max=3)
    assert train(local_groups=1, external_groups=1, external_max=3, external_by="fixed")


def test_first_choices_by_default_are_moot_without_answer_only_and_refused_if_set() -> None:
    off = load_config(overrides={"defence": {"answer_only": False}}, environ={}).defence
    assert off.teach_first_choices and not off.answer_only  # every token teaches anyway
    with pytest.raises(ValueError, match="teach_first_choices widens what answer_only"):
        load_config(
            overrides={"defence": {"answer_only": False, "teach_first_choices": True}},
            environ={},
        )
