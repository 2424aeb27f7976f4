"""The round's metrics row, assembled from what the round did (metrics.py writes it to
metrics.jsonl; docs/operations.md lists every key), and the line a round logs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import structlog

from sapo_node.groups import Group

log = structlog.get_logger("sapo_node.node")


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
