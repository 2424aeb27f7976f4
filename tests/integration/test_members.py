"""Members that do not train: a generating member (a model that shares but never
learns), groups shared from a file or a program (`sapo-node share`), and the nodes that
learn from them. In process over the in-memory hub, then as real processes over libp2p."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sapo_node.build import build_node
from sapo_node.checkpoint import CheckpointError
from sapo_node.config import load_config
from sapo_node.intake.pool import summary
from sapo_node.net import identity
from sapo_node.net.memory import MemoryHub
from sapo_node.node import Node
from sapo_node.share import line_of
from sapo_node.tasks import TaskRef
from tests.support.nodes import sevens_overrides
from tests.support.swarm import REPO, NodeProcess, node_config, stop_all, wait_until

SEVENS = "tests.support.families:Sevens"


def _node(model_dir: Path, data_dir: Path, seed: int, *, trains: bool = True) -> Node:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"seed": seed},
        generation={"max_new_tokens": 6, "completions_per_task": 4},
        train={"lr": 1e-2, "local_groups": 2, "external_groups": 2, "enabled": trains},
        pool={"sampling": "uniform"},
    )
    return build_node(load_config(overrides=overrides, environ={}))


def _weights(node: Node) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in node.policy.model.state_dict().items()}


def test_a_generating_member_shares_and_never_learns(tiny_model_dir: Path, tmp_path: Path) -> None:
    hub = MemoryHub()
    member = _node(tiny_model_dir, tmp_path / "g", seed=1, trains=False)
    learner = _node(tiny_model_dir, tmp_path / "l", seed=2)
    member.transport, learner.transport = hub.join("member"), hub.join("learner")
    before, learner_before = _weights(member), _weights(learner)
    try:
        rows, learned = [], []
        for r in range(3):
            rows.append(member.run_round(r))
            learned.append(learner.run_round(r))
            member.round = learner.round = r + 1
        # it made all I + J groups itself, shared them, trained on nothing
        assert [x["groups/local"] for x in rows] == [4, 4, 4]
        assert [x["groups/external"] for x in rows] == [0, 0, 0]
        assert [x["net/published"] for x in rows] == [4, 4, 4]
        assert all(x["train/sequences"] == 0 and x["train/tokens"] == 0 for x in rows)
        assert all(0.0 <= x["reward/mean"] <= 1.0 for x in rows)
        # it drained what the learner sent, unchecked and unkept
        sent = [x["net/published"] for x in learned]
        assert [x["net/received"] for x in rows] == [0, *sent[:2]] and sent[0] > 0
        assert all(x["net/accepted"] == x["net/rejected"] == 0 for x in rows)
        assert len(member.pool) == 0  # it took nothing in
        after = _weights(member)
        assert all(torch.equal(before[k], after[k]) for k in before)
        # the learner took the member's groups and learned
        assert learner.pool.counts()["member"]["accepted"] == 12
        changed = _weights(learner)
        assert any(not torch.equal(learner_before[k], changed[k]) for k in changed)
        member.save()
        learner.save()
    finally:
        member.close()
        learner.close()
    # it resumes from its own checkpoint (state only: no weights), and a generating
    # member refuses a training node's checkpoint instead of changing its model
    again = _node(tiny_model_dir, tmp_path / "g", seed=1, trains=False)
    try:
        again.resume()
        assert again.round == 3 and again.cumulative_reward == pytest.approx(
            sum(x["reward/mean"] for x in rows)
        )
    finally:
        again.close()
    wrong = _node(tiny_model_dir, tmp_path / "l", seed=2, trains=False)
    try:
        with pytest.raises(CheckpointError, match="training node's checkpoint"):
            wrong.resume()
    finally:
        wrong.close()


def _sevens_line(index: int, sevens: int = 1) -> str:
    ref = TaskRef.make(SEVENS, {}, 3, index)
    return line_of(ref, ["7777"] * sevens + ["abcd"] * (4 - sevens), model="file")


@pytest.mark.timeout(300)
def test_a_file_a_program_and_a_generating_member_reach_a_learning_node(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    swarm = re.sub("[^a-z0-9]+", "-", f"members-{os.getpid()}")
    config = node_config(tmp_path / "node.toml", tiny_model_dir, swarm)
    learner = NodeProcess("learner", tmp_path, config).start()
    member = NodeProcess("member", tmp_path, config).start(
        learner, extra=("--no-train", "--generate")
    )
    sharer_dir = tmp_path / "sharer"
    sharer = identity.peer_id_of(sharer_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SAPO_NET__MDNS": "false"}
    share = [sys.executable, "-m", "sapo_node.cli", "share", "--config", str(config)]
    share += ["--data-dir", str(sharer_dir), "--bootstrap", learner.addr, "--wait-s", "120"]
    share += ["--listen", "/ip4/127.0.0.1/tcp/0"]
    try:
        assert wait_until(lambda: learner.records(), 120, alive=(learner,)), learner.tail()
        # a program piping lines in (a file goes the same way once checked whole: test_share):
        # the bad line is reported by its number, the others are sent
        piped = "\n".join([_sevens_line(0), '{"task": 1}', _sevens_line(1, 2), _sevens_line(2, 3)])
        done = subprocess.run(
            [*share, "-"],
            input=piped + "\n",
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 1, done.stderr[-2000:]
        assert "line 2: refused: missing_field (completions)" in done.stderr
        assert "4 lines checked, 1 refused, 3 sent" in done.stdout

        def accepted() -> dict[str, int]:
            peers = summary(learner.data_dir / "pool.sqlite3")["peers"]
            return {p: c.get("accepted", 0) for p, c in peers.items()}

        assert wait_until(
            lambda: accepted().get(sharer) == 3 and accepted().get(member.peer_id, 0) >= 4,
            120,
            alive=(learner, member),
        ), (accepted(), learner.tail(), member.tail())
        rows = member.records()
        assert rows and all(r["groups/external"] == 0 and r["train/sequences"] == 0 for r in rows)
        assert sum(r["net/published"] for r in rows) >= 4
    finally:
        codes = stop_all(learner, member, timeout=30)
    assert codes == [0, 0], (learner.tail(), member.tail())
    # the member's checkpoint holds its state, not weights: it never had any to change
    latest = (member.data_dir / "checkpoints" / "LATEST").read_text().strip()
    state = json.loads((member.data_dir / "checkpoints" / latest / "state.json").read_text())
    assert state["round"] >= 1
