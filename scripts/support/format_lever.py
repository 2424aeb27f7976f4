"""The shape-format class's figures (scripts/poison_attack.py, docs/security.md): what a
peer's shaped groups aim at is not text in a node's completions but the J it chooses
under ``train.external_by = "format"``, and the answer format that chooses it."""

from __future__ import annotations

from typing import Any


def format_summary(rounds: list[dict[str, Any]], j_bound: int | None) -> dict[str, Any] | None:
    """What the shape-format class aims at, per node: the J each round chose (mean, and
    the share of rounds at ``j_bound``, the most it may be), the node's own answer-format
    rate (of all its completions, and of those that ended before ``max_new_tokens``), the
    share that ended (means of the rounds that recorded them) and its reward, over all
    rounds and the last tenth (None: a run made before the rounds recorded J).

    >>> rows = [{"node": 0, "round": r, "train/external_target": j, "rollout/answer_tag_rate": f,
    ...          "reward/mean": f / 2} for r, (j, f) in enumerate([(2, 0.5), (3, 0.0)])]
    >>> format_summary(rows, 3)["nodes"][0]["j_mean"], format_summary(rows, 3)["j_at_max"]
    (2.5, 0.5)
    """
    if not rounds or "train/external_target" not in rounds[0]:
        return None

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    def mean_known(xs: list[float | None]) -> float | None:
        known = [x for x in xs if x is not None]
        return mean(known) if known else None

    def figures(rows: list[dict[str, Any]]) -> dict[str, float | None]:
        last = max(x["round"] for x in rows)
        tail = [x for x in rows if x["round"] > last - max(1, (last + 1) // 10)]
        js = [x["train/external_target"] for x in rows]
        return {
            "j_mean": mean(js),
            "j_at_max": mean([j == j_bound for j in js]) if j_bound is not None else None,
            "j_last_tenth": mean([x["train/external_target"] for x in tail]),
            "format_rate": mean([x["rollout/answer_tag_rate"] for x in rows]),
            "format_rate_last_tenth": mean([x["rollout/answer_tag_rate"] for x in tail]),
            "finished_rate": mean_known([x.get("finished_rate") for x in rows]),
            # what J reads since it counts finished completions only (None: none finished)
            "format_rate_finished": mean_known(
                [x.get("rollout/answer_tag_rate_finished") for x in rows]
            ),
            "reward": mean([x["reward/mean"] for x in rows]),
            "reward_last_tenth": mean([x["reward/mean"] for x in tail]),
        }

    nodes = sorted({x["node"] for x in rounds})
    return {
        "j_bound": j_bound,
        **figures(rounds),
        "nodes": {n: figures([x for x in rounds if x["node"] == n]) for n in nodes},
    }
