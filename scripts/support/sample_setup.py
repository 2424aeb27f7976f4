"""The trainer and the groups of the training benchmarks scripts/bench_merge.py,
scripts/bench_prefix.py and scripts/bench_sample.py: the default config's trainer, and
the screening run's peer completions (docs/results/screening-cpu) with signal, as groups;
and the options these benchmarks share."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from sapo_node.config import Config
from sapo_node.groups import Group
from sapo_node.tasks import build_messages
from sapo_node.train.policy import load_policy
from sapo_node.train.trainer import Trainer

SAMPLE = Path(__file__).resolve().parents[2] / "docs/results/screening-cpu/peer-completions.jsonl"


def signal_groups(path: Path, policy, cfg: Config) -> list[Group]:
    """The sample's groups (pool, author, task), tokenised by ``policy``, with signal."""
    by_group: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        by_group[(row["pool"], row["author"], row["task"])].append(row)
    t, limit = cfg.tasks, cfg.generation.max_new_tokens
    out = []
    for (_, _, question), rows in by_group.items():
        if len({r["reward"] for r in rows}) < 2:
            continue
        prompt = policy.encode_chat(build_messages(question, t.system_prompt, t.one_shot))
        done = [policy.encode_completion(r["text"], r["finished"], limit) for r in rows]
        out.append(
            Group(
                None,
                prompt,
                [c.ids for c in done],
                [c.text for c in done],
                [r["finished"] for r in rows],
                [r["reward"] for r in rows],
            )
        )
    return out


def parser(doc: str, groups_per_step: int) -> argparse.ArgumentParser:
    """The options these training benchmarks share."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--sample", type=Path, default=SAMPLE)
    ap.add_argument("--steps", type=int, default=8, help=f"steps of {groups_per_step} groups each")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="embedded", help="a model directory (tests: tiny)")
    ap.add_argument("--threads", type=int, default=1)
    return ap


def trainer_and_groups(args: argparse.Namespace, cache: Path) -> tuple[Trainer, list[Group]]:
    """The default config's trainer on ``args.model`` (one CPU thread per
    ``args.threads``) and the sample's groups with signal, tokenised by its policy."""
    torch.set_num_threads(args.threads)
    cfg = Config()
    policy = load_policy(
        args.model,
        device="cpu",
        dtype=cfg.model.dtype,
        lora=cfg.model.lora,
        cache_dir=cache,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        seed=0,
    )
    trainer = Trainer(policy, cfg.train, cfg.generation.max_new_tokens)
    return trainer, signal_groups(args.sample, policy, cfg)
