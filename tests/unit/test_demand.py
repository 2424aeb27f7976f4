"""A round's mix (sapo_node/intake/demand.py): J from the own groups' signal, the need per family,
and its state through a checkpoint."""

from __future__ import annotations

import doctest

import pytest

from sapo_node.config import load_config
from sapo_node.intake import demand as mix_module
from sapo_node.intake.demand import MIN_NEED, Mix, choose_external


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
    m = Mix()
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
    again = Mix()
    again.load_state_dict(m.state_dict())
    assert again == m
    fresh = Mix()
    fresh.load_state_dict({})  # a checkpoint from before the mix was kept
    assert fresh == Mix()


def test_the_format_rate_chooses_j_when_asked_and_survives_a_checkpoint() -> None:
    m = Mix()
    flat = [0.0] * 4
    assert m.own_rate("format") == (None, "own completions in the answer format")
    m.observe([("a", flat)], format_rate=0.25)
    assert m.format_rate == 0.25 and m.signal_rate == 0.0
    assert choose_external(2, 4, m.own_rate("format")[0], 10)[0] == 3
    for _ in range(30):  # it learns the format; its groups still have no signal
        m.observe([("a", flat)], format_rate=1.0)
    rate, what = m.own_rate("format")
    assert rate == pytest.approx(1.0, abs=0.01)
    assert choose_external(2, 4, rate, 10, what) == (
        0,
        f"own completions in the answer format {rate:.2f}: J 0 of at most 4",
    )
    assert choose_external(2, 4, m.own_rate("signal")[0], 10)[0] == 4  # by signal: take all
    m.observe([], format_rate=0.0)  # a round with no own group changes nothing
    assert m.format_rate == rate
    again = Mix()
    again.load_state_dict(m.state_dict())
    assert again == m


def test_j_by_format_must_leave_an_own_group_to_measure() -> None:
    train = {"local_groups": 2, "external_groups": 2, "external_by": "format"}
    with pytest.raises(ValueError, match="needs external_max \\(4\\) below"):
        load_config(overrides={"train": {**train, "external_max": 4}}, environ={})
    assert load_config(overrides={"train": {**train, "external_max": 3}}, environ={})
    signal = load_config(
        overrides={"train": {**train, "external_by": "signal", "external_max": 4}}, environ={}
    )
    assert signal.train.external_max == 4


def test_the_default_j_is_chosen_by_format_up_to_one_below_i_plus_j() -> None:
    """The defaults (docs/results/families-confirm-cpu/): J by the answer format, up to 3
    of 2 + 2; the bound follows I + J when unset, J = 0 takes nothing whatever the rule,
    and "fixed" keeps J at external_groups."""

    def train(**t):
        return load_config(overrides={"train": t}, environ={}).train

    assert (train().external_by, train().j_bound()) == ("format", 3)
    assert train(local_groups=4, external_groups=4).j_bound() == 7
    assert train(local_groups=1, external_groups=1).j_bound() == 1
    assert train(external_by="signal").j_bound() == 4
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
