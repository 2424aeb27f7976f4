#!/usr/bin/env python3
"""An example swarm member that is not a model: a solver, piped into ``sapo-node share``.

    python scripts/solver.py --accuracy 0.8 | sapo-node share -

Every round it draws ``--groups`` tasks from the curriculum of the config (by default
the nodes' default one: the tasks they practise), answers each ``L`` times in the format
the prompts ask for (``<answer>...</answer>``), right with probability ``--accuracy``,
and writes one JSON line per group (docs/share.md) to standard output; then it waits
``--every`` seconds. It stands for "a better generator in the swarm": a bigger model
elsewhere, a program, a person. ``sapo-node share`` checks every line as a receiver
would (regenerated, compared, scored) before it sends it.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from sapo_node.config import ConfigError, load_config
from sapo_node.curriculum import Curriculum
from sapo_node.share import line_of
from sapo_node.solver import solve_round


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, help="the nodes' TOML config (its [tasks])")
    parser.add_argument("--accuracy", type=float, default=0.8, help="P(a completion is right)")
    parser.add_argument("--groups", type=int, default=4, help="tasks a round")
    parser.add_argument("--completions", type=int, help="L (default: the config's)")
    parser.add_argument("--every", type=float, default=30.0, help="seconds between rounds")
    parser.add_argument("--rounds", type=int, default=0, help="stop after N rounds (0: never)")
    parser.add_argument("--seed", type=int, help="task seed (default: a random one)")
    parser.add_argument("--model", default=None, help="label (default: solver-<accuracy>)")
    args = parser.parse_args(argv)
    if not 0.0 <= args.accuracy <= 1.0 or args.groups < 1 or args.every < 0:
        parser.error("--accuracy in [0, 1], --groups >= 1, --every >= 0")
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        parser.error(str(exc))
    n = args.completions or cfg.generation.completions_per_task
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**62)
    label = args.model or f"solver-{args.accuracy:g}"
    curriculum = Curriculum(cfg.tasks.families, cfg.curriculum)
    r = 0
    try:
        while args.rounds == 0 or r < args.rounds:
            for task, texts in solve_round(curriculum, seed, r, args.groups, n, args.accuracy):
                print(line_of(task.ref, texts, model=label), flush=True)
            r += 1
            if args.rounds == 0 or r < args.rounds:
                time.sleep(args.every)
    except (BrokenPipeError, KeyboardInterrupt):  # the reader went away, or Ctrl-C
        sys.stderr.close()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
