"""The experiment's analysis on known inputs: pure functions of metrics and evaluations."""

from __future__ import annotations

import doctest
import importlib
import json

import pytest

from sapo_node.experiment import (
    OUTCOMES,
    Deferred,
    ExperimentSpec,
    analyse,
    eval_due,
    node_summary,
    render_table,
)


def _eval(round_: int, greedy: list[int], pass1: list[float]) -> dict:
    return {
        "round": round_,
        "eval/greedy": sum(greedy) / len(greedy),
        "eval/pass1": sum(pass1) / len(pass1),
        "eval/answer_tag_rate": 1.0,
        "eval/per_task_greedy": greedy,
        "eval/per_task_pass1": pass1,
    }


def _node(rewards: list[float], end_greedy: list[int]) -> dict:
    rows = [
        {"round": r, "reward/mean": x, "rollout/new_tokens": 10, "phase_s/round": 2.0}
        for r, x in enumerate(rewards)
    ]
    evals = [_eval(0, [0, 0], [0.0, 0.0]), _eval(len(rewards), end_greedy, [0.5, 0.5])]
    return node_summary(rows, evals, len(rewards))


def test_analysis_of_known_runs() -> None:
    spec = ExperimentSpec.model_validate(
        {"experiment": {"nodes": 4, "rounds": 2, "grid": ["2/0", "1/1"]}}
    )
    base = [_node([0.1, 0.1], [0, 0]) for _ in range(4)]
    shared = [_node([0.2, 0.3], [1, 1]) for _ in range(4)]
    results = analyse(spec, {"2/0": base, "1/1": shared})
    b, s = results["configurations"]
    assert b["cumulative_reward"] == pytest.approx(0.8)
    assert s["cumulative_reward"] == pytest.approx(2.0)
    assert s["ratio"] == pytest.approx(2.5) and b["ratio"] == pytest.approx(1.0)
    assert s["p_reward"] == 0.125 and s["p_heldout"] == 0.125  # every pair better: 2 / 2**4
    assert s["diff_reward"] == pytest.approx([0.3] * 4)
    assert b["new_tokens"] == 80 and b["node_seconds"] == 16.0
    assert s["heldout_end"]["greedy"] == 1.0 and s["heldout_end"]["cells"] == 8
    lo, hi = s["heldout_end"]["greedy_ci95"]
    assert hi == 1.0 and lo == pytest.approx(0.6756, abs=1e-3)  # Wilson, 8 of 8
    assert s["heldout_end"]["pass1_ci95"] == [0.5, 0.5]
    assert b["heldout_start"]["greedy"] == 0.0
    # every node starts as the same model: its 2 answers count once, not 4 times
    assert b["heldout_start"]["cells"] == 2 and b["heldout_start"]["models"] == 1
    assert s["heldout_end"]["models"] == 4  # trained nodes are distinct models
    assert results["smallest_p"] == 0.125 and b["complete"] and s["complete"]
    table = render_table(results)
    assert "| 1/1 | paper | 2.00 | 2.50x | 0.125 |" in table
    assert "smallest possible p is 0.125" in table


def test_j_left_unfilled_for_expiry_is_summed_and_said() -> None:
    """Issue 47: rounds whose J went unfilled because peers' groups expired are counted
    per configuration and named under the table; none, no such line."""
    spec = ExperimentSpec.model_validate(
        {"experiment": {"nodes": 2, "rounds": 2, "grid": ["2/0", "1/1"]}}
    )
    base = [_node([0.1, 0.1], [0, 0]) for _ in range(2)]
    rows = [
        {"round": r, "reward/mean": 0.2, "train/j_unfilled_expired": n}
        for r, n in enumerate([1, 2])
    ]
    evals = [_eval(0, [0, 0], [0.0, 0.0]), _eval(2, [1, 1], [0.5, 0.5])]
    shared = [node_summary(rows, evals, 2), _node([0.2, 0.3], [1, 1])]
    results = analyse(spec, {"2/0": base, "1/1": shared})
    b, s = results["configurations"]
    assert b["j_unfilled_expired"] == 0 and s["j_unfilled_expired"] == 3
    table = render_table(results)
    assert "J not as configured" in table and "1/1 3 slots" in table
    assert "J not as configured" not in render_table(analyse(spec, {"2/0": base}))


def test_replicates_halves_and_the_preregistered_verdict() -> None:
    spec = ExperimentSpec.model_validate(
        {"experiment": {"nodes": 2, "replicates": 2, "rounds": 4, "grid": ["2/0", "1/1"]}}
    )
    base = [_node([0.1] * 4, [0, 0]) for _ in range(4)]
    # replicate 0 gains in the first half only, replicate 1 in both halves
    shared = [_node([0.2, 0.2, 0.1, 0.1], [0, 0]) for _ in range(2)]
    shared += [_node([0.2, 0.2, 0.2, 0.2], [0, 0]) for _ in range(2)]
    results = analyse(spec, {"2/0": base, "1/1": shared})
    s = results["configurations"][1]
    assert s["by_replicate"] == [pytest.approx(1.5), pytest.approx(2.0)]
    first, second = s["by_half"]
    assert first["rounds"] == [0, 1] and first["ratio"] == pytest.approx(2.0)
    assert first["p"] == 0.125 and first["pairs_favouring"] == 4
    assert second["ratio"] == pytest.approx(1.5) and second["pairs_favouring"] == 2
    # 4 pairs cannot reach p < 0.05: no verdict either way
    assert s["conclusion"] == "no detectable difference"
    table = render_table(results)
    assert "| 1/1 | paper | 1.50x, 2.00x | 2.00x (0.125, 4 of 4) | 1.50x (" in table
    assert table.rstrip().count("no detectable difference |") == 1


def test_incomplete_configurations_are_marked() -> None:
    spec = ExperimentSpec.model_validate(
        {"experiment": {"nodes": 1, "rounds": 3, "grid": ["2/0", "1/1"]}}
    )
    rows = [{"round": 0, "reward/mean": 0.5, "rollout/new_tokens": 1, "phase_s/round": 1.0}]
    partial = node_summary(rows, [_eval(0, [1], [1.0])], 3)
    results = analyse(spec, {"2/0": [partial]})
    (c,) = results["configurations"]
    assert not c["complete"] and c["rounds_done"] == 1 and c["heldout_end"] is None
    assert "(1 rounds)" in render_table(results)


def _row(
    round_: int,
    local: tuple[int, int, int],
    external: tuple[int, int, int] = (0, 0, 0),
    reward: float | None = None,
    age: float | None = None,
    steps: int = 1,
    clipped: float | None = None,
    norm: float | None = None,
) -> dict:
    """A metrics row with the facts of sharing: group counts (all wrong, all right,
    signal), the peers' groups' reward and age in rounds, the round's steps and clip."""
    row = {
        "round": round_,
        "reward/mean": 0.1,
        "groups/local": sum(local),
        "groups/external": sum(external),
        "reward/external_mean": reward,
        "train/steps": steps,
        "train/grad_clipped": clipped,
        "train/grad_norm_max": norm,
    }
    for side, counts in (("local", local), ("external", external)):
        row |= {f"groups/{side}_{k}": n for k, n in zip(OUTCOMES, counts, strict=True)}
    if age is not None:
        row["groups/external_age_rounds"] = age
    return row


def test_the_facts_of_sharing_are_tabulated_per_half_of_the_run() -> None:
    spec = ExperimentSpec.model_validate(
        {"experiment": {"nodes": 2, "rounds": 4, "grid": ["2/0", "1/1"]}}
    )
    later = [
        _row(2, (2, 0, 0), (1, 0, 1), reward=0.25, age=0.5, steps=0),  # no step
        _row(3, (0, 0, 2), (0, 0, 3), reward=0.75, age=2.0, clipped=1.0, norm=3.0),
    ]
    first = [
        _row(0, (1, 0, 1), clipped=1.0, norm=2.0),  # no peers' group yet
        _row(1, (0, 1, 1), (0, 0, 1), reward=0.5, age=1.0, clipped=0.0, norm=0.5),
    ]
    other = [_row(0, (0, 0, 2), steps=2, clipped=0.5, norm=1.0), first[1]]  # 2 steps, 1 clipped
    shared = [node_summary(first + later, [], 4), node_summary(other + later, [], 4)]
    old = [{"round": r, "reward/mean": 0.1} for r in range(4)]  # metrics without the facts
    alone = [node_summary(old, [], 4) for _ in range(2)]
    results = analyse(spec, {"2/0": alone, "1/1": shared})
    json.dumps(results, allow_nan=False)
    base, s = results["configurations"]
    one, two = s["mechanism"]
    assert one == {
        "rounds": [0, 1],
        "local_groups": 8,
        "local_all_wrong": 1 / 8,
        "local_all_right": 2 / 8,
        "local_signal": 5 / 8,
        "external_groups": 2,
        "external_all_wrong": 0.0,
        "external_all_right": 0.0,
        "external_signal": 1.0,
        "external_reward": 0.5,
        "steps": 5,
        "clipped": 2 / 5,  # of steps, not of rounds
        "grad_norm": pytest.approx(1.0),  # (2.0 + 0.5 + 1.0 + 0.5) / 4 rounds with a step
        "age_rounds": 1.0,
    }
    assert two["rounds"] == [2, 3] and two["local_groups"] == 8 and two["external_groups"] == 10
    assert [two[f"local_{k}"] for k in OUTCOMES] == [0.5, 0.0, 0.5]
    assert [two[f"external_{k}"] for k in OUTCOMES] == [0.2, 0.0, 0.8]
    # weighted by the rounds' peers' groups: (2 x 0.25 + 3 x 0.75) / 5, not (0.25 + 0.75) / 2
    assert two["external_reward"] == pytest.approx(0.55)
    assert two["age_rounds"] == pytest.approx(1.4)  # (2 x 0.5 + 3 x 2.0) / 5
    assert two["steps"] == 2 and two["clipped"] == 1.0 and two["grad_norm"] == 3.0
    for m in base["mechanism"]:  # nothing measured: None, not 0
        assert m["local_groups"] == m["external_groups"] == m["steps"] == 0
        assert {k: v for k, v in m.items() if v is not None} == {
            "rounds": m["rounds"],
            "local_groups": 0,
            "external_groups": 0,
            "steps": 0,
        }
    table = render_table(results)
    assert (
        "| 1/1 | paper | 0-1 | 12.5% / 25.0% / 62.5% | 0.0% / 0.0% / 100.0% | 0.500 | 40.0% "
        "| 1.00 | 1.00 |" in table
    )
    assert (
        "| 1/1 | paper | 2-3 | 50.0% / 0.0% / 50.0% | 20.0% / 0.0% / 80.0% | 0.550 | 100.0% "
        "| 3.00 | 1.40 |" in table
    )
    assert "| 2/0 | paper | 2-3 | – | – | – | – | – | – |" in table


def test_halves_of_an_odd_run_and_rows_past_it() -> None:
    rows = [_row(r, (1, 0, 0)) for r in range(6)]  # round 5 is past a 5-round run
    s = node_summary(rows, [], 5)
    assert [h["local_all_wrong"] for h in s["halves"]] == [2, 3]


@pytest.mark.parametrize("module", ["spec", "analysis", "report", "runner"])
def test_doctests(module: str) -> None:
    assert doctest.testmod(importlib.import_module(f"sapo_node.experiment.{module}")).failed == 0


def test_eval_schedule() -> None:
    spec = ExperimentSpec.model_validate({"experiment": {"rounds": 10}, "eval": {"every": 4}})
    assert [r for r in range(11) if eval_due(spec, r)] == [0, 4, 8, 10]


class _Sink:
    peer_id = "x"

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.inbox: list = []

    def publish(self, data: bytes) -> bool:
        self.sent.append(data)
        return True

    def received(self):
        out, self.inbox = self.inbox, []
        return out

    def _arrive(self, item) -> None:
        self.inbox.append(item)


def test_lockstep_barrier_holds_parks_and_restores(tmp_path) -> None:
    sink = _Sink()
    t = Deferred(sink, lambda: 7.0)
    t.round = 0
    t.publish(b"a")
    t.round = 1
    t.publish(b"b")
    t.flush(0)
    assert sink.sent == [b"a"]  # round 1's message waits for round 1's barrier
    t.discard(1)
    t.publish(b"c")
    from sapo_node.net import Received

    sink._arrive(Received(b"in", "peer"))
    t.park(tmp_path / "p.json")
    again = Deferred(_Sink(), lambda: 7.0)
    again.unpark(tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()
    # what it delivers arrives on the experiment's clock, when the node takes it in
    assert [(m.data, m.received_at) for m in again.received()] == [(b"in", 7.0)]
    again.flush(1)
    assert again.inner.sent == [b"c"]


def test_reward_per_compute_second_is_paired_by_node_seed() -> None:
    spec = ExperimentSpec.model_validate(
        {"experiment": {"nodes": 4, "rounds": 2, "grid": ["2/0", "1/1"]}}
    )

    def node(rewards: list[float], compute: float, sequences: int) -> dict:
        rows = [
            {"round": r, "reward/mean": x, "compute_s": compute, "train/sequences": sequences}
            for r, x in enumerate(rewards)
        ]
        evals = [_eval(0, [0, 0], [0.0, 0.0]), _eval(2, [0, 1], [0.5, 0.5])]
        return node_summary(rows, evals, 2)

    base = [node([0.1, 0.1], 1.0, 8) for _ in range(4)]
    # twice the reward per round at four times the compute: half the reward per second
    shared = [node([0.2, 0.2], 4.0, 24) for _ in range(4)]
    b, s = analyse(spec, {"2/0": base, "1/1": shared})["configurations"]
    assert s["ratio"] == pytest.approx(2.0)
    assert b["compute_seconds"] == 8.0 and s["compute_seconds"] == 32.0
    assert s["reward_per_compute_s"] == pytest.approx(0.05)
    assert s["ratio_per_compute_s"] == pytest.approx(0.5)
    assert s["p_reward_per_compute_s"] == 0.125  # every pair worse per second
    assert s["sequences_trained"] == 24.0 and b["sequences_trained"] == 8.0
    table = render_table({"configurations": [b, s], "rounds": 2, "pairs": 4, "smallest_p": 0.125})
    assert (
        "| 1/1 | paper | 32.0 | 180.0 | 0.50x | 0.125 | 0.50x "
        "| no detectable difference | 24.0 | 0 |" in table
    )


def test_rows_without_compute_count_the_wall_seconds_of_the_node_phases() -> None:
    rows = [
        {
            "round": 0,
            "reward/mean": 0.5,
            "phase_s/generate": 2.0,
            "phase_s/train": 1.0,
            "phase_s/round": 9.0,
        }
    ]
    assert node_summary(rows, [], 1)["compute_seconds"] == 3.0


def test_variants_are_configurations_with_their_own_overrides(tmp_path) -> None:
    from sapo_node.experiment.spec import arm, node_config

    spec = ExperimentSpec.model_validate(
        {
            "experiment": {
                "grid": ["4/0", "2/2"],
                "variants": {
                    "2/2 tasks": {"ratio": "2/2", "set": {"train": {"external_use": "tasks"}}}
                },
            }
        }
    )
    a = arm(spec, "2/2 tasks")
    assert (a.local, a.external, a.dirname, a.plain) == (2, 2, "2-2-tasks", False)
    assert node_config(spec, a, 0, tmp_path).train.external_use == "tasks"
    assert node_config(spec, arm(spec, "2/2"), 0, tmp_path).train.external_use == "text"
    with pytest.raises(ValueError, match="name it by its ratio"):
        ExperimentSpec.model_validate(
            {"experiment": {"grid": ["4/0"], "variants": {"tasks": {"ratio": "2/2"}}}}
        )
    with pytest.raises(ValueError, match="external_use"):
        ExperimentSpec.model_validate(
            {
                "experiment": {
                    "grid": ["4/0"],
                    "variants": {"2/2 x": {"set": {"train": {"external_use": "magic"}}}},
                }
            }
        )


def test_the_round_clock_follows_rounds_not_the_machine() -> None:
    from sapo_node.experiment.runner import RoundClock

    clock = RoundClock(30.0)
    start = clock.now()
    clock.round = 11
    assert clock.now() - start == 330.0  # past a 300 s pool age: 11 rounds, on any machine


def _timed(compute: list[float], greedy_at: dict[int, float]) -> dict:
    """A node with these compute-seconds per round and greedy accuracy at these rounds."""
    rows = [
        {"round": r, "reward/mean": 0.5, "compute_s": c, "family_level/a": 1 + (r > 1)}
        for r, c in enumerate(compute)
    ]
    evals = [
        {"round": k, "eval/greedy": g, "eval/pass1": g, "eval/answer_tag_rate": 1.0}
        for k, g in greedy_at.items()
    ]
    return node_summary(rows, evals, len(compute), {"50%": 0.5})


def test_time_to_accuracy_pairs_nodes_and_counts_a_node_that_never_got_there() -> None:
    from sapo_node.experiment.analysis import time_to_accuracy_summary

    fast = _timed([1.0, 2.0, 4.0, 8.0], {0: 0.1, 2: 0.6, 4: 0.7})  # there after 3 s
    never = _timed([1.0, 1.0, 1.0, 1.0], {0: 0.1, 2: 0.2, 4: 0.4})  # 4 s spent, no more
    slow = _timed([2.0, 2.0, 2.0, 2.0], {0: 0.1, 2: 0.2, 4: 0.5})  # there after 8 s
    assert fast["time_to_accuracy"]["50%"] == {
        "threshold": 0.5,
        "round": 2,
        "compute_s": 3.0,
        "spent": 15.0,
    }
    assert never["time_to_accuracy"]["50%"]["compute_s"] is None
    assert fast["final_levels"] == {"a": 2}
    t = time_to_accuracy_summary([fast, fast], [slow, never])["50%"]
    assert t["reached"] == 2 and t["base_reached"] == 1
    assert t["diff_compute_s"] == [3.0 - 8.0, 3.0 - 4.0]  # the one never there: its 4 s
    assert t["ratio"] == pytest.approx(3.0 / 6.0) and t["pairs_faster"] == 2
    assert t["p"] == 0.5  # two pairs: the smallest p there is
    # without a threshold the summary is what it always was (old reports rewrite alike)
    plain = node_summary([{"round": 0, "reward/mean": 1.0}], [], 1)
    assert "time_to_accuracy" not in plain and "heldout_curve" not in plain


def test_the_confirmatory_count_is_printed_only_where_the_spec_gives_it() -> None:
    nodes = [_node([0.5, 0.5], [1, 0])]
    base = {"experiment": {"grid": ["2/0", "1/1"], "nodes": 1, "rounds": 2}}
    spec = ExperimentSpec.model_validate(base)
    table = render_table(analyse(spec, {"2/0": nodes, "1/1": nodes}))
    assert "Confirmatory" not in table
    base["experiment"] |= {"confirmatory_runs_on_question": 6, "question": "does it?"}
    table = render_table(analyse(ExperimentSpec.model_validate(base), {"2/0": nodes}))
    assert (
        "- Confirmatory (pre-registered) runs made on this question (does it?): 6. Read "
        "each p against them: p < 0.05 over 6 tries holds after a Bonferroni correction "
        "only below 0.0083." in table
    )


def test_the_untrained_model_is_keyed_by_what_its_evaluation_depends_on() -> None:
    from pathlib import Path

    from sapo_node.experiment import arms, node_config, start_eval_key

    spec = ExperimentSpec.model_validate({"experiment": {"grid": ["4/0", "2/2"]}})
    a, b = arms(spec)
    out = Path("/nonexistent")
    key = start_eval_key(node_config(spec, a, 0, out))
    # other node seeds and configurations: the same untrained model, the same evaluation
    assert {start_eval_key(node_config(spec, x, i, out)) for x in (a, b) for i in range(3)} == {key}
    other = ExperimentSpec.model_validate({"experiment": {"grid": ["4/0"]}, "eval": {"seed": 1}})
    assert start_eval_key(node_config(other, arms(other)[0], 0, out)) != key
    lora = ExperimentSpec.model_validate(
        {"experiment": {"grid": ["4/0"]}, "base": {"model": {"lora": {"enabled": True}}}}
    )
    keys = {start_eval_key(node_config(lora, arms(lora)[0], i, out)) for i in range(2)}
    assert len(keys) == 2  # a LoRA adapter starts from its node seed
