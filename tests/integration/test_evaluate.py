"""The held-out evaluation on a tiny model: its set, its metrics, the node hook and the
``sapo-node eval`` command on a node's checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from sapo_node.build import build_node
from sapo_node.cli import main
from sapo_node.config import load_config
from sapo_node.evaluate import EVAL_SEED_BASE, heldout_refs
from tests.support.nodes import sevens_overrides


def _config(model_dir: Path, data_dir: Path, **sections):
    return load_config(overrides=sevens_overrides(model_dir, data_dir, **sections), environ={})


def test_node_records_eval_every_n_rounds_and_cli_evaluates_its_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, capsys
) -> None:
    cfg = _config(
        tiny_model_dir,
        tmp_path / "n",
        node={"rounds": 2},
        eval={"every": 2, "tasks": 3, "samples": 2},
        train={"local_groups": 1, "external_groups": 0},
    )
    node = build_node(cfg)
    try:
        assert node.run() == 2
    finally:
        node.close()
    rows = [json.loads(x) for x in (tmp_path / "n" / "metrics.jsonl").read_text().splitlines()]
    assert "eval/pass1" not in rows[0]
    last = rows[1]
    for key in ("eval/pass1", "eval/greedy", "eval/answer_tag_rate", "eval/tasks"):
        assert key in last
    fam = "tests.support.families:Sevens"
    assert last["eval/tasks"] == 3 and f"eval/pass1/{fam}" in last
    assert len(last["eval/per_task_pass1"]) == 3
    assert all(0.0 <= last[k] <= 1.0 for k in ("eval/pass1", "eval/greedy"))

    toml = tmp_path / "tiny.toml"
    toml.write_text(
        f'[model]\nname = "{tiny_model_dir}"\n[generation]\nmax_new_tokens = 8\n'
        f'[tasks]\nsystem_prompt = "Reply."\none_shot = false\n'
        f'[[tasks.families]]\nname = "{fam}"\n[eval]\ntasks = 3\nsamples = 2\n'
    )
    capsys.readouterr()  # the node's round lines
    main(["eval", "--config", str(toml), "--data-dir", str(tmp_path / "n"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert "round 2" in report["evaluated"]
    # the node's policy after round 2 is what was checkpointed: the same evaluation
    assert report["eval/pass1"] == last["eval/pass1"]
    assert report["eval/greedy"] == last["eval/greedy"]
    ckpt = str(tmp_path / "n" / "checkpoints" / "round-000002")
    main(["eval", "--config", str(toml), "--data-dir", str(tmp_path / "n"), "--checkpoint", ckpt])
    table = capsys.readouterr().out
    assert "pass@1" in table and "greedy" in table and fam in table


def test_heldout_set_is_fixed_spread_and_beyond_every_training_seed(tiny_model_dir, tmp_path):
    cfg = load_config(
        overrides={
            "tasks": {
                "families": [
                    {"name": "basic_arithmetic", "weight": 2, "levels": [{"max_digits": 1}, {}]},
                    {"name": "base_conversion", "weight": 1},
                ]
            },
            "eval": {"tasks": 9, "seed": 3},
        },
        environ={},
    )
    refs = heldout_refs(cfg.tasks.families, cfg.curriculum, cfg.eval)
    assert refs == heldout_refs(cfg.tasks.families, cfg.curriculum, cfg.eval)
    fams = [r.family for r, _ in refs]
    assert fams.count("basic_arithmetic") == 6 and fams.count("base_conversion") == 3
    assert {lvl for r, lvl in refs if r.family == "basic_arithmetic"} == {0, 1}  # curriculum on
    sums = {r.seed + r.index for r, _ in refs}
    assert len(sums) == 9 and min(sums) >= EVAL_SEED_BASE + 3 * 2**16
    # a node's largest seed and a peer's largest (seed + index) on the wire stay below
    largest_own, largest_wire = (2**62 - 1) + 10**9 * 4096, 2 * (2**63 - 1)
    assert max(largest_own, largest_wire) < EVAL_SEED_BASE
    off = cfg.curriculum.model_copy(update={"enabled": False})
    assert {lvl for _, lvl in heldout_refs(cfg.tasks.families, off, cfg.eval)} == {0}
