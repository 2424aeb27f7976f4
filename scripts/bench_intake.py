"""Benchmark what a node pays for peers' groups while its J is 0.

A node whose rule keeps J at 0 (the answer-format rule once a node has the format) takes
no peer's group, yet before it scored every one on arrival with its own verifier; now it
checks and pools them, and scores them only before a round that may draw them. This
runs real rounds of one node (its format rate pinned at 1, so J stays 0) while ``--peers``
peers each send ``I + J`` groups a round (this node's own groups of the previous round,
signed by each peer and dated now: the same texts and tasks a swarm of its like would
send), and alternates, round by round, between the node as it is and the node with the
intake as it was (every group scored on arrival), in the same process. It prints per
round and on average: the round's ``compute_s`` (node.Timer), its intake seconds, and the
completions the intake scored; then the ratio of compute per round, now against before.

Usage: python scripts/bench_intake.py [--model embedded|DIR] [--peers 7] [--rounds 6]
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
    parser.add_argument("--rounds", type=int, default=6, help="rounds measured (even: half each)")
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
    from sapo_node.node import Node

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
    tap = hub.join("tap")  # what the node publishes, to be sent back by its peers
    peers = [hub.join(f"peer-{k}") for k in range(args.peers)]
    scorer = Counting(node.intake.scorer)
    node.intake.scorer = scorer
    as_before = _scoring_on_arrival(node, Node)
    rows: dict[str, list[tuple[float, float, int]]] = {"now": [], "before": []}
    sent: list = []
    try:
        for r in range(args.rounds + 1):
            # Peers send what the node published last round, as theirs and dated now.
            sent = [wire.decode(m.data) for m in tap.received() if m.author == "node"]
            for peer in peers:
                for group in sent:
                    fresh = dataclasses.replace(group, created_ms=int(time.time() * 1000))
                    peer.publish(wire.encode(fresh))
            arm = "before" if r % 2 else "now"
            node._take_in = as_before if arm == "before" else _plain(node, Node)
            node.mix.format_rate = 1.0  # has the answer format: J 0
            scored = scorer.scored
            rec = node.run_round(r)
            node.round = r + 1
            assert rec["train/external_target"] == 0 or r == 0
            if r == 0:  # nothing was sent yet: a warm-up
                continue
            row = (rec["compute_s"], rec["phase_s/intake"], scorer.scored - scored)
            rows[arm].append(row)
            print(
                f"round {r} ({arm:6s}): compute {row[0]:7.2f} s, intake {row[1]:6.2f} s, "
                f"{row[2]:4d} completions scored, pool {rec['pool/groups']} groups",
                flush=True,
            )
    finally:
        node.close()
    now, before = (
        [statistics.mean(x[i] for x in rows[a]) for i in range(3)] for a in ("now", "before")
    )
    print(
        f"J 0, {args.peers} peers x {len(sent)} groups a round, model {args.model}: "
        f"compute per round {now[0]:.2f} s now, {before[0]:.2f} s before "
        f"(ratio {now[0] / before[0]:.3f}); intake {now[1]:.2f} s against {before[1]:.2f} s; "
        f"completions scored per round {now[2]:.0f} against {before[2]:.0f}"
    )


class Counting:
    """The node's scorer, counting the completions the intake asks it to score."""

    def __init__(self, inner) -> None:
        self.inner, self.scored = inner, 0

    def score(self, task, completions):
        self.scored += len(completions)
        return self.inner.score(task, completions)


def _plain(node, node_class):
    return lambda score=True: node_class._take_in(node, score)


def _scoring_on_arrival(node, node_class):
    """The intake as it was: every group scored on arrival, whatever J."""
    return lambda score=True: node_class._take_in(node, True)


if __name__ == "__main__":
    main()
