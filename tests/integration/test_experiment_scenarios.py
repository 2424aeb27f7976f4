"""The experiment's scenarios on a tiny model: a late joiner (a warm swarm trained first,
a fresh node joining it against the same node alone, a stop and a resume), with the
curriculum on, periodic evaluations by level and family, and time to accuracy."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from sapo_node.config import ConfigError
from sapo_node.experiment import load_spec, node_seed, run_experiment
from sapo_node.experiment.spec import MEMBER_INDEX

FAMILY = "tests.support.families:Sevens"


def _spec(tiny_model_dir: Path, tmp_path: Path, late_joiner: str) -> Path:
    path = tmp_path / "late-joiner.toml"
    path.write_text(
        f"""
[experiment]
nodes = 2                 # members of the warm swarm
rounds = 2                # the joiner's rounds
replicates = 2            # joiners, one per pair
grid = ["4/0", "2/2"]
threads = 1
curriculum = true
periodic_samples = 0      # greedy only in between
thresholds = [0.5]
confirmatory_runs_on_question = 0
question = "does a joiner reach its swarm's accuracy sooner?"
setting = "Tiny test model."

{late_joiner}

[eval]
tasks = 2
samples = 2
every = 1

[base.model]
name = "{tiny_model_dir}"
[base.generation]
max_new_tokens = 6
completions_per_task = 4
[base.tasks]
system_prompt = "Reply."
one_shot = false
reward = "partial"
families = [{{ name = "{FAMILY}", levels = [{{ a = 1 }}, {{ a = 2 }}] }}]
[base.train]
lr = 1e-2
micro_batch_size = 32
[base.pool]
sampling = "uniform"  # a random tiny model rarely writes a seven: take groups without signal too
"""
    )
    return path


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_late_joiner_joins_a_warm_swarm_and_is_compared_with_itself_alone(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    spec = load_spec(
        _spec(tiny_model_dir, tmp_path, "[experiment.late_joiner]\nswarm_rounds = 2\n")
    )
    out = tmp_path / "out"
    stop = threading.Event()
    messages: list[str] = []

    def stop_in_the_joined_swarm(message: str) -> None:
        messages.append(message)
        if message.startswith("2/2 node 1 round 0"):
            stop.set()

    assert not run_experiment(spec, out, stop=stop, progress=stop_in_the_joined_swarm)
    assert run_experiment(spec, out, progress=messages.append)

    # the warm swarm trained its 2 rounds once, on its own seeds, and was evaluated then
    for m in range(2):
        d = out / "swarm-0" / f"node-{m}"
        assert [r["round"] for r in _rows(d / "metrics.jsonl")] == [0, 1]
        assert [e["round"] for e in _rows(d / "eval.jsonl")] == [2]
        assert json.loads((d / "node.json").read_text())["seed"] == node_seed(
            spec, MEMBER_INDEX + m
        )
    at_join = json.loads((out / "swarm-0" / "at-join.json").read_text())
    assert at_join["round"] == 2 and len(at_join["members"]) == 2
    assert not (out / "4-0" / "swarm-0").exists()  # alone: no swarm
    for k in range(2):
        # each joiner's copy of the swarm went on from round 2, with its warm-up rows
        for m in range(2):
            d = out / "2-2" / f"swarm-{k}" / f"node-{m}"
            assert [r["round"] for r in _rows(d / "metrics.jsonl")] == [0, 1, 2, 3]
            assert not (d / "eval.jsonl").exists()  # members are not compared
        for arm in ("4-0", "2-2"):
            d = out / arm / f"node-{k}"
            rows = _rows(d / "metrics.jsonl")
            assert [r["round"] for r in rows] == [0, 1]
            assert json.loads((d / "node.json").read_text())["seed"] == node_seed(spec, k)
            evals = _rows(d / "eval.jsonl")
            assert [e["round"] for e in evals] == [0, 1, 2]
            # the evaluation in between is the cheaper one: greedy only, no pass@1
            assert [e["eval/samples"] for e in evals] == [2, 0, 2]
            assert evals[1]["eval/pass1"] is None and evals[1]["eval/new_tokens"] > 0
            assert sorted(evals[-1]["eval/per_task_level"]) == [0, 1]
        joined = _rows(out / "2-2" / f"node-{k}" / "metrics.jsonl")
        alone = _rows(out / "4-0" / f"node-{k}" / "metrics.jsonl")
        # the joiner took the members' groups from its second round; alone, nothing came
        assert joined[1]["net/accepted"] > 0 and joined[1]["groups/external"] > 0
        assert sum(r["net/accepted"] for r in alone) == 0
    # the untrained model was evaluated once for both arms' four joiners
    assert sum("held-out eval after 0 rounds" in m for m in messages) == 1

    results = json.loads((out / "results.json").read_text())
    assert results["pairs"] == 2 and results["late_joiner"]["swarm_rounds"] == 2
    confs = {c["label"]: c for c in results["configurations"]}
    assert all(c["complete"] for c in confs.values())
    timing = confs["2/2"]["time_to_accuracy"]
    assert set(timing) == {"50%", "swarm at join"}
    swarm_mean = sum(m["eval/greedy"] for m in at_join["members"]) / 2
    assert timing["swarm at join"]["threshold_mean"] == pytest.approx(swarm_mean)
    for t in timing.values():
        assert 0 < t["p"] <= 1 and len(t["diff_compute_s"]) == 2
        assert t["compute_s_mean"] > 0 or t["reached"] == 2
    # a node's time: the compute of the rounds before its first evaluation at the
    # threshold, else its whole compute
    node = confs["2/2"]["nodes"][0]
    spent = sum(r["compute_s"] for r in _rows(out / "2-2" / "node-0" / "metrics.jsonl"))
    t = node["time_to_accuracy"]["50%"]
    assert t["spent"] == pytest.approx(spent)
    if t["round"] is not None:
        assert node["heldout_curve"][t["round"]][2] >= 0.5
    by = confs["2/2"]["heldout_end_by"]
    assert set(by["level"]) == {"0", "1"} and by["level"]["0"]["tasks"] == 2
    assert set(by["family"]) == {FAMILY}
    over_time = confs["2/2"]["heldout_over_time"]
    assert [r["round"] for r in over_time] == [0, 1, 2] and over_time[1]["pass1"] is None
    table = (out / "results.md").read_text()
    for line in (
        "## Time to accuracy",
        "| 2/2 | uniform | swarm at join",
        "- Late joiner: each compared node is a fresh node that joins a swarm",
        "## Held-out accuracy by level and by family",
        "| 2/2 | uniform | level 1 |",
        "## Held-out accuracy over the run",
        "- Confirmatory (pre-registered) runs made on this question (does a joiner reach "
        "its swarm's accuracy sooner?): 0 (this run is not one).",
        "- Setting: the shipped defaults (configs/default.toml) but for `model.name",
    ):
        assert line in table, line
    assert (out / "time_to_accuracy.png").stat().st_size > 0

    # the report is a function of OUT's files: written again, the same bytes
    before = (out / "results.md").read_bytes(), (out / "results.json").read_bytes()
    from sapo_node.experiment import report

    report(spec, out)
    assert ((out / "results.md").read_bytes(), (out / "results.json").read_bytes()) == before


def test_a_swarm_from_another_run_must_be_at_the_round_the_joiner_joins(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """swarm_from resumes another run's nodes: one whose latest checkpoint is not of
    swarm_rounds is named, with what it has, before anything runs."""
    source = tmp_path / "earlier" / "2-2"
    (source / "node-0" / "checkpoints" / "round-000003").mkdir(parents=True)
    (source / "node-0" / "checkpoints" / "LATEST").write_text("round-000003\n")
    lj = f'[experiment.late_joiner]\nswarm_rounds = 2\nswarm_from = "{source}"\n'
    spec = load_spec(_spec(tiny_model_dir, tmp_path, lj), {"experiment": {"replicates": 1}})
    with pytest.raises(ConfigError, match="round-000002.*it has round-000003"):
        run_experiment(spec, tmp_path / "out", only=["2/2"])
    with pytest.raises(ConfigError, match="needs J >= 1"):
        load_spec(
            _spec(tiny_model_dir, tmp_path, lj),
            {"experiment": {"late_joiner": {"swarm_arm": "4/0"}}},
        )
