"""The experiment's analysis on known inputs: pure functions of metrics and evaluations."""

from __future__ import annotations

import pytest

from sapo_node.experiment import (
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
        {"round": r, "reward_mean": x, "new_tokens": 10, "t_round": 2.0}
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
    assert results["smallest_p"] == 0.125 and b["complete"] and s["complete"]
    table = render_table(results)
    assert "| 1/1 | paper | 2.00 | 2.50x | 0.125 |" in table
    assert "smallest possible p is 0.125" in table


def test_incomplete_configurations_are_marked() -> None:
    spec = ExperimentSpec.model_validate(
        {"experiment": {"nodes": 1, "rounds": 3, "grid": ["2/0", "1/1"]}}
    )
    rows = [{"round": 0, "reward_mean": 0.5, "new_tokens": 1, "t_round": 1.0}]
    partial = node_summary(rows, [_eval(0, [1], [1.0])], 3)
    results = analyse(spec, {"2/0": [partial]})
    (c,) = results["configurations"]
    assert not c["complete"] and c["rounds_done"] == 1 and c["heldout_end"] is None
    assert "(1 rounds)" in render_table(results)


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
    t = Deferred(sink)
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
    again = Deferred(_Sink())
    again.unpark(tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists()
    assert [m.data for m in again.received()] == [b"in"]
    again.flush(1)
    assert again.inner.sent == [b"c"]
