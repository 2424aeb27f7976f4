"""Config overrides for test nodes on the tiny model."""

from __future__ import annotations

from pathlib import Path


def sevens_overrides(model_dir: Path, data_dir: Path, **sections) -> dict:
    """Config overrides for a node on the tiny model practising the Sevens task."""
    base = {
        "node": {"data_dir": str(data_dir), "seed": 1, "checkpoint_every": 100},
        "model": {"name": str(model_dir)},
        "generation": {"max_new_tokens": 8, "completions_per_task": 8},
        "tasks": {
            "families": [{"name": "tests.support.families:Sevens"}],
            "system_prompt": "Reply.",
            "one_shot": False,
            "reward": "partial",
        },
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base
