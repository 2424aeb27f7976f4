"""Benchmark the wire format, the intake and the rollout pool.

Prints, in one process:
  a. strict decode + validation throughput (wire.decode) of real encoded groups, against
     plain ``msgpack.unpackb`` of the same bytes;
  b. full intake throughput (Intake.receive with a real sandboxed Scorer) on ReasoningGym
     basic_arithmetic groups from distinct references (10 peers' seeds, the default
     config), split into decode, regenerate (make_task), score (sandbox) and pool;
  c. pool latency with 10,000 groups held: sample(4) per policy (and the policy alone),
     add() on a full pool;
  d. the intake's cost per group against one round's generate time: measured here on the
     embedded model when ``--model-cache DIR`` holds its safetensors copy, otherwise taken
     from ``--generate-s`` (by default the figure in docs/benchmarks.md, not measured here);
  e. paper, balanced and teaching sampling on a skewed swarm (one author publishes 90% of
     the groups, 9 others the rest; the node fails one family, need 1, and mostly solves
     the others, need 0.2): distinct authors per draw, reward spread of the groups drawn,
     share of the draws on the family it fails (1 in 9 of the groups), share of the draws
     that go to the dominant author; once on fresh snapshots of a skewed pool (the policy
     alone), once through a node's Pool with the default bounds (draws take groups out,
     quotas and expiry act).

DIR for --model-cache is a node's ``models`` directory (data_dir/models), as made by
sapo_node.train.policy on a first start.

Usage: python scripts/bench_pool.py [--model-cache DIR] [--generate-s S] [--intake-groups N]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sapo_node.intake import wire  # noqa: E402
from sapo_node.intake.pool import Pool, PooledGroup, group_digest  # noqa: E402
from sapo_node.intake.sampling import POLICIES, Candidate, reward_spread  # noqa: E402
from sapo_node.tasks import PAPER_FAMILIES, TaskRef, generator_of, make_task  # noqa: E402
from scripts.support.measure import best_rate, pct  # noqa: E402
from scripts.support.messages import COMPLETIONS, completion  # noqa: E402

# Round 1's generate time in docs/benchmarks.md ("Generation path and round overhead").
DOCS_GENERATE_S = 20.9
POOL_SIZE = 10_000


def basic_arithmetic_messages(
    seeds: list[int], per_seed: int, rng: random.Random
) -> list[tuple[str, bytes]]:
    """(author, bytes) of real groups: the default config's basic_arithmetic tasks, one
    peer per seed, half the completions right on average."""
    from sapo_node.config import load_config
    from sapo_node.curriculum import Curriculum

    cfg = load_config(environ={})
    curriculum = Curriculum(cfg.tasks.families, cfg.curriculum)
    now_ms = int(time.time() * 1000)
    out = []
    for seed in seeds:
        for r in range(per_seed):
            ref = curriculum.sample(seed=seed, round_=r, count=1)[0]
            task = make_task(ref)
            wrong = str(int(task.answer) + 1)
            group = wire.RolloutGroup(
                ref=ref,
                generator=generator_of(ref.family),
                question=task.question,
                completions=tuple(
                    completion(rng, task.answer if rng.random() < 0.5 else wrong)
                    for _ in range(COMPLETIONS)
                ),
                model="embedded",
                round=r,
                created_ms=now_ms,
            )
            out.append((f"peer-{seed}", wire.encode(group)))
    return out


def synthetic_group(
    rng: random.Random, author: str, n: int, family: str, p: float, created: float | None = None
) -> tuple[PooledGroup, bytes, bytes]:
    """A pool entry of any family (the pool never looks at the question): real bytes,
    rewards drawn as 8 Bernoulli(p), made at ``created`` (now if None)."""
    group = wire.RolloutGroup(
        ref=TaskRef.make(family, {}, 1, n),
        generator=generator_of(family),
        question=f"Question {n} of {family}.",
        completions=tuple(completion(rng, str(n)) for _ in range(COMPLETIONS)),
        model="embedded",
        round=n,
        created_ms=int((time.time() if created is None else created) * 1000),
    )
    rewards = tuple(1.0 if rng.random() < p else 0.0 for _ in range(COMPLETIONS))
    return PooledGroup(group, author, rewards), wire.encode(group), group_digest(author, group)


# --- a. decode ----------------------------------------------------------------------------


def bench_decode(messages: list[bytes]) -> dict[str, float]:
    def strict() -> int:
        for m in messages:
            assert not isinstance(wire.decode(m), wire.Rejection)
        return len(messages)

    def plain() -> int:
        for m in messages:
            msgpack.unpackb(m, raw=False)
        return len(messages)

    rates: dict[str, list[float]] = {"strict": [], "plain": []}
    for _ in range(2):  # interleaved: the machine is noisy
        rates["strict"].append(best_rate(strict))
        rates["plain"].append(best_rate(plain))
    strict_rate, plain_rate = max(rates["strict"]), max(rates["plain"])
    size = statistics.mean(len(m) for m in messages)
    print(
        f"a. decode: {len(messages)} groups of {COMPLETIONS} completions, {size:.0f} bytes each\n"
        f"   wire.decode (strict, validated): {strict_rate:9.0f} groups/s "
        f"({1e6 / strict_rate:.0f} us/group)\n"
        f"   plain msgpack.unpackb:           {plain_rate:9.0f} groups/s "
        f"({1e6 / plain_rate:.0f} us/group); strict costs {plain_rate / strict_rate:.1f}x plain"
    )
    return {"decode_per_s": strict_rate, "plain_per_s": plain_rate, "bytes": size}


# --- b. intake ----------------------------------------------------------------------------


def bench_intake(n: int, rng: random.Random) -> dict[str, float]:
    """Two passes of n/2 distinct groups each (best pass reported); returns seconds per
    group in all and in the pool's check and add."""
    from sapo_node.config import load_config
    from sapo_node.curriculum import Curriculum
    from sapo_node.intake import checks as intake_module
    from sapo_node.intake.checks import Intake
    from sapo_node.tasks import Scorer

    seeds = list(range(101, 111))
    messages = basic_arithmetic_messages(seeds, -(-n // len(seeds)), rng)[:n]
    warm = basic_arithmetic_messages([7], 5, rng)
    pool = Pool(None, max_groups=10**6, rate_per_author=1e6, burst_per_author=10**6)
    scorer = Scorer()
    spent: Counter[str] = Counter()

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start

        return wrapper

    cfg = load_config(environ={})
    known = Curriculum(cfg.tasks.families, cfg.curriculum).known_configs()
    passes = []
    outcomes: Counter[str] = Counter()
    rewards: list[float] = []
    try:
        intake = Intake(pool, scorer, known_configs=known)
        for author, data in warm:  # starts the sandbox worker, imports, builds a dataset
            assert intake.receive(data, author).outcome == "accepted"
        decode, regenerate = intake_module.wire.decode, intake_module.make_task
        intake_module.wire.decode = timed("decode", decode)
        intake_module.make_task = timed("regenerate", regenerate)
        scorer.score = timed("score", scorer.score)  # type: ignore[method-assign]
        pool.check = timed("pool", pool.check)  # type: ignore[method-assign]
        pool.add = timed("pool", pool.add)  # type: ignore[method-assign]
        try:
            for half in (messages[: n // 2], messages[n // 2 :]):
                spent.clear()
                per_group = []
                start = time.perf_counter()
                for author, data in half:
                    t = time.perf_counter()
                    verdict = intake.receive(data, author)
                    per_group.append(time.perf_counter() - t)
                    outcomes[verdict.reason] += 1
                    if verdict.item is not None:
                        rewards.extend(verdict.item.rewards)
                total = time.perf_counter() - start
                spent["other"] = total - sum(spent.values())
                passes.append((total / len(half), per_group, dict(spent)))
        finally:
            intake_module.wire.decode, intake_module.make_task = decode, regenerate
    finally:
        scorer.close()
    assert outcomes == {"accepted": len(messages)}, outcomes
    mean_s, per_group, shares = min(passes, key=lambda x: x[0])
    share = ", ".join(f"{k} {100 * v / sum(shares.values()):.1f}%" for k, v in shares.items())
    print(
        f"b. intake: {len(messages)} basic_arithmetic groups from {len(seeds)} peers, "
        f"all accepted, mean reward {statistics.mean(rewards):.2f}\n"
        f"   passes: {', '.join(f'{1000 * p[0]:.1f}' for p in passes)} ms/group; best: "
        f"{1 / mean_s:.0f} groups/s, {1000 * mean_s:.1f} ms/group "
        f"(p50 {1000 * pct(per_group, 0.5):.1f}, p95 {1000 * pct(per_group, 0.95):.1f})\n"
        f"   time spent: {share}\n"
        f"   (regenerate: make_task in this process; score: {COMPLETIONS} sandbox calls)"
    )
    return {"intake_s": mean_s, "pool_s": shares["pool"] / len(per_group)}


# --- c. pool ------------------------------------------------------------------------------


def bench_pool(rng: random.Random) -> float:
    """Prints the latencies; returns the p50 seconds of add() on the full pool."""
    authors = [f"peer-{i}" for i in range(10)]
    pool = Pool(
        None,
        max_groups=POOL_SIZE,
        max_per_author=POOL_SIZE,
        rate_per_author=1e6,
        burst_per_author=10**6,
    )
    cands: list[Candidate] = []
    counter = iter(range(10**9))

    def add_one() -> float:
        n = next(counter)
        author, family = rng.choice(authors), rng.choice(PAPER_FAMILIES)
        item, data, digest = synthetic_group(rng, author, n, family, rng.random())
        start = time.perf_counter()
        pool.add(item, data, digest)
        elapsed = time.perf_counter() - start
        cands.append(Candidate(n, author, family, reward_spread(item.rewards), 0.0))
        return elapsed

    start = time.perf_counter()
    fill = [add_one() for _ in range(POOL_SIZE)]
    fill_s = time.perf_counter() - start
    adds = [add_one() for _ in range(300)]  # full: each add evicts one
    print(
        f"c. pool of {len(pool)} groups, {pool.size_bytes() / 2**20:.1f} MiB "
        f"(filled in {fill_s:.1f} s; add() while filling: p50 {1000 * pct(fill, 0.5):.2f} ms)\n"
        f"   add() on the full pool: p50 {1000 * pct(adds, 0.5):.2f} ms, "
        f"p95 {1000 * pct(adds, 0.95):.2f} ms"
    )
    for name in POLICIES:
        pool.sampling = name
        times, alone = [], []
        for _ in range(100):
            start = time.perf_counter()
            got = pool.sample(4, rng)
            times.append(time.perf_counter() - start)
            assert len(got) == 4
            start = time.perf_counter()
            POLICIES[name](cands[-POOL_SIZE:], 4, rng)
            alone.append(time.perf_counter() - start)
            for _ in range(4):  # keep the pool at its size
                add_one()
        print(
            f"   sample(4) {name:9s} p50 {1000 * pct(times, 0.5):6.2f} ms, "
            f"p95 {1000 * pct(times, 0.95):6.2f} ms; the policy alone on {POOL_SIZE} "
            f"candidates p50 {1000 * pct(alone, 0.5):6.2f} ms"
        )
    pool.close()
    return pct(adds, 0.5)


# --- d. against a round's generate time --------------------------------------------------------


def round_generator(cache: Path) -> Callable[[int], float] | None:
    """A function that times one default round's generate (round r's tasks) on the
    embedded model; None when ``cache`` holds no safetensors copy (this script never
    de-quantises)."""
    from sapo_node.train.policy import EMBEDDED_CACHE

    if (cache / EMBEDDED_CACHE / "model.safetensors").is_file():
        cache_dir = cache
    elif cache.name == EMBEDDED_CACHE and (cache / "model.safetensors").is_file():
        cache_dir = cache.parent
    else:
        return None
    from sapo_node.config import load_config
    from sapo_node.curriculum import Curriculum
    from sapo_node.tasks import build_messages
    from sapo_node.train.policy import load_policy

    cfg = load_config(environ={})
    policy = load_policy(
        "embedded", device="cpu", dtype="auto", lora=cfg.model.lora, cache_dir=cache_dir
    )
    curriculum = Curriculum(cfg.tasks.families, cfg.curriculum)
    gen, t = cfg.generation, cfg.tasks

    def once(r: int) -> float:
        refs = curriculum.sample(seed=7, round_=r, count=cfg.train.local_groups)
        prompts = [
            policy.encode_chat(build_messages(make_task(ref).question, t.system_prompt, t.one_shot))
            for ref in refs
        ]
        start = time.perf_counter()
        out = policy.generate(prompts, gen, n=gen.completions_per_task)
        elapsed = time.perf_counter() - start
        print(
            f"   generate (round {r}): {len(prompts)} tasks x {gen.completions_per_task} "
            f"completions, <= {gen.max_new_tokens} new tokens: {elapsed:.1f} s "
            f"({out.new_tokens} tokens)"
        )
        return elapsed

    return once


def bench_cost(
    intake: dict[str, float], add_full_s: float, generate_s: float, measured: bool
) -> None:
    """The intake's cost against a round's generate time, near-empty pool and full pool."""
    where = (
        "measured here"
        if measured
        else "NOT measured here: from docs/benchmarks.md or --generate-s"
    )
    print(f"d. one round's generate: {generate_s:.1f} s ({where})")
    full_s = intake["intake_s"] - intake["pool_s"] + add_full_s
    for label, per_group in (
        ("pool nearly empty (b)", intake["intake_s"]),
        (f"pool full at {POOL_SIZE} groups (b) with (c)'s add()", full_s),
    ):
        groups = 0.1 * generate_s / per_group
        print(
            f"   {label}: {1000 * per_group:.1f} ms/group = "
            f"{per_group / generate_s:.2e} of a round's generate; "
            f"{groups:.0f} groups in 10% of it ({groups / 4:.0f} peers at 4 groups a round)"
        )


# --- e. paper, balanced, teaching ------------------------------------------------------------

# What the simulated node needs (``Candidate.need``): it fails the first family.
NEED = {f: 1.0 if i == 0 else 0.2 for i, f in enumerate(PAPER_FAMILIES)}
POLICIES_COMPARED = ("paper", "balanced", "teaching")


def skewed_stream(rng: random.Random, n: int) -> list[tuple[str, str, float]]:
    """(author, family, p) of n published groups: 'dominant' 90%, 9 others 10%."""
    out = []
    for _ in range(n):
        author = "dominant" if rng.random() < 0.9 else f"peer-{rng.randrange(9)}"
        out.append((author, rng.choice(PAPER_FAMILIES), rng.random()))
    return out


def draw_stats(draws: list[list[tuple[str, float, str]]]) -> tuple[float, float, float, float]:
    """Mean distinct authors per draw, mean spread per group, the failed family's share
    of the groups, the dominant author's share."""
    picked = [g for d in draws for g in d]
    return (
        statistics.mean(len({a for a, _, _ in d}) for d in draws),
        statistics.mean(s for _, s, _ in picked),
        sum(f == PAPER_FAMILIES[0] for _, _, f in picked) / len(picked),
        sum(a == "dominant" for a, _, _ in picked) / len(picked),
    )


def bench_policies(rounds: int = 200, draw: int = 4) -> None:
    print(
        f"e. {', '.join(POLICIES_COMPARED)}, J={draw} per round, {rounds} rounds, rewards "
        "8 x Bernoulli(p)"
    )
    # 1. The policy alone: each round a fresh snapshot of 400 groups, 90% from one author.
    static: dict[str, list[list[tuple[str, float, str]]]] = {n: [] for n in POLICIES_COMPARED}
    for name in static:
        rng = random.Random(11)  # the same pools for both policies
        for _ in range(rounds):
            cands = []
            for k, (author, family, p) in enumerate(skewed_stream(rng, 400)):
                rewards = [1.0 if rng.random() < p else 0.0 for _ in range(COMPLETIONS)]
                spread = reward_spread(rewards)
                cands.append(Candidate(k, author, family, spread, 0.0, need=NEED[family]))
            by_key = {c.key: c for c in cands}
            keys = POLICIES[name](cands, draw, rng)
            static[name].append(
                [(by_key[k].author, by_key[k].spread, by_key[k].family) for k in keys]
            )
    # 2. A node's pool under the default bounds: 10 nodes publish 4 groups a round (40 a
    # round, 36 of them from the dominant author), rounds of 32 s, draws take groups out.
    live: dict[str, list[list[tuple[str, float, str]]]] = {n: [] for n in POLICIES_COMPARED}
    held_share: dict[str, float] = {}
    stream_rng = random.Random(12)
    stream = skewed_stream(stream_rng, 40 * rounds)
    start = time.time()
    entries = [  # each made in the round that adds it (the pool ages groups from creation)
        synthetic_group(stream_rng, author, n, family, p, start + 32.0 * (n // 40))
        for n, (author, family, p) in enumerate(stream)
    ]
    for name in live:
        now = [start]
        pool = Pool(None, sampling=name, clock=lambda now=now: now[0])
        rng = random.Random(13)
        shares, drawn = [], Counter[str]()
        for r in range(rounds):
            for item, data, digest in entries[40 * r : 40 * (r + 1)]:
                pool.add(item, data, digest)
            got = pool.sample(draw, rng, need=NEED)
            drawn.update(g.author for g in got)
            live[name].append(
                [(g.author, reward_spread(g.rewards), g.group.ref.family) for g in got]
            )
            shares.append(_dominant_held(pool.counts(), drawn))
            now[0] += 32.0
        held_share[name] = statistics.mean(shares)
        pool.close()
    print(
        "   | pool | policy | authors per draw | spread per group | on the failed family "
        "| dominant's share |\n   |---|---|---|---|---|---|"
    )
    for label, results in (("snapshot, 90% one author", static), ("node's pool", live)):
        for name, draws in results.items():
            authors, spread, failed, dominant = draw_stats(draws)
            print(
                f"   | {label} | {name} | {authors:.2f} | {spread:.3f} | {100 * failed:.1f}% "
                f"| {100 * dominant:.1f}% |"
            )
    print(
        "   dominant's share of the node's pool (mean over rounds): "
        + ", ".join(f"{k} {100 * v:.0f}%" for k, v in held_share.items())
    )


def _dominant_held(counts: dict[str, dict[str, int]], drawn: Counter[str]) -> float:
    """The dominant author's share of the groups the pool holds now."""
    gone = ("evicted_quota", "evicted_full", "expired")
    held = {
        a: c.get("accepted", 0) - sum(c.get(k, 0) for k in gone) - drawn[a]
        for a, c in counts.items()
    }
    return held.get("dominant", 0) / max(1, sum(held.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-cache", type=Path, default=None)
    parser.add_argument("--generate-s", type=float, default=DOCS_GENERATE_S)
    parser.add_argument("--intake-groups", type=int, default=300)
    parser.add_argument("--decode-groups", type=int, default=2000)
    args = parser.parse_args()

    from sapo_node.logs import configure_logging

    configure_logging()
    began = time.perf_counter()
    # One round's generate before and one after the rest (best of the two): the machine
    # is noisy, and a passing load should not decide the ratio.
    generate = round_generator(args.model_cache) if args.model_cache else None
    generated = [generate(0)] if generate else []
    rng = random.Random(5)
    messages = [data for _, data in basic_arithmetic_messages([1, 2, 3, 4], 500, rng)]
    bench_decode(messages[: args.decode_groups])
    intake = bench_intake(args.intake_groups, rng)
    add_full_s = bench_pool(rng)
    if generate:
        generated.append(generate(1))
    measured = bool(generated)
    generate_s = min(generated) if measured else args.generate_s
    bench_cost(intake, add_full_s, generate_s, measured)
    bench_policies()
    print(f"total {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
