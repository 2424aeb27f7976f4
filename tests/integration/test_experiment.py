"""The controlled experiment end to end on a tiny model: every configuration through the
real round loop over the in-memory transport, a stop, a resume that redoes nothing, and
the report (results.json, results.md, the curves)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from sapo_node.cli import main
from sapo_node.config import ConfigError
from sapo_node.experiment import ExperimentSpec, arms, load_spec, node_seed, run_experiment
from sapo_node.experiment.spec import node_config
from tests.support.cli import run_cli

FAMILY = "tests.support.families:Sevens"


def _spec(tiny_model_dir: Path, tmp_path: Path, rounds: int = 2) -> Path:
    path = tmp_path / "tiny-experiment.toml"
    path.write_text(
        f"""
[experiment]
nodes = 2
rounds = {rounds}
grid = ["4/0", "3/1", "2/2", "1/3"]
threads = 1
window = 2

[eval]
tasks = 2
samples = 2

[base.model]
name = "{tiny_model_dir}"
[base.generation]
max_new_tokens = 6
completions_per_task = 4
[base.tasks]
system_prompt = "Reply."
one_shot = false
reward = "partial"
families = [{{ name = "{FAMILY}" }}]
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


def test_experiment_runs_stops_resumes_and_reports(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    spec_file = _spec(tiny_model_dir, tmp_path)
    spec = load_spec(spec_file)
    out = tmp_path / "out"
    stop = threading.Event()

    messages: list[str] = []

    def stop_in_2_2(message: str) -> None:
        messages.append(message)
        if message.startswith("2/2 node 0 round 0"):
            stop.set()

    assert not run_experiment(spec, out, stop=stop, progress=stop_in_2_2)
    partial = json.loads((out / "results.json").read_text())
    assert [c["label"] for c in partial["configurations"]] == ["4/0", "3/1", "2/2"]
    assert [c["complete"] for c in partial["configurations"]] == [True, True, False]
    before = {p: p.read_text() for p in out.glob("*/node-*/metrics.jsonl")}
    before_evals = {p: p.read_text() for p in out.glob("*/node-*/eval.jsonl")}

    assert run_experiment(spec, out)
    for path, text in before.items():  # finished rounds are kept, never redone
        assert path.read_text().startswith(text)
    for path, text in before_evals.items():
        assert path.read_text().startswith(text)
    for a in arms(spec):
        for i in range(2):
            d = out / a.dirname / f"node-{i}"
            rows = _rows(d / "metrics.jsonl")
            assert [r["round"] for r in rows] == [0, 1]
            assert [e["round"] for e in _rows(d / "eval.jsonl")] == [0, 2]
            assert json.loads((d / "node.json").read_text())["seed"] == node_seed(spec, i)
            assert {r["groups/local"] + r["groups/external"] for r in rows} == {4}
    # sharing happened over the wire: nodes with J > 0 trained on peers' groups
    late = [
        _rows(out / d / f"node-{i}" / "metrics.jsonl")[1]
        for d in ("3-1", "2-2", "1-3")
        for i in range(2)
    ]
    assert all(r["net/accepted"] > 0 and r["net/bytes_in"] > 0 for r in late)
    assert sum(r["groups/external"] for r in late) > 0
    # on the experiment's round clock (30 s a round), not the machine's: a group made in
    # round 0 is 30 s old in round 1 however long the rounds took, even across the stop
    aged = [r for r in late if r["groups/external"]]
    assert aged and all(r["groups/external_age_s_max"] == 30.0 for r in aged)
    assert all(r["compute_s"] > 0 for r in late)
    assert _rows(out / "4-0" / "node-0" / "metrics.jsonl")[1]["groups/external"] == 0

    results = json.loads((out / "results.json").read_text())
    confs = {c["label"]: c for c in results["configurations"]}
    assert set(confs) == {"4/0", "3/1", "2/2", "1/3"} and all(c["complete"] for c in confs.values())
    assert confs["4/0"]["ratio"] == pytest.approx(1.0)
    for label, c in confs.items():
        total = sum(
            r["reward/mean"]
            for i in range(2)
            for r in _rows(out / label.replace("/", "-") / f"node-{i}" / "metrics.jsonl")
        )
        assert c["cumulative_reward"] == pytest.approx(total)
        assert c["new_tokens"] > 0 and c["node_seconds"] > 0
        assert 0 <= c["heldout_end"]["greedy_ci95"][0] <= c["heldout_end"]["greedy_ci95"][1] <= 1
        if label != "4/0":
            assert 0 < c["p_reward"] <= 1 and "p_heldout" in c
    assert results["pairs"] == 2 and results["smallest_p"] == 0.5
    table = (out / "results.md").read_text()
    assert "| 2/2 |" in table and "smallest possible p is 0.5" in table
    assert (out / "reward_curves.png").stat().st_size > 0
    assert (out / "heldout.png").stat().st_size > 0

    # the untrained model was evaluated once, not once per node or configuration: every
    # node of every configuration holds that one evaluation
    assert sum("held-out eval after 0 rounds" in m for m in messages) == 1
    (kept_file,) = (out / "start-eval").glob("*.json")
    kept = json.loads(kept_file.read_text())
    for i in range(2):
        for a in arms(spec):
            assert _rows(out / a.dirname / f"node-{i}" / "eval.jsonl")[0] == kept
    # a finished swarm's metrics and evaluations, without checkpoints, count as finished
    moved = tmp_path / "moved"
    for i in range(2):
        (moved / "4-0" / f"node-{i}").mkdir(parents=True)
        for name in ("metrics.jsonl", "eval.jsonl"):
            src = out / "4-0" / f"node-{i}" / name
            (moved / "4-0" / f"node-{i}" / name).write_text(src.read_text())
    assert run_experiment(spec, moved, only=["4/0"])
    assert not list(moved.glob("4-0/node-*/checkpoints"))

    capsys.readouterr()
    main(["experiment", str(spec_file), "--out", str(out), "--report-only"])
    assert "| 1/3 | uniform |" in capsys.readouterr().out
    code, _, err = run_cli(
        ["experiment", str(spec_file), "--out", str(out), "--only", "5/5"], capsys
    )
    assert code == 2 and "no configuration '5/5'" in err


def test_experiment_files_and_bad_specs(tiny_model_dir: Path, tmp_path: Path) -> None:
    for path in sorted((Path(__file__).parents[2] / "configs" / "experiments").glob("*.toml")):
        spec = load_spec(path)
        assert any(a.external == 0 for a in arms(spec))
    good = _spec(tiny_model_dir, tmp_path)
    with pytest.raises(ConfigError, match="I \\+ J"):
        load_spec(good, {"experiment": {"grid": ["4/0", "2/1"]}})
    with pytest.raises(ConfigError, match="J = 0"):
        load_spec(good, {"experiment": {"grid": ["3/1", "2/2"]}})
    with pytest.raises(ConfigError, match="base"):
        load_spec(good, {"base": {"train": {"lr": -1}}})
    spec = ExperimentSpec.model_validate({"experiment": {"sampling": ["uniform"]}})
    assert [a.dirname for a in arms(spec)][-1] == "2-2-uniform"
    spec = ExperimentSpec.model_validate(
        {
            "experiment": {"sampling": ["teaching"], "adaptive": [3, 4], "adaptive_ratio": "3/1"},
            "base": {"train": {"external_by": "signal"}},  # by format, J stays below I + J
        }
    )
    adaptive = arms(spec)[-2:]
    assert [a.label for a in adaptive] == ["3/1 adaptive 3", "3/1 adaptive 4"]
    assert [a.dirname for a in adaptive] == ["3-1-adaptive-3", "3-1-adaptive-4"]
    train = node_config(spec, adaptive[1], 0, tmp_path).train
    # A round keeps an own group to measure: signal reads a bound of I + J as one fewer.
    assert (train.local_groups, train.external_groups, train.j_bound()) == (3, 1, 3)
    assert node_config(spec, arms(spec)[0], 0, tmp_path).train.j_bound() is None  # fixed
    with pytest.raises(ConfigError, match="adaptive bounds"):
        load_spec(good, {"experiment": {"adaptive": [5]}})  # more than I + J = 4
    # A variant's own adaptive J reaches its nodes (it was once overwritten by the
    # fixed J of every non-adaptive configuration); the baseline's J stays 0.
    by_format = {"ratio": "2/2", "set": {"train": {"external_max": 3, "external_by": "format"}}}
    spec = load_spec(good, {"experiment": {"variants": {"2/2 format": by_format}}})
    variant = next(a for a in arms(spec) if a.label == "2/2 format")
    train = node_config(spec, variant, 0, tmp_path).train
    assert (train.local_groups, train.external_groups, train.external_max) == (2, 2, 3)
    assert train.external_by == "format"
    assert node_config(spec, arms(spec)[0], 0, tmp_path).train.j_bound() is None
    with pytest.raises(ConfigError, match="its ratio sets I and J"):
        bad = {"ratio": "2/2", "set": {"train": {"local_groups": 3}}}
        load_spec(good, {"experiment": {"variants": {"2/2 more": bad}}})
    with pytest.raises(ConfigError, match="the experiment sets I and J per configuration"):
        load_spec(good, {"base": {"train": {"external_max": 2}}})


def test_a_solver_member_shares_checked_groups_that_the_nodes_train_on(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    spec = load_spec(
        _spec(tiny_model_dir, tmp_path),
        {"experiment": {"grid": ["4/0", "2/2"], "solver": [0.5], "solver_groups": 3}},
    )
    assert [a.label for a in arms(spec)] == ["4/0", "2/2", "2/2 solver 0.5"]
    out = tmp_path / "out"
    assert run_experiment(spec, out, only=["2/2", "2/2 solver 0.5"])

    from sapo_node.intake.pool import Pool

    solver_dir = out / "2-2-solver-0.5"
    for i in range(2):
        rows = _rows(solver_dir / f"node-{i}" / "metrics.jsonl")
        plain = _rows(out / "2-2" / f"node-{i}" / "metrics.jsonl")
        # the solver's 3 groups arrive besides the other node's 4 (its pool was empty in
        # round 0, so it made all 4 of its groups itself); round 0 sees nothing
        assert [r["net/accepted"] for r in rows] == [0, 7]
        assert [r["net/accepted"] for r in plain] == [0, 4]
        pool = Pool(solver_dir / f"node-{i}" / "pool.sqlite3")
        counts = pool.counts()
        pool.close()
        assert {a: c.get("accepted") for a, c in counts.items()} == {
            "solver-0": 3,
            f"node-{1 - i}": 4,
        }
    results = json.loads((out / "results.json").read_text())
    conf = {c["label"]: c for c in results["configurations"]}["2/2 solver 0.5"]
    assert conf["solver"] == 0.5 and conf["versus_plain"]["label"] == "2/2"
    assert len(conf["format"]["curve"]) == 2
    table = (out / "results.md").read_text()
    assert "| 2/2 + solver (0.5) |" in table and "Answer format" in table
    assert (out / "answer_format.png").stat().st_size > 0


@pytest.mark.slow  # about a minute and a half on 2 loaded cores: beyond make test's budget
def test_the_gpu_experiment_script_runs_its_spec_on_the_cpu_with_a_tiny_model(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """scripts/gpu_experiment.sh with configs/experiments/sharing-gpu.toml as a lent GPU
    would run them, shrunk: a tiny model on the CPU, 2 nodes, 1 round, one of its
    configurations on its real task families (the spec's load checks every one)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    text = (root / "configs/experiments/sharing-gpu.toml").read_text()
    for old, new in [
        ("nodes = 4", "nodes = 2"),
        ("rounds = 60", "rounds = 1"),
        ("threads = 0", "threads = 1"),
        ("tasks = 128", "tasks = 1"),
        ("samples = 4", "samples = 1"),
        ("every = 20", "every = 0"),
        ('name = "embedded"', f'name = "{tiny_model_dir}"'),
        ('device = "cuda"', 'device = "cpu"'),
        ("completions_per_task = 8", "completions_per_task = 2"),
        ("max_new_tokens = 64", "max_new_tokens = 6"),
    ]:
        assert old in text, old
        text = text.replace(old, new, 1)
    spec_file = tmp_path / "sharing-gpu.toml"
    spec_file.write_text(text)
    assert [a.label for a in arms(load_spec(spec_file))] == [
        "8/0",
        "4/4",
        "4/4 tasks",
        "4/4 answers",
        "4/4 first choices k2",
        "4/4 format first choices k2",
    ]
    out = tmp_path / "out"
    env = {**os.environ, "SPEC": str(spec_file), "PYTHON": sys.executable, "ALLOW_CPU": "1"}
    run = subprocess.run(
        ["sh", str(root / "scripts/gpu_experiment.sh"), str(out), "300", "--only", "4/4 tasks"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert [c["label"] for c in results["configurations"]] == ["4/4 tasks"]
    assert all(c["complete"] and c["compute_seconds"] > 0 for c in results["configurations"])
    families = {
        k.removeprefix("family_reward/")
        for p in out.glob("*/node-*/metrics.jsonl")
        for r in _rows(p)
        for k in r
        if k.startswith("family_reward/")
    }
    assert families == {"basic_arithmetic", "chain_sum", "products", "gcd"}
