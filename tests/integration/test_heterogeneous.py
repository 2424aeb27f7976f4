"""Two nodes whose models share nothing but the task: different tokenizers (characters
against byte-level BPE), chat templates and end-of-turn tokens. Each re-encodes the
other's text with its own tokenizer and trains on it; what it trains decodes back to the
peer's text, up to its own length limit."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sapo_node.build import build_node
from sapo_node.config import load_config
from sapo_node.net.memory import MemoryHub
from sapo_node.node import Node
from tests.support.nodes import sevens_overrides
from tests.support.tiny import build_bpe_model

# max_new_tokens: the BPE node's few tokens are many characters, which fit the character
# node's limit whole; the character node's text is cut by the BPE node's limit
LIMITS = {"chars": 24, "bpe": 4}


@pytest.fixture(scope="module")
def bpe_model_dir(tmp_path_factory) -> Path:
    return build_bpe_model(tmp_path_factory.mktemp("bpe-model"))


def _node(model_dir: Path, data_dir: Path, seed: int) -> Node:
    overrides = sevens_overrides(
        model_dir,
        data_dir,
        node={"seed": seed},
        generation={"max_new_tokens": LIMITS[data_dir.name], "completions_per_task": 4},
        train={"lr": 1e-2, "local_groups": 2, "external_groups": 2},
        pool={"sampling": "uniform"},
    )
    return build_node(load_config(overrides=overrides, environ={}))


def test_nodes_with_other_tokenizers_train_on_each_others_text(
    tiny_model_dir: Path, bpe_model_dir: Path, tmp_path: Path
) -> None:
    hub = MemoryHub()
    chars = _node(tiny_model_dir, tmp_path / "chars", seed=1)
    bpe = _node(bpe_model_dir, tmp_path / "bpe", seed=2)
    chars.transport, bpe.transport = hub.join("chars"), hub.join("bpe")
    try:
        assert chars.policy.tokenizer.vocab_size != bpe.policy.tokenizer.vocab_size
        assert chars.policy.end_id != bpe.policy.end_id
        for r in range(3):
            records = [node.run_round(r) for node in (chars, bpe)]
        # each trained on the other's groups
        assert all(r["groups/external"] > 0 and r["train/sequences"] > 0 for r in records)
        # what it trains on: the groups left in its pool, and the peer's last round
        cases = {"whole": 0, "cut": 0}
        for me, name in ((chars, "bpe"), (bpe, "chars")):
            limit = LIMITS["chars" if me is chars else "bpe"]
            for message in me.transport.received():  # the peer's last round, checked in
                assert me.receive(message.data, message.author).outcome == "accepted"
            pooled = me.pool.sample(16, random.Random(0))
            assert pooled and {p.author for p in pooled} == {name}, (name, me.pool.counts())
            for p in pooled:
                group = me._as_group(p)
                # the prompt is this node's own chat template around the checked question
                assert group.prompt_ids == me.policy.encode_chat(
                    [
                        {"role": "system", "content": "Reply."},
                        {"role": "user", "content": p.group.question},
                    ]
                )
                for text, ids, done, sent_done in zip(
                    p.group.completions,
                    group.completion_ids,
                    group.finished,
                    p.group.finished,
                    strict=True,
                ):
                    assert all(0 <= i < len(me.policy.tokenizer) for i in ids)
                    body = ids[:-1] if done else ids
                    trained = me.policy.tokenizer.decode(body, skip_special_tokens=False)
                    assert me.policy.end_id not in body
                    own = me.policy.tokenizer(text, add_special_tokens=False)["input_ids"]
                    if len(own) < limit:  # fits: the peer's text exactly, closed if it was
                        assert trained == text and done == sent_done
                        cases["whole"] += 1
                    else:  # cut at this node's limit: a prefix, left open
                        assert text.startswith(trained) and len(body) == limit and not done
                        cases["cut"] += 1
        assert cases["whole"] > 0 and cases["cut"] > 0, cases  # both checks ran
    finally:
        chars.close()
        bpe.close()
