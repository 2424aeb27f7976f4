"""metrics.py: the names of a metrics row, and rows written in the names before 0.3.0
read in the current ones (upgrade, read_metrics, history.py, the swarm view)."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

from sapo_node import metrics
from sapo_node.local_swarm import read_last_record
from sapo_node.metrics import RENAMED, read_metrics, upgrade
from sapo_node.ops.history import History

# A round as 0.2.0 wrote it (docs/results/ hold hundreds of such rows) ...
OLD = {
    "round": 7,
    "time": 1733300000.5,
    "reward_mean": 0.25,
    "cumulative_reward": 1.75,
    "local_groups": 2,
    "external_groups": 2,
    "groups_trained": 3,
    "external_reward_mean": 0.5,
    "external_tokens_taught": 0.75,
    "local_groups_all_wrong": 1,
    "local_groups_all_right": 0,
    "local_groups_signal": 1,
    "external_groups_all_wrong": 0,
    "external_groups_all_right": 0,
    "external_groups_signal": 2,
    "answer_tag_rate": 0.875,
    "pool_size": 12,
    "pool_mb": 0.5,
    "reward/basic_arithmetic": 0.25,
    "reward/tests.support.families:Sevens": 0.0,
    "level/basic_arithmetic": 1,
    "curriculum_moves": {"basic_arithmetic": 1},
    "t_generate": 4.0,
    "t_score": 0.5,
    "t_train": 3.0,
    "t_round": 8.0,
    "new_tokens": 512,
    "tokens_per_s": 128.0,
    "train/loss": -0.01,
    "train/steps": 1,
    "train/grad_norm": None,
    "peak_rss_mb": 900.0,
    "peak_gpu_mb": 0.0,
    "defence/completions_checked": 16,
    "external_age_s": 30.0,
    "external_age_s_max": 45.0,
    "external_age_rounds": 1.5,
    "external_age_rounds_max": 2,
    "peers": 3,
    "groups_published": 2,
    "groups_received": 6,
    "groups_accepted": 5,
    "groups_rejected": 1,
    "groups_dropped": 0,
    "groups_unsent": 0,
    "bytes_in": 4096,
    "bytes_out": 2048,
    "peer_groups/accepted": 5,
    "peer_groups/too_old": 1,
    "eval/pass1": 0.5,
    "eval/greedy": 0.5,
    "eval/answer_tag_rate": 1.0,
    "eval/pass1/basic_arithmetic": 0.5,
}
# ... and the same round in the current names.
NEW = {
    "round": 7,
    "time": 1733300000.5,
    "reward/mean": 0.25,
    "reward/cumulative": 1.75,
    "groups/local": 2,
    "groups/external": 2,
    "groups/trained": 3,
    "reward/external_mean": 0.5,
    "groups/external_tokens_taught": 0.75,
    "groups/local_all_wrong": 1,
    "groups/local_all_right": 0,
    "groups/local_signal": 1,
    "groups/external_all_wrong": 0,
    "groups/external_all_right": 0,
    "groups/external_signal": 2,
    "rollout/answer_tag_rate": 0.875,
    "pool/groups": 12,
    "pool/mb": 0.5,
    "family_reward/basic_arithmetic": 0.25,
    "family_reward/tests.support.families:Sevens": 0.0,
    "family_level/basic_arithmetic": 1,
    "curriculum/moves": {"basic_arithmetic": 1},
    "phase_s/generate": 4.0,
    "phase_s/score": 0.5,
    "phase_s/train": 3.0,
    "phase_s/round": 8.0,
    "rollout/new_tokens": 512,
    "rollout/tokens_per_s": 128.0,
    "train/loss": -0.01,
    "train/steps": 1,
    "train/grad_norm": None,
    "memory/peak_rss_mb": 900.0,
    "memory/peak_gpu_mb": 0.0,
    "defence/completions_checked": 16,
    "groups/external_age_s": 30.0,
    "groups/external_age_s_max": 45.0,
    "groups/external_age_rounds": 1.5,
    "groups/external_age_rounds_max": 2,
    "net/peers": 3,
    "net/published": 2,
    "net/received": 6,
    "net/accepted": 5,
    "net/rejected": 1,
    "net/dropped": 0,
    "net/unsent": 0,
    "net/bytes_in": 4096,
    "net/bytes_out": 2048,
    "peer_groups/accepted": 5,
    "peer_groups/too_old": 1,
    "eval/pass1": 0.5,
    "eval/greedy": 0.5,
    "eval/answer_tag_rate": 1.0,
    "eval/pass1/basic_arithmetic": 0.5,
}


def test_doctests() -> None:
    assert doctest.testmod(metrics).failed == 0


def test_an_old_row_becomes_exactly_the_new_row() -> None:
    up = upgrade(OLD)
    assert up == NEW
    assert list(up) == list(NEW)  # in the same order
    assert OLD["reward_mean"] == 0.25 and "reward/mean" not in OLD  # the input is kept


def test_a_new_row_is_left_as_it_is() -> None:
    assert upgrade(NEW) is NEW
    assert upgrade({"round": 0}) == {"round": 0}
    # a new row's own keys are never read as old ones: new rows have no reward_mean
    assert upgrade({"round": 0, "reward/mean": 0.5, "family_reward/x": 0.5}) == {
        "round": 0,
        "reward/mean": 0.5,
        "family_reward/x": 0.5,
    }


def test_every_new_name_fits_the_scheme() -> None:
    for key in [*NEW, *RENAMED.values()]:
        if key in ("round", "time"):
            continue
        concern, _, name = key.partition("/")
        assert concern and name and concern == concern.lower(), key
        assert " " not in key and "-" not in concern, key
    assert "reward_mean" in RENAMED  # the mark of an old row is among the renamed


def _mixed(path: Path) -> None:
    """A node resumed on an old data dir: old rows, then new ones, and a torn line."""
    with path.open("w") as f:
        for r in range(3):
            f.write(json.dumps(OLD | {"round": r, "reward_mean": r / 10}) + "\n")
        for r in range(3, 5):
            f.write(json.dumps(NEW | {"round": r, "reward/mean": r / 10}) + "\n")
        f.write('{"round": 5, "rew')


def test_a_file_mixing_both_reads_as_new_rows(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _mixed(path)
    rows = read_metrics(path)
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["reward/mean"] for r in rows] == [0.0, 0.1, 0.2, 0.3, 0.4]
    for r in rows:
        assert set(r) == set(NEW), r["round"]


def test_history_and_the_swarm_view_read_a_mixed_file_in_the_new_names(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _mixed(path)
    s = History(path).series(window=2)
    assert s["round"] == [0, 1, 2, 3, 4]
    assert s["series"]["reward/mean"] == [0.0, 0.1, 0.2, 0.3, 0.4]
    assert s["series"]["reward_ma"] == pytest.approx([0.0, 0.05, 0.15, 0.25, 0.35])
    assert s["series"]["net/peers"] == [3.0] * 5
    assert s["series"]["phase_s/round"] == [8.0] * 5
    assert s["series"]["family_level/basic_arithmetic"] == [1.0] * 5
    assert not any(k in s["series"] for k in ("reward_mean", "t_round", "level/basic_arithmetic"))
    with path.open("w") as f:  # the last whole row is an old one
        f.write(json.dumps(OLD) + "\n")
    assert read_last_record(path) == NEW
