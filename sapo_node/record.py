"""The round's metrics row, assembled from what the round did (metrics.py writes it to
metrics.jsonl; docs/operations.md lists every key), and the line a round logs."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog

from sapo_node.groups import Group, taught_flags
from sapo_node.intake.demand import formatted_share
from sapo_node.metrics import peak_gpu_mb, peak_rss_mb
from sapo_node.tasks import answer_format_share, extract_answer

if TYPE_CHECKING:
    from sapo_node.train.trainer import TrainStats

log = structlog.get_logger("sapo_node.node")


def round_record(
    r: int,
    local: Sequence[Group],
    groups: Sequence[Group],
    stats: TrainStats,
    new_tokens: int,
    timer: Any,
    moves: Counter[str],
    practice: int,
    *,
    cumulative: float,
    threshold: float,
    pool: Any,
    levels: dict[str, int],
    device: Any,
) -> dict[str, Any]:
    """Round ``r``'s metrics row (docs/operations.md lists every key), ``cumulative`` the
    reward summed through it. What sharing did:

    - ``reward/external_mean``: mean reward of the completions of the peers' groups
      trained on (after the defence's screening, as trained); null with none;
    - ``groups/local_<kind>``, ``groups/external_<kind>``: own groups and peers' groups
      trained on, counted by ``Group.outcome`` (kind: ``all_wrong``, ``all_right``,
      ``signal``); each three sum to ``groups/local`` and ``groups/external``;
    - ``train/steps``: optimiser steps taken (``ppo_epochs`` unless skipped);
      ``train/grad_norm``: the last step's gradient norm before clipping (null if not
      finite); ``train/grad_norm_max``: the largest over the steps taken;
      ``train/grad_clipped``: the share of the steps taken whose norm exceeded
      ``train.grad_clip`` (0 or 1 with one step); both null when no step was taken;
    - ``groups/external_age_rounds`` (mean) and ``groups/external_age_rounds_max``: this
      node's round minus its round when the group entered its pool (``age_record``);
    - ``groups/external_tokens_taught``: the share of the peers' completion tokens that the
      loss counts (``defence.answer_only`` leaves their free text out); null with
      none;
    - ``groups/practice``, ``reward/practice_mean``: with ``train.external_use = "tasks"``,
      this node's own groups on the tasks of the peers' groups it drew (counted in
      ``groups/external``; not in ``reward/mean``, which stays the reward on the
      node's own task stream, comparable with a node alone);
    - ``compute_s``: the node's compute in the round (``Timer.compute_s``), the cost
      that experiments divide the reward by (node.Timer).
    """
    seconds = timer.seconds
    own = [x for g in local for x in g.rewards]
    theirs = groups[len(local) :]
    practised = theirs[:practice]
    reward_mean = sum(own) / len(own) if own else 0.0
    rec: dict[str, Any] = {
        "round": r,
        "time": round(time.time(), 3),
        "reward/mean": reward_mean,
        "reward/cumulative": cumulative,
        "reward/external_mean": mean_or_none([x for g in theirs for x in g.rewards]),
        "groups/local": len(local),
        "groups/external": len(groups) - len(local),
        "groups/trained": sum(g.has_signal for g in groups),
        "groups/external_tokens_taught": mean_or_none(
            [t for g in theirs for flags in taught_flags(g) for t in flags]
        ),
        "groups/practice": practice,
        "reward/practice_mean": mean_or_none([x for g in practised for x in g.rewards]),
        **outcome_counts("groups/local", local, threshold),
        **outcome_counts("groups/external", theirs, threshold),
        "rollout/answer_tag_rate": answer_format_rate(local),
        "rollout/answer_tag_rate_finished": finished_format_rate(local),
        "pool/groups": len(pool),
        "pool/mb": pool.size_bytes() / 2**20,
    }
    for fam in sorted({g.task.ref.family for g in local}):
        rec[f"family_reward/{fam}"] = mean(
            [x for g in local if g.task.ref.family == fam for x in g.rewards]
        )
    for fam, level in levels.items():
        rec[f"family_level/{fam}"] = level
    rec.update(
        {
            "curriculum/moves": {k: v for k, v in moves.items() if v},
            "phase_s/generate": seconds.get("generate", 0.0),
            "phase_s/intake": seconds.get("intake", 0.0),
            "phase_s/score": seconds.get("score", 0.0),
            "phase_s/screen": seconds.get("screen", 0.0),
            "phase_s/train": seconds.get("train", 0.0),
            "phase_s/round": seconds.get("round", 0.0),
            "compute_s": timer.compute_s(),
            "rollout/new_tokens": new_tokens,
            "rollout/tokens_per_s": new_tokens / max(seconds.get("generate", 0.0), 1e-9),
            "train/sequences": stats.sequences,
            "train/tokens": stats.tokens,
            "train/loss": stats.loss,
            "train/clip_frac": stats.clip_frac,
            "train/kl": stats.kl,
            "train/approx_kl": stats.approx_kl,
            "train/entropy": stats.entropy,
            "train/steps": stats.steps,
            "train/skipped_steps": stats.skipped_steps,
            "train/grad_norm": stats.grad_norm if math.isfinite(stats.grad_norm) else None,
            "train/grad_norm_max": stats.grad_norm_max if stats.steps else None,
            "train/grad_clipped": stats.clipped_steps / stats.steps if stats.steps else None,
            "memory/peak_rss_mb": peak_rss_mb(),
            "memory/peak_gpu_mb": peak_gpu_mb(device),
        }
    )
    return rec


def answer_format_rate(groups: Sequence[Group]) -> float:
    """The share of the groups' completions with an answer between the tags (0 if none)."""
    return answer_format_share(x for g in groups for x in g.texts)


def finished_format_rate(groups: Sequence[Group]) -> float | None:
    """The same share among the completions that finished (None if none did): what
    ``train.external_by = "format"`` reads (intake/demand.py, ``formatted_share``)."""
    return formatted_share(
        (done, extract_answer(x) is not None)
        for g in groups
        for x, done in zip(g.texts, g.finished, strict=True)
    )


def age_record(theirs: Sequence[Group], r: int, now: float) -> dict[str, float]:
    """How old the peers' groups this round trained on were: in seconds from their
    creation (the author's clock, within the allowed skew) to now, and in this node's
    rounds from the round in which each entered the pool (0: it arrived at the start of
    this round) to round ``r``. Nothing when there were none; no rounds for groups pooled
    before the pool kept them. Ages are never negative (a node that resumed from an older
    checkpoint runs rounds again)."""
    pooled = [g.pooled for g in theirs if g.pooled is not None]
    if not pooled:
        return {}
    ages = [max(0.0, now - p.group.created_ms / 1000.0) for p in pooled]
    rec = {"groups/external_age_s": mean(ages), "groups/external_age_s_max": max(ages)}
    rounds = [max(0, r - p.received_round) for p in pooled if p.received_round is not None]
    if rounds:
        rec |= {
            "groups/external_age_rounds": mean(rounds),
            "groups/external_age_rounds_max": max(rounds),
        }
    return rec


def outcome_counts(
    prefix: str, groups: Sequence[Group], correct_threshold: float
) -> dict[str, int]:
    """``<prefix>_all_wrong``, ``_all_right`` and ``_signal``: groups of each outcome
    (prefix ``groups/local`` or ``groups/external``)."""
    counts = Counter(g.outcome(correct_threshold) for g in groups)
    return {f"{prefix}_{kind}": counts[kind] for kind in ("all_wrong", "all_right", "signal")}


def mean(values: Sequence[float]) -> float:
    return float(sum(values)) / len(values) if values else 0.0


def mean_or_none(values: Sequence[float]) -> float | None:
    return float(sum(values)) / len(values) if values else None


def log_round(rec: dict[str, Any]) -> None:
    log.info(
        "round",
        round=rec["round"],
        reward=round(rec["reward/mean"], 3),
        cumulative=round(rec["reward/cumulative"], 2),
        tags=round(rec["rollout/answer_tag_rate"], 2),
        groups=f"{rec['groups/local']}+{rec['groups/external']}",
        peers=rec.get("net/peers", 0),
        trained=rec["train/sequences"],
        levels=" ".join(
            f"{k.removeprefix('family_level/')}={v}"
            for k, v in rec.items()
            if k.startswith("family_level/")
        ),
        tok_s=round(rec["rollout/tokens_per_s"], 1),
        t=(f"{rec['phase_s/generate']:.1f}/{rec['phase_s/score']:.1f}/{rec['phase_s/train']:.1f}s"),
        rss_mb=round(rec["memory/peak_rss_mb"]),
    )
    if "eval/pass1" in rec:
        log.info(
            "held-out eval",
            round=rec["round"],
            pass1=round(rec["eval/pass1"], 3),
            greedy=round(rec["eval/greedy"], 3),
            tags=round(rec["eval/answer_tag_rate"], 2),
            tasks=rec["eval/tasks"],
            t=f"{rec['eval/seconds']:.1f}s",
        )
