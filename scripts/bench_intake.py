"""Benchmark what a node pays for peers' groups while its J is 0.

A node whose rule keeps J at 0 (the answer-format rule once a node has the format) takes
no peer's group. Before, it still scored every one on arrival with its own verifier; now
it checks and pools them, and scores them only before a round that may draw them.

This runs one real round of a node on the default config (the rest of a round's work:
generation, scoring its own groups, training; nothing pooled yet, so no intake), then
has ``--peers`` peers each send that round's ``I + J`` groups (the same texts and tasks
a swarm of its like would send, signed by each peer and dated now) ``--repeats`` times,
and times the node's intake of each batch, alternating between the intake as it is
with J at 0 (checked and pooled, not scored) and as it was (every group scored on
arrival), in the same process. It prints both intakes (wall seconds, as ``compute_s``
counts them, and completions scored) and compute per round, now against before:
(round + intake now) / (round + intake before).

Usage: python scripts/bench_intake.py [--model embedded|DIR] [--peers 7] [--repeats 10]
       [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded", help="embedded, or a model directory")
    parser.add_argument("--peers", type=int, default=7, help="peers sending groups")
    parser.add_argument("--repeats", type=int, default=10, help="batches timed per intake")
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run(args, args.data_dir or Path(tmp))


def run(args: argparse.Namespace, data_dir: Path) -> None:
    from sapo_node.build import build_node
    from sapo_node.config import load_config
    from sapo_node.intake import wire
    from sapo_node.logs import configure_logging
    from sapo_node.net.memory import MemoryHub

    configure_logging(False)
    config = load_config(
        overrides={
            "model": {"name": args.model},
            "node": {"data_dir": str(data_dir / "node"), "seed": 7, "checkpoint_every": 1000},
            "net": {"enabled": False},
        },
        environ={},
    )
    node = build_node(config)
    hub = MemoryHub()
    node.transport = hub.join("node")
    tap = hub.join("tap")  # what the node publishes, for its peers to send back
    scorer = Counting(node.intake.scorer)
    node.intake.scorer = scorer
    try:
        rec = node.run_round(0)  # nothing pooled: a round without intake
        node.round = 1
        groups = [wire.decode(m.data) for m in tap.received()]
        node.own_stats.format_rate = 1.0  # it has the answer format: J 0
        assert node._choose_j(pooled=1)[0] == 0
        timed: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
        for k in range(2 * args.repeats):
            score = bool(k % 2)  # True: the intake as it was
            for p in range(args.peers):
                peer = hub.join(f"peer-{k}-{p}")  # new authors: no duplicates, no rate limit
                for group in groups:
                    fresh = dataclasses.replace(group, created_ms=int(time.time() * 1000))
                    peer.publish(wire.encode(fresh))
                peer.close()
            before, start = scorer.scored, time.perf_counter()
            outcomes = node._take_in(score=score)
            timed[score].append((time.perf_counter() - start, scorer.scored - before))
            assert outcomes["accepted"] == args.peers * len(groups), outcomes
    finally:
        node.close()
    round_s = rec["compute_s"]
    now, was = (statistics.median(s for s, _ in timed[x]) for x in (False, True))
    print(
        f"model {args.model}, {args.peers} peers x {len(groups)} groups of "
        f"{config.generation.completions_per_task} a round, J 0: intake {now:.3f} s now "
        f"({timed[False][0][1]} completions scored), {was:.3f} s before "
        f"({timed[True][0][1]} scored), medians of {args.repeats}; a round's other compute "
        f"{round_s:.2f} s; compute per round now / before = "
        f"{(round_s + now) / (round_s + was):.4f}"
    )


class Counting:
    """The node's scorer, counting the completions the intake asks it to score."""

    def __init__(self, inner) -> None:
        self.inner, self.scored = inner, 0

    def score(self, task, completions):
        self.scored += len(completions)
        return self.inner.score(task, completions)


if __name__ == "__main__":
    main()
