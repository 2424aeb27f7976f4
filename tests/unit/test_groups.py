"""groups.stratified and training_set's sample of a peer's group
(``train.external_completions``): which completions train, and with what weight."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from sapo_node.config import load_config
from sapo_node.groups import Group, stratified, training_set


def test_every_reward_keeps_a_completion_and_the_weights_add_up_to_the_group() -> None:
    rewards = [1.0] + [0.0] * 7
    for seed in range(50):
        got = stratified(rewards, 4, random.Random(seed))
        assert len(got) == 4
        assert 0 in got and got[0] == 1.0  # the only right one, always, for itself
        assert all(got[i] == pytest.approx(7 / 3) for i in got if i != 0)
        assert sum(got.values()) == pytest.approx(8)


def test_the_rest_of_k_goes_to_the_rewards_by_their_share() -> None:
    got = stratified([1.0] * 4 + [0.0] * 4, 4, random.Random(0))
    assert Counter(i < 4 for i in got) == {True: 2, False: 2}
    assert set(got.values()) == {2.0}
    got = stratified([1.0] * 6 + [0.0] * 2, 4, random.Random(0))
    assert Counter(i < 6 for i in got) == {True: 3, False: 1}
    assert set(got.values()) == {2.0}  # 6 / 3 right, 2 / 1 wrong


def test_each_completion_weighs_one_in_expectation() -> None:
    """The sample's gradient is the group's in expectation: every completion's expected
    weight is 1 (probability of being drawn times the weight it then carries)."""
    for rewards in ([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], [0.5, 0.0, 1.0, 0.0, 0.0, 1.0]):
        for k in (2, 3, 5):
            draws = 20_000
            total = Counter()
            rng = random.Random(1)
            for _ in range(draws):
                total.update(stratified(rewards, k, rng))
            for i in range(len(rewards)):
                assert total[i] / draws == pytest.approx(1.0, abs=0.05), (rewards, k, i)


def test_small_groups_train_whole_and_more_rewards_than_k_sample_uniformly() -> None:
    assert stratified([1.0, 0.0, 0.0], 4, random.Random(0)) == {0: 1.0, 1: 1.0, 2: 1.0}
    got = stratified([0.0, 0.25, 0.5, 0.75, 1.0, 1.0], 2, random.Random(0))
    assert len(got) == 2 and set(got.values()) == {3.0}


def test_the_draw_is_the_rngs() -> None:
    rewards = [1.0, 0.0] * 4
    assert stratified(rewards, 3, random.Random(7)) == stratified(rewards, 3, random.Random(7))
    draws = {tuple(stratified(rewards, 3, random.Random(s))) for s in range(20)}
    assert len(draws) > 1


def _group(origin: str) -> Group:
    ids = [[10 + i, 20] for i in range(8)]
    rewards = [1.0, 1.0] + [0.0] * 6
    return Group(None, [1], ids, ["t"] * 8, [True] * 8, rewards, origin=origin)


def test_only_peers_groups_are_sampled_and_the_batch_counts_them_whole() -> None:
    own, theirs = _group("local"), _group("peer-a")
    whole = training_set([own, theirs], "std")
    part = training_set([own, theirs], "std", external_completions=4, rng=random.Random(3))
    assert (part.batch_rows, part.batch_tokens) == (whole.batch_rows, whole.batch_tokens)
    assert len(whole.samples) == 16 and len(part.samples) == 8 + 4
    own_samples, peer_samples = part.samples[:8], part.samples[8:]
    assert all(s.weight == 1.0 for s in own_samples)
    assert sum(s.weight for s in peer_samples) == pytest.approx(8)
    advantage = {tuple(s.completion_ids): s.advantage for s in whole.samples[8:]}
    assert all(s.advantage == advantage[tuple(s.completion_ids)] for s in peer_samples)


def test_one_external_completion_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="external_completions must be 0 .* or at least 2"):
        load_config(overrides={"train": {"external_completions": 1}}, environ={})
    assert load_config(overrides={"train": {"external_completions": 4}}, environ={})
