"""scripts/heldout_recheck.py: an experiment's end models evaluated again on another
held-out set (a tiny experiment, run here), and the committed recheck of
families-confirm-cpu reproduced from its per-node files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sapo_node.experiment import load_spec, run_experiment

ROOT = Path(__file__).resolve().parents[2]
_loader = importlib.util.spec_from_file_location(
    "heldout_recheck", ROOT / "scripts/heldout_recheck.py"
)
recheck = importlib.util.module_from_spec(_loader)
_loader.loader.exec_module(recheck)


def _script(capsys, *args: str | Path) -> dict:
    """The script's main in this process (a model loads in seconds, a process in more);
    the JSON it prints last."""
    assert recheck.main([str(a) for a in args]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def test_a_tiny_experiments_end_models_on_another_held_out_set(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    spec_file = tmp_path / "tiny.toml"
    spec_file.write_text(
        f"""
[experiment]
nodes = 1
replicates = 2
rounds = 1
grid = ["2/0", "1/1"]
threads = 1

[eval]
tasks = 2
samples = 1

[base.model]
name = "{tiny_model_dir}"
[base.generation]
max_new_tokens = 4
completions_per_task = 2
[base.tasks]
system_prompt = "Reply."
one_shot = false
families = [{{ name = "tests.support.families:Sevens" }}]
"""
    )
    out = tmp_path / "out"
    assert run_experiment(load_spec(spec_file), out)
    set1 = ("--eval-seed", "1", "--tasks", "3", "--samples", "1")
    result = _script(capsys, spec_file, out, "--start", "--arm", "2/0", "--arm", "1/1", *set1,
                     "--compare", "1/1", "2/0")  # fmt: skip
    files = [out / a / f"node-{i}" / "heldout-seed1-3.json" for a in ("1-1", "2-0") for i in (0, 1)]
    rows = [json.loads(f.read_text()) for f in files]
    assert all(r["eval/tasks"] == 3 and len(r["eval/per_task_greedy"]) == 3 for r in rows)
    assert all("round 1" in r["evaluated"] for r in rows)  # the last round's checkpoint
    untrained = json.loads((out / "start-eval" / "heldout-seed1-3.json").read_text())
    assert "untrained" in untrained["evaluated"]
    cache = out / "start-eval" / "untrained" / "models"  # the experiment's model copy, shared
    assert cache.is_symlink() and cache.resolve() == (out / ".models").resolve()
    assert result["held_out"] == {"seed": 1, "tasks": 3, "samples": 1}
    assert result["greedy_by_node"] == [
        [r["eval/greedy"] for r in rows[:2]],
        [r["eval/greedy"] for r in rows[2:]],
    ]
    assert len(result["replicate_diff_points"]) == 2

    # evaluated nodes are kept, not redone; a configuration without end models says so
    stamps = [f.stat().st_mtime_ns for f in files]
    assert (
        _script(capsys, spec_file, out, "--arm", "1/1", *set1, "--compare", "1/1", "2/0") == result
    )
    assert [f.stat().st_mtime_ns for f in files] == stamps
    with pytest.raises(SystemExit, match="evaluated with --samples 1"):
        recheck.main([str(spec_file), str(out), "--arm", "1/1", *set1[:4], "--samples", "2"])
    with pytest.raises(SystemExit, match="not evaluated yet"):
        recheck.main(
            [str(spec_file), str(out), *set1[:2], "--tasks", "5", "--compare", "1/1", "2/0"]
        )
    with pytest.raises(SystemExit, match="no checkpoint of round 1"):
        recheck.main([str(spec_file), str(tmp_path / "elsewhere"), "--arm", "1/1", *set1])


def test_the_committed_recheck_of_families_confirm_is_reproduced_from_its_files(capsys) -> None:
    run = ROOT / "docs" / "results" / "families-confirm-cpu"
    spec = ROOT / "configs" / "experiments" / "families-confirm-cpu.toml"
    committed = json.loads((run / "heldout-recheck" / "results.json").read_text())
    for pair, figures in committed.items():
        treatment, baseline = pair.split(" vs ")
        args = ("--compare", treatment, baseline, "--eval-seed", "1", "--tasks", "1024")
        assert _script(capsys, spec, run, *args) == figures
    # heldout-recheck/README.md: the endpoint, no detectable difference
    endpoint = committed["2/2 format first choices k2 vs 4/0"]
    assert endpoint["greedy_end"] == [0.5288, 0.5165] and endpoint["p"] == 0.4297
