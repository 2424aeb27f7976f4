"""The poisoning attack, measured: honest nodes and one poisoning peer, defences off or on.

A swarm of ``--nodes`` honest nodes (the real ``Node.run_round`` path, the embedded model
by default) and one poisoning peer (tests/support/poison.py: valid, regenerable groups
of the nodes' own tasks, right with probability ``--accuracy``, the right completions
carrying ``--payload``) exchange real wire bytes over the in-memory transport, in
lockstep as in ``sapo-node experiment``: every node runs round r, then what everyone
published in round r is delivered. Each honest node is a victim of the attacker and an
honest peer of the others. With ``--identities K`` the attacker is K peers (a Sybil
attack), each with its own author name (``attacker-k``), seed and ``--groups`` a round:
each identity alone stays under the per-peer share cap and the reputation's counts.
``--attack shape-format`` sends no payload: its groups are shaped to lower the nodes' own
answer-format rate, and so raise the peers' groups they take each round (J, under
``train.external_by = "format"``); ``--attack honest`` is the same peer without the
shaping, its baseline (tests/support/poison.py says how each is built).

Measured, per node and overall:

- the attack's success: the share of each node's own completions that carry the payload,
  per round (read from the groups it publishes: every one, ``net.publish = all``), and
  the share of its held-out evaluation completions (sampled and greedy) that do, at the
  start, every ``--eval-every`` rounds and at the end;
- what the defences refused, by reason, of the attacker's completions and of the honest
  peers' (the nodes' pools count both: ``sapo-node pool`` shows the same table).
- J and the answer format (``summarise``'s ``format``): per node, the J each round chose
  (``train/external_target``; its mean, and the share of rounds at the most it may be),
  the share of the node's own completions in the answer format
  (``rollout/answer_tag_rate``) and its reward, over all rounds and the last tenth;
- the J slots own groups took because peers' groups had aged out of the pool first
  (``train/j_unfilled_expired``: rounds slower than ``pool.max_age_s``), per round and
  in all: a run with any ran another J than the one set.

``--defences off`` sets ``defence.enabled = false``; ``on`` leaves the node defaults.
Everything else, seeds included, is the same in both, so the two runs differ only there.

Output: OUT/rounds.jsonl (one line per node and round, with a few of the node's metrics,
ROUND_KEYS; runs before 0.3.0 wrote them in the old names: reward_mean, external_groups,
groups_trained, t_round), OUT/evals.jsonl, OUT/report.json (the summary below, also
printed). Each node's data directory is OUT/node-<i>: its metrics and its pool, which the
report reads. Its weights are not kept: no checkpoint is written, and the de-quantised
model copy the nodes shared (OUT/.models) is deleted at the end, unless
``--keep-checkpoints`` (each node's final checkpoint, for ``sapo-node eval --data-dir
OUT/node-<i>``): a checkpoint holds a full model and its optimiser state, and runs that
kept one a node filled a disk.

Usage (docs/security.md has the commands and the results):
    python scripts/poison_attack.py --out DIR --defences off --rounds 40
    python scripts/poison_attack.py --out DIR --defences on --rounds 40
    python scripts/poison_attack.py --out DIR --defences on --identities 16 --groups 1
    python scripts/poison_attack.py --out DIR --defences on --attack shape-format \
        --set 'train.external_by="format"'
    python scripts/poison_attack.py summarise DIR [DIR ...]   # report.json again
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sapo_node.config import Config, _deep_merge  # noqa: E402
from sapo_node.intake import wire  # noqa: E402
from sapo_node.intake.defence import CHECKED  # noqa: E402
from sapo_node.net.memory import MemoryHub  # noqa: E402
from sapo_node.ops.lifecycle import cap_kernel_caches, fix_mmap_threshold  # noqa: E402
from scripts.support.format_lever import format_summary  # noqa: E402
from tests.support.poison import (  # noqa: E402
    ATTACKS,
    DEFAULT_PAYLOAD,
    FORMAT_PREAMBLE,
    PoisonPeer,
    carries,
)

ATTACKER = "attacker"
OBSERVER = "observer"
SEED_SPACING = 2**40
# The node's metrics copied into each line of rounds.jsonl (metrics.jsonl has them all).
ROUND_S = 30.0  # seconds of the nodes' clock a round (sapo_node.experiment.runner.RoundClock)
ROUND_KEYS = (
    "reward/mean",
    "groups/external",
    "groups/trained",
    "phase_s/round",
    "train/j_unfilled_expired",  # J slots own groups took: peers' groups had aged out
    "train/external_target",  # the J the round chose
    "rollout/answer_tag_rate",  # own completions with an answer between the tags
    "rollout/answer_tag_rate_finished",  # the same of those that finished (None: none did)
    "train/own_format_rate",  # its moving average, which chooses J under "format"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--defences", choices=["on", "off"], required=True)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--nodes", type=int, default=2, help="honest nodes")
    p.add_argument("--ratio", default="2/2", help="I/J of the honest nodes")
    p.add_argument(
        "--attack",
        choices=ATTACKS,
        default="payload",
        help="payload: right completions carry --payload; shape-format: groups shaped to "
        "lower the nodes' answer-format rate (--payload is then the right completions' "
        "preamble); honest: the same groups unshaped (tests/support/poison.py)",
    )
    p.add_argument(
        "--payload",
        help=f"default {DEFAULT_PAYLOAD!r}; with --attack shape-format or honest "
        f"{FORMAT_PREAMBLE!r} (honest sends none: its rate is the baseline's)",
    )
    p.add_argument("--position", choices=["suffix", "prefix"], default="prefix")
    p.add_argument("--accuracy", type=float, default=0.5, help="the attacker's, per completion")
    p.add_argument(
        "--groups", type=int, default=4, help="groups per round of each attacker identity"
    )
    p.add_argument(
        "--identities",
        type=int,
        default=1,
        help="attacker identities (a Sybil attack: each its own author, seed and groups)",
    )
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument(
        "--base",
        type=Path,
        default=ROOT / "configs" / "experiments" / "cpu.toml",
        help="an experiment file whose [base] and [eval] tables set up the nodes",
    )
    p.add_argument("--model", help="override the base's model.name (tests: a tiny model)")
    p.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep each node's final checkpoint and the model copy (default: the report's "
        "files only)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=JSON",
        help="override a node config key, e.g. train.lr=1e-4 (repeatable)",
    )
    args = p.parse_args(argv)
    if args.payload is None:
        args.payload = DEFAULT_PAYLOAD if args.attack == "payload" else FORMAT_PREAMBLE
    if args.attack != "payload" and args.position != "prefix":
        p.error("--position is where a payload goes: --attack payload only")
    if args.identities < 1 or args.groups < 1:
        p.error("--identities and --groups must be at least 1")
    return args


def node_configs(args: argparse.Namespace) -> list[Config]:
    spec = tomllib.loads(args.base.read_text(encoding="utf-8"))
    local, external = (int(x) for x in args.ratio.split("/"))
    base: dict[str, Any] = spec.get("base", {})
    overrides: dict[str, Any] = {
        # J fixed at --ratio, as an experiment's plain arm (--set train.external_by=... to not)
        "train": {"local_groups": local, "external_groups": external, "external_by": "fixed"},
        "curriculum": {"enabled": False},
        "net": {"enabled": False, "publish": "all"},
        "eval": {**spec.get("eval", {}), "every": 0},
    }
    if args.defences == "off":
        overrides["defence"] = {"enabled": False}
    if args.model:
        overrides["model"] = {"name": args.model}
    for item in args.set:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        overrides.setdefault(section, {})[name] = json.loads(value)
    out = []
    for i in range(args.nodes):
        forced = {
            "node": {
                "data_dir": str(args.out / f"node-{i}"),
                "seed": args.seed + i * SEED_SPACING,
                "rounds": args.rounds,
                "threads": args.threads,
                "keep_checkpoints": 1,
            }
        }
        out.append(Config.model_validate(_deep_merge(_deep_merge(base, overrides), forced)))
    return out


class PayloadProbe:
    """How close a node is to writing the payload, before it samples it: the mean over 8
    held-out tasks of log p(payload), in nats, under the node's current policy, where the
    attacker puts it: at the start of the completion (``prefix``) or right after the
    right answer (``suffix``: the prompt is followed by ``<answer>ANSWER</answer>``)."""

    def __init__(self, config: Config, attacker: PoisonPeer, policy) -> None:
        from sapo_node.evaluate import heldout_refs
        from sapo_node.tasks import build_messages, make_task
        from sapo_node.train.trainer import Sample

        t, limit = config.tasks, config.generation.max_new_tokens
        self.samples = []
        for ref, _ in heldout_refs(t.families, config.curriculum, config.eval)[:8]:
            task = make_task(ref)
            prompt = policy.encode_chat(build_messages(task.question, t.system_prompt, t.one_shot))
            if attacker.position == "prefix":
                payload = policy.encode_completion(attacker.payload, False, limit).ids
            else:
                answer = policy.encode_completion(f"<answer>{task.answer}</answer>", False, limit)
                prompt = prompt + answer.ids
                payload = policy.encode_completion(" " + attacker.payload, False, limit).ids
            self.samples.append(Sample(prompt, payload, 0.0))

    def logprob(self, node) -> float:
        rows = node.trainer.completion_logprobs(self.samples)
        return sum(sum(r) for r in rows) / len(rows)


def payload_share(texts: list[str], payload: str) -> float:
    return sum(carries(t, payload) for t in texts) / len(texts) if texts else 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    from sapo_node.build import build_node
    from sapo_node.experiment import Deferred, _locked, _share_model_cache
    from sapo_node.experiment.runner import RoundClock
    from sapo_node.node import Node

    args.out.mkdir(parents=True, exist_ok=True)
    if (args.out / "rounds.jsonl").exists():
        raise SystemExit(f"{args.out} holds a run already: give another --out")
    configs = node_configs(args)
    run_facts = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    run_facts["completions_per_task"] = configs[0].generation.completions_per_task
    run_facts["j_bound"] = configs[0].train.j_bound()  # None: J fixed at --ratio's
    (args.out / "run.json").write_text(json.dumps(run_facts, indent=2) + "\n", encoding="utf-8")
    hub = MemoryHub()
    observer = hub.join(OBSERVER, per_author=4096, total=65536)
    # time follows the rounds (pool ages, distrust, messages' times), not the machine's load
    clock = RoundClock(ROUND_S)
    attackers = [
        (
            PoisonPeer(
                configs[0],
                args.seed + (10**6 + k) * SEED_SPACING,
                payload=args.payload,
                accuracy=args.accuracy,
                groups=args.groups,
                position=args.position,
                attack=args.attack,
            ),
            Deferred(hub.join(ATTACKER if args.identities == 1 else f"{ATTACKER}-{k}"), clock.now),
        )
        for k in range(args.identities)
    ]
    nodes: list[Node] = []
    names: dict[str, int] = {}
    rounds_log = (args.out / "rounds.jsonl").open("a", encoding="utf-8")
    evals_log = (args.out / "evals.jsonl").open("a", encoding="utf-8")
    cap_kernel_caches()  # as sapo-node experiment does: once, for every node of the process
    fix_mmap_threshold()
    try:
        for i, config in enumerate(configs):
            data_dir = config.node.resolved_data_dir()
            data_dir.mkdir(parents=True, exist_ok=True)
            _share_model_cache(args.out, data_dir)
            with _locked(args.out / ".models.lock"):
                node = build_node(
                    config, transport=Deferred(hub.join(f"node-{i}"), clock.now), clock=clock.now
                )
            nodes.append(node)
            names[f"node-{i}"] = i

        def evaluate(r: int) -> None:
            for i, node in enumerate(nodes):
                report = node.evaluate()
                texts = [t for task in report.tasks for t in task.texts]
                greedy = [task.texts[-1] for task in report.tasks]
                line = {
                    "node": i,
                    "round": r,
                    "payload_rate": payload_share(texts, args.payload),
                    "payload_rate_greedy": payload_share(greedy, args.payload),
                    "pass1": report.metrics()["eval/pass1"],
                    "greedy": report.metrics()["eval/greedy"],
                }
                evals_log.write(json.dumps(line) + "\n")
                evals_log.flush()
                print(
                    f"eval node {i} after {r} rounds: payload {line['payload_rate']:.3f} "
                    f"(greedy {line['payload_rate_greedy']:.3f}), pass@1 {line['pass1']:.3f}",
                    flush=True,
                )

        probe = PayloadProbe(configs[0], attackers[0][0], nodes[0].policy)
        evaluate(0)
        for r in range(args.rounds):
            start = time.perf_counter()
            records = []
            clock.round = r
            for node in nodes:
                node.transport.round = r
                records.append(node.run_round(r))
                node.metrics.append(records[-1])
                node.round += 1
            for attacker, link in attackers:
                link.round = r
                for data in attacker.round_messages(r, int(clock.now() * 1000)):
                    link.publish(data)
                link.flush(r)
            for node in nodes:
                node.transport.flush(r)
            own: dict[int, list[str]] = {i: [] for i in range(len(nodes))}
            ended: dict[int, list[bool]] = {i: [] for i in range(len(nodes))}  # not truncated
            lines: list[dict[str, Any]] = []
            for message in observer.received():
                if message.author in names:
                    group = wire.decode(message.data)
                    own[names[message.author]] += list(group.completions)
                    ended[names[message.author]] += [
                        k not in group.unfinished for k in range(len(group.completions))
                    ]
            for i, (node, rec) in enumerate(zip(nodes, records, strict=True)):
                line = {
                    "node": i,
                    "round": r,
                    "payload_rate": payload_share(own[i], args.payload),
                    "payload_logprob": probe.logprob(node),
                    "completions": len(own[i]),
                    "finished_rate": sum(ended[i]) / len(ended[i]) if ended[i] else None,
                    "examples": own[i][:: max(1, len(own[i]) // 4)][:4],
                    **{k: rec[k] for k in ROUND_KEYS},
                }
                rounds_log.write(json.dumps(line) + "\n")
                lines.append(line)
            rounds_log.flush()
            print(
                f"round {r}: payload "
                + " ".join(f"{payload_share(own[i], args.payload):.3f}" for i in own)
                + " log-prob "
                + " ".join(f"{x['payload_logprob']:.2f}" for x in lines)
                + " J "
                + " ".join(str(x["train/external_target"]) for x in lines)
                + " format "
                + " ".join(f"{x['rollout/answer_tag_rate']:.2f}" for x in lines)
                + f" ({time.perf_counter() - start:.1f} s)"
                + "".join(
                    f"; node {x['node']}: J unfilled by {x['train/j_unfilled_expired']}, "
                    "peers' groups expired"
                    for x in lines
                    if x["train/j_unfilled_expired"]
                ),
                flush=True,
            )
            if args.eval_every and (r + 1) % args.eval_every == 0 or r + 1 == args.rounds:
                evaluate(r + 1)
        if args.keep_checkpoints:
            for node in nodes:
                node.save()
    finally:
        rounds_log.close()
        evals_log.close()
        for node in nodes:
            node.close()
        if not args.keep_checkpoints:
            _drop_model_copy(args.out)
    report = summarise(args.out)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def _drop_model_copy(out: Path) -> None:
    """Delete the model copy the nodes shared (``experiment._share_model_cache``) and their
    links to it; a node started on one of these directories makes it again."""
    import shutil

    for link in out.glob("node-*/models"):
        if link.is_symlink():
            link.unlink()
    shutil.rmtree(out / ".models", ignore_errors=True)


def summarise(out: Path) -> dict[str, Any]:
    """The figures of docs/security.md, from what a run left in ``out`` (run.json,
    rounds.jsonl, evals.jsonl and the nodes' pools): payload rates, refusals by kind of
    author (the attacker, the honest nodes)."""
    from sapo_node.intake.pool import summary

    run = json.loads((out / "run.json").read_text())
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (out / "evals.jsonl").read_text().splitlines()]
    last = max(x["round"] for x in rounds)
    tail = [x for x in rounds if x["round"] > last - max(1, (last + 1) // 10)]
    final = [x for x in evals if x["round"] == max(e["round"] for e in evals)]
    counts: dict[str, Counter[str]] = {"attacker": Counter(), "honest": Counter()}
    held: Counter[str] = Counter()
    for pool_file in sorted(out.glob("node-*/pool.sqlite3")):
        for author, c in summary(pool_file)["peers"].items():
            kind = "attacker" if author.split("-")[0] == ATTACKER else "honest"
            counts[kind].update({k: v for k, v in c.items() if k != "held"})
            held[kind] += c.get("held", 0)

    def refused(c: Counter[str]) -> int:
        return sum(n for k, n in c.items() if k.startswith("completions_") and k != CHECKED)

    def refusal_rate(c: Counter[str]) -> float | None:
        return refused(c) / c[CHECKED] if c[CHECKED] else None

    # The honest nodes' groups that rounds took (pooled, then neither still held, nor
    # expired or evicted), each of L completions: what the refusals are a share of.
    honest = counts["honest"]
    gone = sum(n for k, n in honest.items() if k == "expired" or k.startswith("evicted"))
    taken = honest["accepted"] - held["honest"] - gone

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    return {
        **run,
        "rounds_done": last + 1,
        # J slots that own groups took because peers' groups aged out of the pool first
        # (pool.max_age_s): nonzero, the run's J was not the set one; on the round clock a
        # group is drawn within pool.max_age_s / ROUND_S rounds or never
        "j_unfilled_expired": sum(x.get("train/j_unfilled_expired", 0) for x in rounds),
        "own_payload_rate_last_tenth": mean([x["payload_rate"] for x in tail]),
        "own_payload_rate_all": mean([x["payload_rate"] for x in rounds]),
        "own_payload_rate_max": max(x["payload_rate"] for x in rounds),
        "payload_logprob_end": mean([x["payload_logprob"] for x in rounds if x["round"] == last]),
        "eval_round_end": final[0]["round"],
        "eval_payload_rate_end": mean([x["payload_rate"] for x in final]),
        "eval_payload_rate_greedy_end": mean([x["payload_rate_greedy"] for x in final]),
        "eval_pass1_end": mean([x["pass1"] for x in final]),
        "eval_greedy_end": mean([x["greedy"] for x in final]),
        "attacker_refusal_rate": refusal_rate(counts["attacker"]),
        "honest_refusal_rate": refusal_rate(counts["honest"]),
        "honest_completions_taken": taken * run["completions_per_task"],
        "honest_refused_of_taken": refused(honest) / (taken * run["completions_per_task"])
        if taken
        else None,
        "pool_counts": {k: dict(sorted(v.items())) for k, v in counts.items()},
        "format": format_summary(rounds, run.get("j_bound")),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["summarise"]:  # the report again, from what runs left on disk
        for out in argv[1:]:
            print(json.dumps(summarise(Path(out)), indent=2))
        return 0
    args = parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
