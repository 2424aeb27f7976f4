"""Reward and GRPO signal of the untrained embedded model at several sampling temperatures.

For each temperature: 2 rounds x 8 tasks of the default config's first curriculum level,
L completions each, scored by the node's own sandboxed verifier. Prints the mean reward
and how many groups carry signal (rewards not all equal).

Usage: python scripts/probe_temperature.py [--data-dir DIR] [--temperatures 1.0 0.7 0.5 0.3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "sapo-probe")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7, 0.5, 0.3])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()

    from sapo_node.build import build_node
    from sapo_node.config import load_config
    from sapo_node.logs import configure_logging
    from sapo_node.tasks import make_task

    configure_logging()
    for temperature in args.temperatures:
        generation = {"temperature": temperature, "max_new_tokens": args.max_new_tokens}
        overrides = {
            "node": {"data_dir": str(args.data_dir), "seed": args.seed},
            "generation": generation,
        }
        node = build_node(load_config(overrides=overrides, environ={}))
        try:
            rewards: list[float] = []
            groups_with_signal = groups = 0
            for r in range(2):
                tasks = [make_task(ref) for ref in node.curriculum.sample(node.seed, r, 8)]
                generated, _ = node._generate(tasks, r)
                node._score(generated)
                for g in generated:
                    rewards += g.rewards
                    groups += 1
                    groups_with_signal += g.has_signal
        finally:
            node.close()
        print(
            f"temperature {temperature}: reward {statistics.mean(rewards):.3f}, "
            f"groups with signal {groups_with_signal}/{groups}",
            flush=True,
        )


if __name__ == "__main__":
    main()
