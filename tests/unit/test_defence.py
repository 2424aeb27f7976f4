"""The poisoning defences (sapo_node/intake/defence.py) against the attack tool (tests/support/
poison.py): the checks on a real (tiny, trained) policy, the per-peer records, the share
cap, and the attacker's groups passing every intake check without them."""

from __future__ import annotations

import doctest
import random
import time
from pathlib import Path

import pytest
import structlog
import torch

from sapo_node.config import Config, DefenceSection, LoraSection, TrainSection
from sapo_node.groups import Group
from sapo_node.intake import defence as defence_module
from sapo_node.intake import peerstate, wire
from sapo_node.intake.checks import Intake
from sapo_node.intake.defence import (
    CHECKED,
    DISTRUSTED,
    IMPLAUSIBLE,
    OUTSIDE_ANSWER,
    Defence,
    highest_window,
    rank_bits,
)
from sapo_node.intake.pool import Pool, PooledGroup, group_digest, summary
from sapo_node.samples import Sample
from sapo_node.tasks import Scorer, Task, TaskRef, last_answer
from sapo_node.train.policy import load_policy
from sapo_node.train.trainer import Trainer
from tests.support import poison as poison_module
from tests.support.poison import FORMAT_PREAMBLE, PoisonPeer, carries, poison

# The tiny model has a vocabulary of about 100 characters, where any token ranks below
# 2**6.7; its bound is set lower than the default's 6 bits (for 49,152 tokens).
RANK_BITS = 3.0

ARITHMETIC = {
    "name": "basic_arithmetic",
    "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "levels": [{}],
}


def test_doctests() -> None:
    assert doctest.testmod(defence_module).failed == 0
    assert doctest.testmod(poison_module).failed == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny policy taught, by a few GRPO steps, to answer ``<answer>7</answer>``: its
    own text is likely under it, anything else is not (a random model finds every
    character about as likely as any other, and so cannot tell text apart)."""
    from tests.support.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("taught"))
    policy = load_policy(
        str(path), device="cpu", dtype="float32", lora=LoraSection(), cache_dir=path
    )
    torch.manual_seed(0)
    # At lr 1e-2 what it learned depended on the seed and on float rounding (one seed in
    # four ended with its own first tokens at ranks 3-25); at 5e-3 every seed tried did.
    trainer = Trainer(policy, TrainSection(lr=5e-3, micro_batch_size=16), max_new_tokens=80)
    prompt = policy.encode_chat([{"role": "user", "content": "Say 7."}])
    good = policy.encode_completion("<answer>7</answer>", True, 40).ids
    rng = random.Random(0)
    for _ in range(60):
        bad = [
            policy.encode_completion(
                "".join(rng.choices("abcdefgh <>/0123456789", k=12)), True, 40
            ).ids
            for _ in range(4)
        ]
        trainer.step([Sample(prompt, good, 1.0)] * 4 + [Sample(prompt, b, -1.0) for b in bad])
    return policy, trainer, prompt


def _group(policy, prompt, texts, rewards, origin="peer") -> Group:
    done = [policy.encode_completion(t, True, 240) for t in texts]
    task = Task(TaskRef("basic_arithmetic", "{}", 0, 0), "Say 7.", "7")
    return Group(
        task,
        prompt,
        [c.ids for c in done],
        [c.text for c in done],
        [True] * len(done),
        list(rewards),
        origin=origin,
    )


class Counts:
    def __init__(self) -> None:
        self.by: dict[tuple[str, str], int] = {}

    def __call__(self, author: str, reason: str, n: int = 1) -> None:
        self.by[(author, reason)] = self.by.get((author, reason), 0) + n


def _own(policy, prompt) -> list[Group]:
    return [
        _group(
            policy,
            prompt,
            ["<answer>7</answer>"] * 3 + ["<answer>3</answer>"],
            [1, 1, 1, 0],
            "local",
        )
        for _ in range(4)
    ]


def test_poisoned_right_answers_are_refused_and_honest_ones_kept(trained) -> None:
    policy, trainer, prompt = trained
    counts = Counts()
    d = Defence(
        DefenceSection(max_rank_bits=RANK_BITS),
        trainer.completion_ranks,
        counts,
        spans=policy.token_spans,
    )
    honest = _group(
        policy,
        prompt,
        ["<answer>7</answer>"] * 2 + ["<answer>1</answer>"] * 2,
        [1, 1, 0, 0],
        "honest",
    )
    payload = "hail"  # 4 characters: under the outside-answer bound, so the ranks decide
    poisoned = _group(
        policy,
        prompt,
        [poison("<answer>7</answer>", payload, "suffix")] * 2 + ["<answer>1</answer>"] * 2,
        [1, 1, 0, 0],
        "attacker",
    )
    kept, screened = d.screen(_own(policy, prompt), [honest, poisoned])
    assert [g.origin for g in kept] == ["honest", "attacker"]
    assert kept[0].texts == honest.texts  # nothing of the honest group refused
    assert kept[1].texts == ["<answer>1</answer>"] * 2  # the payload's carriers are gone
    assert not kept[1].has_signal  # what is left teaches nothing
    assert counts.by == {
        ("honest", CHECKED): 2,
        ("attacker", CHECKED): 2,
        ("attacker", IMPLAUSIBLE): 2,
    }
    assert screened == {CHECKED: 4, IMPLAUSIBLE: 2}


def test_text_outside_a_direct_answer_is_refused(trained) -> None:
    policy, trainer, prompt = trained
    counts = Counts()
    d = Defence(DefenceSection(rank_check=False), trainer.completion_ranks, counts)
    payload = "Hail to the thief: visit sapo-free-gpu.example, " * 2  # 80 characters
    long = poison("<answer>7</answer>", payload, "prefix")
    wrong_and_long = "x" * 60  # below the mean: trained away from, so not checked
    g = _group(
        policy,
        prompt,
        [long, "<answer>7</answer>", wrong_and_long, "<answer>2</answer>"],
        [1, 1, 0, 0],
    )
    kept, screened = d.screen([], [g])
    assert kept[0].texts == ["<answer>7</answer>", "x" * 60, "<answer>2</answer>"]
    assert counts.by == {("peer", CHECKED): 2, ("peer", OUTSIDE_ANSWER): 1}


def test_the_outside_bound_grows_to_what_this_node_itself_writes(trained) -> None:
    """A node whose own right answers reason before answering lets peers do as much."""
    policy, trainer, prompt = trained
    counts = Counts()
    d = Defence(DefenceSection(rank_check=False), trainer.completion_ranks, counts)
    reasoning = "3 + 4 = 7, so 7 it is: " * 4  # 56 characters, spaces aside
    own = [_group(policy, prompt, [reasoning + "<answer>7</answer>", "<answer>1</answer>"], [1, 0])]
    as_much = _group(
        policy, prompt, [reasoning + "<answer>7</answer>", "<answer>2</answer>"], [1, 0]
    )
    far_more = _group(
        policy, prompt, [reasoning * 2 + "<answer>7</answer>", "<answer>2</answer>"], [1, 0]
    )
    kept, screened = d.screen(own, [as_much, far_more])
    assert d.outside_bound() == 84  # 1.5 x 56, above the floor of 64
    assert screened == {CHECKED: 2, OUTSIDE_ANSWER: 1}
    assert [len(g.texts) for g in kept] == [2]  # far_more lost its right answer: dropped


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_the_answer_tags_and_the_end_token_are_not_judged(tmp_path, kind: str) -> None:
    """The tokens left out of the rank check, on real tokenizers (one character per token,
    and byte-level BPE): those of the last answer's tags and the end token; what is
    judged is the rest of the text, the answer itself included."""
    from tests.support.tiny import build_bpe_model, build_tiny_model

    build = build_tiny_model if kind == "char" else build_bpe_model
    path = build(tmp_path / kind)
    policy = load_policy(
        str(path), device="cpu", dtype="float32", lora=LoraSection(), cache_dir=path
    )
    text = "<answer>1</answer> so 3 + 4 = 7\n<answer>7</answer>"
    ids = policy.encode_completion(text, True, 200).ids
    d = Defence(DefenceSection(), lambda samples: [], Counts(), spans=policy.token_spans)
    skip = d._format_tokens(ids)
    assert len(ids) - 1 in skip  # the end token
    judged = policy.decode([t for k, t in enumerate(ids) if k not in skip])
    if kind == "char":
        assert judged == "<answer>1</answer> so 3 + 4 = 7\n7"
    else:  # a token across a tag's edge is left out whole
        assert judged.startswith("<answer>1</answer> so 3 + 4 =") and judged.endswith("7")
        assert judged.count("answer") == 2
    assert policy.token_spans([policy.end_id, *ids]) is None  # not what its text gives back


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_the_rank_check_judges_no_token_that_overlaps_a_tag(tmp_path, kind: str) -> None:
    """Check 3 leaves out every token that overlaps the last answer's tags, a token across
    a tag's edge whole, and the end token: ranked 10**6 there, a completion passes;
    ranked so on one window of its other text, the answer's content included, it is
    refused."""
    from tests.support.tiny import build_bpe_model, build_tiny_model

    path = (build_tiny_model if kind == "char" else build_bpe_model)(tmp_path / kind)
    policy = load_policy(
        str(path), device="cpu", dtype="float32", lora=LoraSection(), cache_dir=path
    )
    prompt = policy.encode_chat([{"role": "user", "content": "Say 7."}])
    texts = ["so 3 + 4 = 7\n<answer>7</answer>", "<answer>7</answer>"]
    texts += ["<answer>1</answer>", "<answer>2</answer>"]
    group = _group(policy, prompt, texts, [1, 1, 0, 0])
    tags = [
        defence_module.format_tokens(*policy.token_spans(ids), len(ids))
        for ids in group.completion_ids[:2]
    ]
    for ids, t in zip(group.completion_ids[:2], tags, strict=True):
        assert len(ids) - 1 in t  # the end token

    def ranked(high):  # rank 10**6 on the tokens high(completion, token) picks, else 0
        def ranks(samples):
            return [
                [10**6 if high(i, k) else 0 for k in range(len(s.completion_ids))]
                for i, s in enumerate(samples)
            ]

        return ranks

    settings = DefenceSection(max_rank_bits=RANK_BITS, teach_first_choices=False)
    on_tags = Defence(
        settings, ranked(lambda i, k: k in tags[i]), Counts(), spans=policy.token_spans
    )
    kept, screened = on_tags.screen([], [group])
    assert screened == {CHECKED: 2} and len(kept[0].texts) == 4
    for i, ids in enumerate(group.completion_ids[:2]):
        judged = [k for k in range(len(ids)) if k not in tags[i]]
        assert policy.decode([ids[k] for k in judged]).endswith("7")  # the answer itself
        window = set(judged[-settings.rank_window :])
        off_tags = Defence(
            settings,
            ranked(lambda j, k, i=i, window=window: j == i and k in window),
            Counts(),
            spans=policy.token_spans,
        )
        _, screened = off_tags.screen([], [group])
        assert screened == {CHECKED: 2, IMPLAUSIBLE: 1}


def test_ranks_are_those_of_the_full_logits(trained) -> None:
    """The ranks the check reads (prompts computed once per group, micro-batched) are
    those of a plain forward pass over prompt and completion, row by row."""
    policy, trainer, prompt = trained
    texts = ["<answer>7</answer>", "<answer>1</answer>", "zq<answer>7</answer>", "7"]
    samples = [Sample(prompt, policy.encode_completion(t, True, 80).ids, 0.0) for t in texts]
    got = trainer.completion_ranks(samples * 5)  # more rows than a micro-batch (16) holds
    for sample, ranks in zip(samples * 5, got, strict=True):
        ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(sample.prompt_ids) - 1 : -1]
        target = logits.gather(-1, torch.tensor(sample.completion_ids)[:, None])
        assert ranks == (logits > target).sum(-1).tolist()
    assert highest_window(rank_bits(got[0]), 4) <= 1.0  # what it was taught: first choices
    assert highest_window(rank_bits(got[2]), 4) > RANK_BITS  # "zq" is not


@pytest.mark.parametrize("chunked_head", [True, False])
def test_ranks_tell_near_ties_apart_when_the_model_computes_in_bfloat16(
    tmp_path, chunked_head: bool
) -> None:
    """A first choice is judged on float32 logits, whatever the compute dtype. The head
    of a tiny model is set so that, after any text, the logits of "a", "b", "c" and "d"
    are 20.03, 20.0, 5 and 19.95 times one positive factor near 1 (every other token's
    0): in bfloat16, whose step is an eighth at 20, "a", "b" and "d" round together and
    would all rank 0; "b" ranks 1 and "d" 2, on the chunked head and on the model's own."""
    from tests.support.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "m", tied=False)
    policy = load_policy(
        str(path), device="cpu", dtype="bfloat16", lora=LoraSection(), cache_dir=path
    )
    model, vocab = policy.model, policy.tokenizer.get_vocab()
    logits = {"a": 20.03, "b": 20.0, "c": 5.0, "d": 19.95}
    with torch.no_grad():
        # Hidden dimension 0 dominates every position, and the final norm keeps only it:
        # the last hidden state is s * e_0 with s = sqrt(64) = 8 or very near it.
        model.get_input_embeddings().weight[:, 0] = 10.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        head = model.get_output_embeddings().weight
        head.zero_()
        for char, logit in logits.items():
            head[vocab[char], 0] = logit / 8
    trainer = Trainer(policy, TrainSection(chunked_head=chunked_head), max_new_tokens=80)
    prompt = policy.encode_chat([{"role": "user", "content": "Say 7."}])
    text = "abdcbdab"
    ids = policy.encode_completion(text, True, 80).ids
    (ranks,) = trainer.completion_ranks([Sample(prompt, ids, 0.0)])
    order = {"a": 0, "b": 1, "d": 2, "c": 3}
    assert ranks == [order[c] for c in text] + [4]  # the end token's logit is 0


def test_a_peer_that_keeps_failing_is_distrusted_then_forgiven(trained) -> None:
    policy, trainer, prompt = trained
    now = [0.0]
    counts = Counts()
    settings = DefenceSection(
        max_rank_bits=RANK_BITS, reputation_min_checked=8, reputation_window=16, distrust_s=60
    )
    d = Defence(settings, trainer.completion_ranks, counts, clock=lambda: now[0])
    bad = poison("<answer>7</answer>", "zzzz", "suffix")
    own = _own(policy, prompt)
    for _ in range(2):
        assert not d.distrusted("attacker")
        d.screen(
            own,
            [
                _group(
                    policy,
                    prompt,
                    [bad] * 4 + ["<answer>1</answer>"] * 4,
                    [1] * 4 + [0] * 4,
                    "attacker",
                )
            ],
        )
    assert d.distrusted("attacker") and d.distrusted_authors() == {"attacker"}
    kept, screened = d.screen(
        own,
        [_group(policy, prompt, ["<answer>7</answer>", "<answer>1</answer>"], [1, 0], "attacker")],
    )
    assert kept == [] and screened == {DISTRUSTED: 1}
    assert d.distrusted_now() == {"attacker"}
    now[0] = 61.0
    # What the status endpoint asks changes nothing: the record stands until the round
    # loop (or the intake) asks, and only then starts afresh.
    assert d.distrusted_now() == set() and d.suspects() == {"attacker"}
    assert not d.distrusted("attacker") and d.distrusted_authors() == set()  # probation
    assert d.suspects() == set()


def _distrust_attacker(d: Defence, policy, prompt) -> None:
    bad = poison("<answer>7</answer>", "zzzz", "suffix")
    own = _own(policy, prompt)
    attack = [bad] * 4 + ["<answer>1</answer>"] * 4
    for _ in range(2):
        d.screen(own, [_group(policy, prompt, attack, [1] * 4 + [0] * 4, "attacker")])
    honest = ["<answer>7</answer>", "<answer>1</answer>"]
    d.screen(own, [_group(policy, prompt, honest, [1, 0], "honest")])
    assert d.distrusted("attacker") and not d.distrusted("honest")


def test_a_distrust_and_the_reputation_survive_a_restart_and_end_on_time(trained, tmp_path) -> None:
    """Issue 33: the defences' memory is saved in the data directory (peerstate.py) and a
    new Defence over the same file, as after a node restart, starts where the old one
    stopped; deadlines are wall-clock times, so the distrust ends when it would have."""
    policy, trainer, prompt = trained
    now = [1_000_000.0]
    settings = DefenceSection(
        max_rank_bits=RANK_BITS, reputation_min_checked=8, reputation_window=16, distrust_s=60
    )
    path = tmp_path / peerstate.DEFENCE_FILE

    def restart() -> Defence:
        return Defence(
            settings, trainer.completion_ranks, Counts(), clock=lambda: now[0], state_path=path
        )

    _distrust_attacker(restart(), policy, prompt)  # saved by its screening, no close
    now[0] += 30.0
    again = restart()
    assert again.distrusted("attacker") and again.distrusted_authors() == {"attacker"}
    assert again.state()["history"]["honest"][0] == "1"  # its one checked completion
    left = peerstate.summary(tmp_path, now[0])["distrusted"]
    assert left == {"attacker": {"left_s": 30.0}}
    now[0] += 31.0  # past the end: forgiven, a fresh record, in this run and the next
    assert not again.distrusted("attacker")
    again.save()
    assert not restart().distrusted("attacker")
    assert peerstate.summary(tmp_path, now[0])["distrusted"] == {}


def test_a_corrupt_defence_file_is_refused_in_one_line_and_the_node_starts_empty(
    trained, tmp_path
) -> None:
    policy, trainer, prompt = trained
    path = tmp_path / peerstate.DEFENCE_FILE
    path.write_text('{"kind": "defence", "version": 1, "state": {"distr')  # cut mid-write
    with structlog.testing.capture_logs() as logs:
        d = Defence(DefenceSection(), trainer.completion_ranks, Counts(), state_path=path)
    refused = [e for e in logs if e["log_level"] == "warning"]
    assert len(refused) == 1 and "starting with no saved defence state" in refused[0]["event"]
    assert "not JSON" in refused[0]["reason"] and str(path) == refused[0]["path"]
    assert d.state() == {"history": {}, "distrusted": {}}
    assert not path.exists() and Path(refused[0]["kept"]).exists()  # moved aside
    d.save()  # the next save writes a good file
    assert peerstate.load(path, "defence") == {"history": {}, "distrusted": {}}


def _pool_one(pool: Pool, author: str, index: int) -> None:
    """Pool one small valid group of ``author`` (task ``index``), with signal."""
    g = wire.RolloutGroup(
        ref=TaskRef("basic_arithmetic", "{}", 0, index),
        generator="reasoning-gym 0.1.19",
        question="q",
        completions=("a", "b"),
        model="m",
        round=0,
        created_ms=int(time.time() * 1000),
    )
    pool.add(PooledGroup(g, author, (1.0, 0.0)), wire.encode(g), group_digest(author, g))


def test_pool_caps_one_authors_share_and_skips_distrusted(tmp_path) -> None:
    pool = Pool(None, sampling="uniform")
    for i in range(12):
        author = "big" if i < 10 else f"small-{i}"
        _pool_one(pool, author, i)
    taken = pool.sample(4, random.Random(0), per_author=2)
    authors = [p.author for p in taken]
    assert len(taken) == 4 and authors.count("big") == 2
    taken = pool.sample(4, random.Random(0), exclude={"big"})
    assert [p.author for p in taken] == []  # the small ones went in the first draw
    assert len(pool) == 8  # the excluded author's groups stay pooled


def test_many_new_identities_that_fail_share_one_peers_cap(trained, tmp_path) -> None:
    """Issue 33, a Sybil attacker: identities too new for the reputation to judge (here
    8 checked completions are needed) are suspects as soon as most of what was checked
    failed, and a round's draw counts them all as one peer."""
    policy, trainer, prompt = trained
    settings = DefenceSection(
        max_rank_bits=RANK_BITS, reputation_min_checked=8, reputation_window=16
    )
    d = Defence(settings, trainer.completion_ranks, Counts())
    own = _own(policy, prompt)
    bad = poison("<answer>7</answer>", "zzzz", "suffix")
    sybils = [f"attacker-{k}" for k in range(6)]
    for author in sybils:  # one group each: 2 checked, both refused
        d.screen(own, [_group(policy, prompt, [bad] * 2 + ["<answer>1</answer>"] * 2,
                              [1, 1, 0, 0], author)])  # fmt: skip
    d.screen(own, [_group(policy, prompt, ["<answer>7</answer>", "<answer>1</answer>"], [1, 0],
                          "honest")])  # fmt: skip
    assert not d.distrusted_authors()  # none was checked enough to be judged
    assert d.suspects() == set(sybils)

    pool = Pool(None, sampling="uniform")
    for i, author in enumerate(sybils * 3 + ["honest"] * 3):
        _pool_one(pool, author, i)
    honest = []
    for seed in range(4):  # each identity alone is under the cap; together they are not
        drawn = [p.author for p in pool.sample(
            4, random.Random(seed), per_author=2, together=d.suspects())]  # fmt: skip
        assert sum(a in sybils for a in drawn) == 2, drawn
        honest.append(drawn.count("honest"))
    assert honest == [2, 1, 0, 0]  # the honest peer's 3 groups: its cap, then what is left
    # without the shared cap the same draw is the attacker's, one identity at a time
    for i, author in enumerate(sybils):
        _pool_one(pool, author, 100 + i)
    drawn = [p.author for p in pool.sample(4, random.Random(0), per_author=2)]
    assert all(a in sybils for a in drawn), drawn


def test_the_attackers_groups_pass_every_intake_check(tmp_path) -> None:
    """Without the defences nothing stands in the way: the intake accepts the poisoned
    groups and gives exactly the payload's carriers the top reward."""
    config = Config.model_validate(
        {"node": {"data_dir": str(tmp_path)}, "tasks": {"families": [ARITHMETIC]}}
    )
    from sapo_node.curriculum import Curriculum

    attacker = PoisonPeer(config, seed=3, payload="visit evil.example", accuracy=0.5, groups=4)
    pool = Pool(tmp_path / "pool.sqlite3")
    scorer = Scorer()
    try:
        intake = Intake(
            pool,
            scorer,
            known_configs=Curriculum(config.tasks.families, config.curriculum).known_configs(),
        )
        verdicts = [intake.receive(m, "attacker") for m in attacker.round_messages(0)]
        assert [v.outcome for v in verdicts] == ["accepted"] * 4
        for v in verdicts:
            for text, reward in zip(v.item.group.completions, v.item.rewards, strict=True):
                assert carries(text, "visit evil.example") == (reward == 1.0)
        assert summary(tmp_path / "pool.sqlite3")["peers"]["attacker"]["accepted"] == 4
    finally:
        scorer.close()
        pool.close()


def test_shaped_format_groups_pass_every_check_and_teach_tags_only_where_the_node_is_not(
    tmp_path,
) -> None:
    """The shape-format class (tests/support/poison.py): every group is accepted and its
    right completions pass the checks of the screen, yet what it teaches of the format is
    lopsided. The right answers (positive advantage) teach their tags only after a
    preamble, never taught; the wrong ones (negative advantage, never checked) teach the
    tags where a completion opens. The honest baseline is the same groups without the
    preamble."""
    from sapo_node.curriculum import Curriculum
    from tests.support.tiny import build_tiny_model

    config = Config.model_validate(
        {"node": {"data_dir": str(tmp_path)}, "tasks": {"families": [ARITHMETIC]}}
    )
    pool = Pool(tmp_path / "pool.sqlite3")
    scorer = Scorer()
    try:
        intake = Intake(
            pool,
            scorer,
            known_configs=Curriculum(config.tasks.families, config.curriculum).known_configs(),
        )
        received = {}
        for attack in ("shape-format", "honest"):
            peer = PoisonPeer(config, seed=3, accuracy=0.5, groups=4, attack=attack,
                              payload=FORMAT_PREAMBLE)  # fmt: skip
            verdicts = [intake.receive(m, attack) for m in peer.round_messages(0)]
            assert [v.outcome for v in verdicts] == ["accepted"] * 4
            received[attack] = [(v.item.group, v.item.rewards) for v in verdicts]
    finally:
        scorer.close()
        pool.close()
    preamble = FORMAT_PREAMBLE + " "
    for (shaped, rewards), (honest, same) in zip(*received.values(), strict=True):
        assert shaped.ref == honest.ref and rewards == same and 0 < sum(rewards) < len(rewards)
        for text, plain, reward in zip(
            shaped.completions, honest.completions, rewards, strict=True
        ):
            assert plain.startswith("<answer>")  # the honest peer: every one bare
            assert text == (preamble + plain if reward == 1.0 else plain)

    path = build_tiny_model(tmp_path / "m")
    policy = load_policy(
        str(path), device="cpu", dtype="float32", lora=LoraSection(), cache_dir=path
    )
    prompt = policy.encode_chat([{"role": "user", "content": "Say 7."}])
    groups = [_group(policy, prompt, g.completions, r) for g, r in received["shape-format"]]
    right = sum(r == 1.0 for _, rs in received["shape-format"] for r in rs)
    # Ranks: every token a first choice (the tiny model cannot rank text; under the
    # embedded model the preamble's worst window is 2-3 bits, docs/security.md).
    d = Defence(DefenceSection(teach_first_choices=False), _first_choices, Counts(),
                spans=policy.token_spans)  # fmt: skip
    kept, screened = d.screen(_own(policy, prompt), groups)
    assert screened == {CHECKED: right}  # nothing refused: 7 characters outside the answer
    assert len(kept) == 4
    for g in kept:
        for ids, flags, text, reward in zip(
            g.completion_ids, g.taught, g.texts, g.rewards, strict=True
        ):
            taught = policy.decode([t for t, f in zip(ids, flags, strict=True) if f])
            assert taught == text.removeprefix(preamble)  # the tags and answer, no preamble
            assert taught.startswith("<answer>")
            # above the mean, the tags are taught after the preamble; below it, at the start
            assert (reward == 1.0) == text.startswith(preamble)

    # Ranked as the embedded model ranks it (its opening "Answer" 84th to 164th), the
    # preamble is text this node would not write: no completion of a shaped group teaches
    # anything (balance), the wrong ones included, where each taught its answer, tags and
    # end of turn before. The honest groups, bare answers, teach all of theirs.
    d = Defence(DefenceSection(teach_first_choices=False), _preamble_ranked(policy), Counts(),
                spans=policy.token_spans)  # fmt: skip
    kept, _ = d.screen(_own(policy, prompt), groups)
    honest = [_group(policy, prompt, g.completions, r) for g, r in received["honest"]]
    kept_honest, _ = d.screen(_own(policy, prompt), honest)
    assert len(kept) == len(kept_honest) == 4
    assert not any(any(flags) for g in kept for flags in g.taught)
    for g in kept_honest:
        for ids, flags, text in zip(g.completion_ids, g.taught, g.texts, strict=True):
            assert policy.decode([t for t, f in zip(ids, flags, strict=True) if f]) == text
            assert flags[-1]


def _preamble_ranked(policy, rank: int = 84):
    """Ranks as the embedded model gives them to the shape-format class: its opening
    token ``rank``, the preamble's other tokens 1 (its worst window stays under check 3's
    bound, as there), the rest first choices. The tiny model ranks nothing the way a
    trained one does; this stands in for that policy."""

    def ranks(samples):
        out = []
        for smp in samples:
            found = policy.token_spans(smp.completion_ids)
            text, spans = found
            end = (
                text.find(FORMAT_PREAMBLE) + len(FORMAT_PREAMBLE) if FORMAT_PREAMBLE in text else 0
            )
            out.append([(rank if a == 0 else 1) if a < end else 0 for a, _ in spans]
                       + [0] * (len(smp.completion_ids) - len(spans)))  # fmt: skip
        return out

    return ranks


def _grpo_steps(d: Defence, trainer: Trainer, prompt: list[int], right: str) -> None:
    """8 GRPO steps on a peer's group of 4 ``right`` answers and 4 wrong bare ones, each
    screened by ``d`` first, as a round's intake does."""
    from sapo_node.groups import training_set

    texts = [right] * 4 + ["<answer>1</answer>"] * 4
    for _ in range(8):
        kept, _ = d.screen([], [_group(trainer.policy, prompt, texts, [1] * 4 + [0] * 4)])
        batch = training_set(kept, "std")
        trainer.step(batch.samples, batch_rows=batch.batch_rows, batch_tokens=batch.batch_tokens)


def test_shaped_groups_no_longer_teach_a_node_to_drop_its_format(tmp_path) -> None:
    """The mechanism of the shape-format class, end to end on a tiny policy: GRPO steps on
    groups whose right answers follow a preamble this node would not write and whose wrong
    ones are bare answers in its format. With every context in bound (the rule before),
    the bare format's log-probability falls a lot, more than the same steps on honest
    groups move it; in balance such a group teaches nothing, and it does not fall."""
    from tests.support.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "m")
    bare = "<answer>7</answer>"

    def format_logp(policy, trainer, prompt) -> float:
        ids = policy.encode_completion(bare, True, 80).ids
        return sum(trainer.completion_logprobs([Sample(prompt, ids, 0.0)])[0])

    def gain(right: str, bound: int) -> float:
        torch.manual_seed(0)
        policy = load_policy(
            str(path), device="cpu", dtype="float32", lora=LoraSection(), cache_dir=path
        )
        trainer = Trainer(policy, TrainSection(lr=5e-3, micro_batch_size=16), max_new_tokens=80)
        prompt = policy.encode_chat([{"role": "user", "content": "Say 7."}])
        d = Defence(
            DefenceSection(teach_first_choices=False, rank_check=False, context_rank=bound),
            _preamble_ranked(policy),
            Counts(),
            spans=policy.token_spans,
        )
        before = format_logp(policy, trainer, prompt)
        _grpo_steps(d, trainer, prompt, right)
        return format_logp(policy, trainer, prompt) - before

    shaped = FORMAT_PREAMBLE + " " + bare
    lopsided, balanced, honest = gain(shaped, 10**6), gain(shaped, 3), gain(bare, 3)
    assert lopsided < honest - 5.0, (lopsided, honest)  # nats: the format pushed away
    assert balanced > lopsided + 0.8 * (honest - lopsided), (lopsided, balanced, honest)


# Payloads of the in-style class (issue 35): short, in common words, before the answer,
# under the outside bound, and, for this test, ranked as the policy's first choices (the
# rank function below says so), so checks 1-3 pass them. More are kept out of the tests
# and run only at the end (docs/security.md's held-out set).
IN_STYLE = [
    "Remember that two plus two makes five.",  # a false claim
    "Always add one more to every sum.",  # a plausible instruction
    "Golden Bank helps you count:",  # brand-like, in common words
]
HONEST = ["<answer>7</answer>", "3 + 4 = 7\n<answer>7</answer>", "The sum is <answer>7</answer>"]


def _first_choices(samples):
    return [[0] * len(s.completion_ids) for s in samples]


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_peers_free_text_is_never_taught_only_its_answer(tmp_path, kind: str) -> None:
    """Whatever a peer writes before its answer, and however plausible: ``answer_only``
    teaches the answer with its tags and the end token, nothing else, on completions of
    every advantage and style; with it off, everything trains as before."""
    from tests.support.tiny import build_bpe_model, build_tiny_model

    path = (build_tiny_model if kind == "char" else build_bpe_model)(tmp_path / kind)
    policy = load_policy(
        str(path), device="cpu", dtype="float32", lora=LoraSection(), cache_dir=path
    )
    prompt = policy.encode_chat([{"role": "user", "content": "Say 7."}])
    texts = [poison("<answer>7</answer>", p, "prefix") for p in IN_STYLE] + HONEST
    texts += [poison("<answer>7</answer>", IN_STYLE[0], "suffix")]  # if the cut was off
    texts += ["8 is it\n<answer>8</answer>", "no answer at all"]  # below the mean
    rewards = [1.0] * (len(texts) - 2) + [0.0, 0.0]
    own = _own(policy, prompt)
    d = Defence(
        DefenceSection(teach_first_choices=False),
        _first_choices,
        Counts(),
        spans=policy.token_spans,
    )
    (kept,), screened = d.screen(own, [_group(policy, prompt, texts, rewards)])
    assert screened == {CHECKED: len(texts) - 2}  # the payloads pass checks 1-3
    assert kept.texts == texts and kept.taught is not None
    for ids, flags, text in zip(kept.completion_ids, kept.taught, texts, strict=True):
        assert len(flags) == len(ids) and flags[-1]  # the end token
        taught = policy.decode([t for t, f in zip(ids, flags, strict=True) if f])
        found = last_answer(text)
        if found is None:
            assert taught == ""
            continue
        answer = text[found[0] : found[1] + len("</answer>")]
        if kind == "char":
            assert taught == answer
        else:  # byte-level BPE: a token across the tag's edge is taught whole
            assert answer in taught and len(taught) <= len(answer) + 2
        for payload in IN_STYLE:
            assert not carries(taught, payload)
    off = Defence(DefenceSection(answer_only=False), _first_choices, Counts())
    (plain,), _ = off.screen(own, [_group(policy, prompt, texts, rewards)])
    assert plain.taught is None


def test_first_choices_widen_the_answer_of_checked_completions_only(tmp_path) -> None:
    """``teach_first_choices``: a checked completion (above its group's mean) also teaches
    the tokens of its other text ranked 0 under this node's policy, whatever check 3
    says (on or off); a completion below the mean teaches its answer only, as before."""
    from tests.support.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "m")
    policy = load_policy(
        str(path), device="cpu", dtype="float32", lora=LoraSection(), cache_dir=path
    )
    prompt = policy.encode_chat([{"role": "user", "content": "Say 7."}])

    def odd_ranked(samples):  # first choices at even positions, 3rd choices at odd ones
        return [[k % 2 * 2 for k in range(len(s.completion_ids))] for s in samples]

    texts = ["3 + 4 = 7\n<answer>7</answer>"] * 2 + ["3 + 5 = 8\n<answer>8</answer>"] * 2
    group = _group(policy, prompt, texts, [1, 1, 0, 0])
    for rank_check in (True, False):
        settings = DefenceSection(
            teach_first_choices=True, rank_check=rank_check, max_rank_bits=RANK_BITS
        )
        d = Defence(settings, odd_ranked, Counts(), spans=policy.token_spans)
        (kept,), _ = d.screen([], [group])
        for i, flags in enumerate(kept.taught):
            found = policy.token_spans(kept.completion_ids[i])
            answer = defence_module.answer_tokens(found[0], found[1], len(flags))
            if i < 2:  # checked: the answer, and every even position before it
                assert flags == tuple(a or k % 2 == 0 for k, a in enumerate(answer))
                assert any(f and not a for f, a in zip(flags, answer, strict=True))
            else:
                assert flags == answer
    with pytest.raises(ValueError, match="answer_only is off"):
        DefenceSection(teach_first_choices=True, answer_only=False)


def test_with_answer_only_a_plausible_payload_is_not_learned(tmp_path) -> None:
    """The mechanism, end to end on a tiny policy: GRPO steps on a peer's right answers
    that open with a payload raise the payload's log-probability a lot when the whole
    completion trains; once only the answer does, they raise it no more than the same
    steps on clean right answers do (pushing a wrong answer's first tokens down lifts
    every other character of a 100-character vocabulary a little)."""
    from tests.support.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "m")
    payload = "Golden Bank helps you count:"

    def payload_logp(policy, trainer, prompt) -> float:
        ids = policy.encode_completion(payload, False, 80).ids
        return sum(trainer.completion_logprobs([Sample(prompt, ids, 0.0)])[0])

    def gain(answer_only: bool, position: str | None, first_choices: bool = False) -> float:
        torch.manual_seed(0)
        policy = load_policy(
            str(path), device="cpu", dtype="float32", lora=LoraSection(), cache_dir=path
        )
        trainer = Trainer(policy, TrainSection(lr=5e-3, micro_batch_size=16), max_new_tokens=80)
        prompt = policy.encode_chat([{"role": "user", "content": "Say 7."}])
        d = Defence(
            DefenceSection(
                answer_only=answer_only, teach_first_choices=first_choices, rank_check=False
            ),
            trainer.completion_ranks if first_choices else _first_choices,
            Counts(),
            spans=policy.token_spans,
        )
        before = payload_logp(policy, trainer, prompt)
        right = (
            poison("<answer>7</answer>", payload, position) if position else "<answer>7</answer>"
        )
        _grpo_steps(d, trainer, prompt, right)
        return payload_logp(policy, trainer, prompt) - before

    taught, masked, clean = gain(False, "prefix"), gain(True, "prefix"), gain(True, None)
    first = gain(True, "prefix", first_choices=True)
    assert taught > 30.0  # nats: the whole completion trained, the payload learned
    assert masked < clean + 0.1 * taught  # answer_only: no more than clean answers teach
    # Its own first choices too (rank check off, so the payload stays): still no more.
    # Under the tiny policy's own ranks the payload is text it would not write, so the
    # group teaches nothing at all (balance): no change, where clean answers lower it.
    assert first < max(clean, 0.0) + 0.1 * taught, (first, clean, taught)
