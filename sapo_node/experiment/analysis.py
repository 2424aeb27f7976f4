"""The experiment's analysis: per-node summaries and the paired tests against J = 0, as
plain functions of the nodes' rows (report.py writes them out as tables and plots)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sapo_node.evaluate import breakdown
from sapo_node.experiment.significance import (
    bootstrap_interval,
    sign_flip_p,
    smallest_p,
    wilson_interval,
)
from sapo_node.experiment.spec import ExperimentSpec, arms, compared_per_swarm


def node_summary(
    rows: Sequence[dict[str, Any]],
    evals: Sequence[dict[str, Any]],
    rounds: int,
    thresholds: dict[str, float] | None = None,
):
    """One node's figures from its metrics rows (in the current names: read_metrics)
    and evaluations; with ``thresholds`` (name -> held-out greedy accuracy) also its
    held-out curve against compute and its time to each. The figures' names are the
    analysis's own, kept in results.json whatever the rows call them."""
    done = [r for r in rows if r["round"] < rounds]
    by_round = {int(e["round"]): e for e in evals}
    start, end = by_round.get(0), by_round.get(rounds)
    extra: dict[str, Any] = {}
    if thresholds:
        curve = heldout_curve(done, [by_round[k] for k in sorted(by_round) if k <= rounds])
        extra = {
            "heldout_curve": curve,
            "time_to_accuracy": {
                name: time_to_accuracy(curve, value) for name, value in thresholds.items()
            },
        }
        levels = _final_levels(done)
        if levels:
            extra["final_levels"] = levels
    return {
        "rounds": len(done),
        "cumulative_reward": sum(r["reward/mean"] for r in done),
        "rewards": [r["reward/mean"] for r in sorted(done, key=lambda r: r["round"])],
        "format_rates": [
            r.get("rollout/answer_tag_rate", 0.0) for r in sorted(done, key=lambda r: r["round"])
        ],
        "new_tokens": sum(r.get("rollout/new_tokens", 0) for r in done),
        "node_seconds": sum(r.get("phase_s/round", 0.0) for r in done),
        "j_unfilled_expired": sum(r.get("train/j_unfilled_expired", 0) for r in done),
        "compute_seconds": sum(compute_seconds(r) for r in done),
        "sequences_trained": _mean_of(r.get("train/sequences", 0) for r in done),
        "tokens_trained": _mean_of(r.get("train/tokens", 0) for r in done),
        "eval_start": _eval_brief(start),
        "eval_end": _eval_brief(end),
        "evals": [_eval_brief(by_round[k]) | {"round": k} for k in sorted(by_round)],
        "halves": [mechanism_sums(h) for h in halves(done, rounds)],
    } | extra


def heldout_curve(rows: Sequence[dict[str, Any]], evals: Sequence[dict[str, Any]]):
    """[round, compute-seconds before it, greedy, pass@1] of each evaluation: the node's
    compute (``compute_seconds``) summed over the rounds it had trained when evaluated.

    >>> heldout_curve([{"round": 0, "compute_s": 2.0}, {"round": 1, "compute_s": 3.0}],
    ...               [{"round": 0, "eval/greedy": 0.1, "eval/pass1": 0.2},
    ...                {"round": 2, "eval/greedy": 0.5, "eval/pass1": 0.4}])
    [[0, 0.0, 0.1, 0.2], [2, 5.0, 0.5, 0.4]]
    """
    out = []
    for e in evals:
        k = int(e["round"])
        spent = sum((compute_seconds(r) for r in rows if r["round"] < k), 0.0)
        out.append([k, spent, e["eval/greedy"], e["eval/pass1"]])
    return out


def time_to_accuracy(curve: Sequence[Sequence[float]], threshold: float) -> dict[str, Any]:
    """The first evaluation of ``curve`` (heldout_curve) whose greedy accuracy reaches
    ``threshold``: its round and the compute-seconds spent before it (None, None if none
    did; ``spent``: the compute of the whole curve, a lower bound of the time then).

    >>> time_to_accuracy([[0, 0.0, 0.1, 0.1], [2, 5.0, 0.5, 0.4], [4, 9.0, 0.6, 0.5]], 0.5)
    {'threshold': 0.5, 'round': 2, 'compute_s': 5.0, 'spent': 9.0}
    >>> time_to_accuracy([[0, 0.0, 0.1, 0.1]], 0.5)["compute_s"] is None
    True
    """
    hit = next((p for p in curve if p[2] >= threshold - 1e-12), None)
    return {
        "threshold": threshold,
        "round": None if hit is None else int(hit[0]),
        "compute_s": None if hit is None else hit[1],
        "spent": curve[-1][1] if curve else 0.0,
    }


def _final_levels(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Each family's curriculum level after the node's last round (its row's
    ``family_level/<family>``)."""
    last = max(rows, key=lambda r: r["round"], default={})
    return {
        k.removeprefix("family_level/"): int(v)
        for k, v in last.items()
        if k.startswith("family_level/")
    }


def _time_or_bound(t: dict[str, Any]) -> float:
    """A node's time to accuracy, or if it never got there the compute it spent (a lower
    bound of its time: counting it so favours neither side more than the data allow)."""
    return t["compute_s"] if t["compute_s"] is not None else t["spent"]


def time_to_accuracy_summary(nodes, base_nodes=None) -> dict[str, Any] | None:
    """Per threshold, over a configuration's nodes: how many reached it, the mean
    compute-seconds to it (a node that never did counts its whole compute), and paired by
    node seed against ``base_nodes``: the ratio of the means and the sign-flip p of the
    per-node differences."""
    if not nodes or any("time_to_accuracy" not in n for n in nodes):
        return None
    out: dict[str, Any] = {}
    for name in nodes[0]["time_to_accuracy"]:
        mine = [n["time_to_accuracy"][name] for n in nodes]
        entry: dict[str, Any] = {
            "threshold_mean": _mean_of(t["threshold"] for t in mine),
            "reached": sum(t["compute_s"] is not None for t in mine),
            "compute_s_mean": _mean_of(_time_or_bound(t) for t in mine),
            "rounds_reached": [t["round"] for t in mine],
        }
        if base_nodes is not None and all("time_to_accuracy" in b for b in base_nodes):
            base = [b["time_to_accuracy"][name] for b in base_nodes]
            diffs = [_time_or_bound(x) - _time_or_bound(b) for x, b in zip(mine, base, strict=True)]
            base_mean = _mean_of(_time_or_bound(t) for t in base)
            entry |= {
                "base_reached": sum(t["compute_s"] is not None for t in base),
                "base_compute_s_mean": base_mean,
                "ratio": entry["compute_s_mean"] / base_mean if base_mean else None,
                "diff_compute_s": diffs,
                "pairs_faster": sum(d < 0 for d in diffs),
                "p": sign_flip_p(diffs),
            }
        out[name] = entry
    return out


def heldout_over_time(nodes, base_nodes=None) -> list[dict[str, Any]] | None:
    """At each evaluation every node had (its rounds trained), the mean compute spent,
    greedy and pass@1 over the nodes, and paired by node seed against ``base_nodes``
    the mean greedy difference and its sign-flip p."""
    if not nodes or any("heldout_curve" not in n for n in nodes):
        return None

    def at(n) -> dict[int, list[float]]:
        return {int(p[0]): p for p in n["heldout_curve"]}

    mine = [at(n) for n in nodes]
    base = [at(b) for b in base_nodes] if base_nodes else None
    common = set.intersection(*(set(m) for m in mine))
    if base:
        common &= set.intersection(*(set(b) for b in base))
    out = []
    for k in sorted(common):
        row: dict[str, Any] = {
            "round": k,
            "compute_s": _mean_of(m[k][1] for m in mine),
            "greedy": _mean_of(m[k][2] for m in mine),
            "pass1": _mean_known(m[k][3] for m in mine),
        }
        if base:
            diffs = [m[k][2] - b[k][2] for m, b in zip(mine, base, strict=True)]
            row |= {"diff_greedy": _mean_of(diffs), "p": sign_flip_p(diffs)}
        out.append(row)
    return out


def heldout_by(nodes: Sequence[dict[str, Any]], which: str) -> dict[str, Any] | None:
    """Held-out greedy and pass@1 of ``which`` (eval_start, eval_end) by level, family
    and both, pooled over the nodes' tasks; None if an evaluation lacks the breakdown."""
    evals = [n[which] for n in nodes]
    if not evals or any(e is None or "by" not in e for e in evals):
        return None
    out: dict[str, Any] = {}
    for kind in ("level", "family", "family_level"):
        keys = list(dict.fromkeys(k for e in evals for k in e["by"][kind]))
        out[kind] = {}
        for key in keys:
            cells = [e["by"][kind][key] for e in evals if key in e["by"][kind]]
            tasks = sum(c["tasks"] for c in cells)
            measured = [c for c in cells if c["pass1"] is not None]
            out[kind][key] = {
                "tasks": tasks,
                "greedy": sum(c["greedy"] * c["tasks"] for c in cells) / tasks,
                "pass1": sum(c["pass1"] * c["tasks"] for c in measured)
                / sum(c["tasks"] for c in measured)
                if measured
                else None,
            }
    return out


def compute_seconds(row: dict[str, Any]) -> float:
    """A round's compute (node.Timer.compute_s); for rows from before it was recorded, the
    wall seconds of generation, scoring, screening and training.

    >>> compute_seconds({"compute_s": 2.5, "phase_s/round": 9.0})
    2.5
    >>> compute_seconds({"phase_s/generate": 3.0, "phase_s/train": 1.0})
    4.0
    """
    if row.get("compute_s") is not None:
        return row["compute_s"]
    return sum(row.get(f"phase_s/{k}", 0.0) for k in ("generate", "score", "screen", "train"))


def _mean_of(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def _mean_known(values) -> float | None:
    """The mean of the values that were measured (a greedy-only evaluation has no
    pass@1); None if none was."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


# What sharing did, from the rows' per-round facts (node.Node._record): own and peers'
# groups by outcome, the peers' groups' reward and age, and the gradient clip.
OUTCOMES = ("all_wrong", "all_right", "signal")


def halves(rows: Sequence[dict[str, Any]], rounds: int) -> list[list[dict[str, Any]]]:
    """The rows of rounds 0..R/2-1 and of R/2..R-1 (R = ``rounds``; R/2 rounded down).

    >>> [[r["round"] for r in h] for h in halves([{"round": r} for r in range(5)], 5)]
    [[0, 1], [2, 3, 4]]
    """
    mid = rounds // 2
    return [
        [r for r in rows if r["round"] < mid],
        [r for r in rows if mid <= r["round"] < rounds],
    ]


def mechanism_sums(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Sums over metrics rows from which ``mechanism`` pools nodes: group counts by
    outcome, and each mean's numerator and weight. Rows without a fact (older metrics,
    rounds with no peers' group or no step: null or absent) add nothing to it."""
    out: dict[str, float] = dict.fromkeys(
        [f"{side}_{kind}" for side in ("local", "external") for kind in OUTCOMES], 0
    )
    out |= dict.fromkeys(
        ("external_reward", "external_reward_groups", "steps", "clipped_steps", "grad_norm")
        + ("grad_norm_rounds", "age_rounds", "age_groups"),
        0.0,
    )
    for r in rows:
        for side in ("local", "external"):
            for kind in OUTCOMES:
                out[f"{side}_{kind}"] += r.get(f"groups/{side}_{kind}", 0)
        n = r.get("groups/external", 0)
        if r.get("reward/external_mean") is not None:
            out["external_reward"] += r["reward/external_mean"] * n
            out["external_reward_groups"] += n
        if r.get("train/grad_clipped") is not None:
            out["steps"] += r["train/steps"]
            out["clipped_steps"] += r["train/grad_clipped"] * r["train/steps"]
        if r.get("train/grad_norm_max") is not None:
            out["grad_norm"] += r["train/grad_norm_max"]
            out["grad_norm_rounds"] += 1
        if r.get("groups/external_age_rounds") is not None:
            out["age_rounds"] += r["groups/external_age_rounds"] * n
            out["age_groups"] += n
    return out


def mechanism(nodes: Sequence[dict[str, Any]], half: int, rounds: int) -> dict[str, Any]:
    """One half of the run over a configuration's nodes, pooled over nodes and rounds.

    Shares of own (``local_*``) and peers' (``external_*``) groups by outcome;
    ``external_reward``: mean reward of the peers' groups trained on (each round's mean
    weighted by its groups); ``clipped``: share of optimiser steps whose gradient the clip
    scaled down; ``grad_norm``: mean over rounds with a step of the round's largest
    gradient norm before clipping; ``age_rounds``: mean age of the peers' groups trained
    on, in the node's rounds. None where nothing was measured.
    """
    t: dict[str, float] = {}
    for n in nodes:
        for k, v in n["halves"][half].items():
            t[k] = t.get(k, 0.0) + v
    mid = rounds // 2
    out: dict[str, Any] = {"rounds": [0, mid - 1] if half == 0 else [mid, rounds - 1]}
    for side in ("local", "external"):
        total = sum(t.get(f"{side}_{kind}", 0.0) for kind in OUTCOMES)
        out[f"{side}_groups"] = int(total)
        for kind in OUTCOMES:
            out[f"{side}_{kind}"] = _ratio(t.get(f"{side}_{kind}", 0.0), total)
    out["external_reward"] = _ratio(t.get("external_reward", 0.0), t.get("external_reward_groups"))
    out["steps"] = int(t.get("steps", 0))
    out["clipped"] = _ratio(t.get("clipped_steps", 0.0), t.get("steps"))
    out["grad_norm"] = _ratio(t.get("grad_norm", 0.0), t.get("grad_norm_rounds"))
    out["age_rounds"] = _ratio(t.get("age_rounds", 0.0), t.get("age_groups"))
    return out


def _ratio(x: float, n: float | None) -> float | None:
    return x / n if n else None


def _eval_brief(e: dict[str, Any] | None) -> dict[str, Any] | None:
    if e is None:
        return None
    keep = {k: v for k, v in e.items() if k.startswith("eval/")}
    by = breakdown(e)
    return {
        "greedy": e["eval/greedy"],
        "pass1": e["eval/pass1"],
        "answer_tag_rate": e["eval/answer_tag_rate"],
        "per_task_greedy": keep.get("eval/per_task_greedy", []),
        "per_task_pass1": keep.get("eval/per_task_pass1", []),
        "families": {
            k.removeprefix("eval/greedy/"): v
            for k, v in keep.items()
            if k.startswith("eval/greedy/")
        },
    } | ({} if by is None else {"by": by})


def heldout_summary(nodes: Sequence[dict[str, Any]], which: str) -> dict[str, Any] | None:
    """Held-out accuracy over tasks x nodes: greedy with a Wilson interval, pass@1 with a
    percentile bootstrap over the (node, task) cells. At the start (``eval_start``) every
    node is the same untrained model under the same eval seed: copies of its answers are
    not independent cells, so identical start evaluations count once (``models``: how
    many distinct evaluations were pooled)."""
    evals = [n[which] for n in nodes]
    if not evals or any(e is None for e in evals):
        return None
    if which == "eval_start":
        distinct = {json.dumps([e["per_task_greedy"], e["per_task_pass1"]]): e for e in evals}
        evals = list(distinct.values())
    greedy = [x for e in evals for x in e["per_task_greedy"]]
    pass1 = [x for e in evals for x in e["per_task_pass1"]]
    return {
        "greedy": sum(greedy) / len(greedy) if greedy else 0.0,
        "greedy_ci95": list(wilson_interval(int(sum(greedy)), len(greedy))),
        "pass1": sum(pass1) / len(pass1) if pass1 else 0.0,
        "pass1_ci95": list(bootstrap_interval(pass1)),
        "cells": len(greedy),
        "models": len(evals),
    }


FORMAT_WINDOW = 10  # the early rounds over which the answer-format rate is compared
FORMAT_TARGET = 0.9  # "has the format": this share of a round's own completions


def format_summary(nodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How fast the nodes wrote in the answer format: the mean rate over the first
    rounds, and the first round where the nodes' mean rate reached FORMAT_TARGET.

    >>> format_summary([{"format_rates": [0.5, 1, 1]}, {"format_rates": [0.25, 0.75, 1]}])
    {'early': 0.75, 'first_round_at_target': 2, 'curve': [0.375, 0.875, 1.0]}
    """
    curves = [n["format_rates"] for n in nodes if n.get("format_rates")]
    if not curves:
        return {"early": None, "first_round_at_target": None, "curve": []}
    length = min(len(c) for c in curves)
    curve = [sum(c[r] for c in curves) / len(curves) for r in range(length)]
    early = curve[:FORMAT_WINDOW]
    first = next((r for r, x in enumerate(curve) if x >= FORMAT_TARGET), None)
    return {"early": sum(early) / len(early), "first_round_at_target": first, "curve": curve}


def analyse(spec: ExperimentSpec, data: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The results: per configuration (label -> node summaries, in node order) the totals,
    ratio to J = 0 and paired sign-flip tests against J = 0 by node seed; a configuration
    with another sampling policy, adaptive J or a solver member is also tested against the
    same I/J without it."""
    rounds = spec.experiment.rounds
    order = [a for a in arms(spec) if a.label in data]
    baseline = next((a for a in order if a.external == 0 and a.plain), None)
    base_nodes = data.get(baseline.label) if baseline else None
    out: dict[str, Any] = {"rounds": rounds, "configurations": []}
    for a in order:
        nodes = data[a.label]
        complete = all(n["rounds"] == rounds and n["eval_end"] is not None for n in nodes)
        total = sum(n["cumulative_reward"] for n in nodes)
        entry: dict[str, Any] = {
            "label": a.label,
            "local": a.local,
            "external": a.external,
            "sampling": a.sampling or spec.base.get("pool", {}).get("sampling", "paper"),
            "complete": complete,
            "rounds_done": min((n["rounds"] for n in nodes), default=0),
            "cumulative_reward": total,
            "new_tokens": sum(n["new_tokens"] for n in nodes),
            "node_seconds": sum(n["node_seconds"] for n in nodes),
            # J slots left to own groups because peers' groups aged out (node.py): the
            # rounds ran slower than pool.max_age_s allows, and J was not what was set
            "j_unfilled_expired": sum(n.get("j_unfilled_expired", 0) for n in nodes),
            "compute_seconds": sum(n.get("compute_seconds", 0.0) for n in nodes),
            "sequences_trained": _mean_of(n.get("sequences_trained", 0.0) for n in nodes),
            "tokens_trained": _mean_of(n.get("tokens_trained", 0.0) for n in nodes),
            "heldout_start": heldout_summary(nodes, "eval_start"),
            "heldout_end": heldout_summary(nodes, "eval_end"),
            "format": format_summary(nodes),
            "mechanism": [mechanism(nodes, h, rounds) for h in (0, 1)],
            "solver": a.solver,
            "external_max": a.external_max,
            "variant": a.overrides is not None,
            "nodes": nodes,
        }
        if base_nodes is not None and a is not baseline:
            entry |= _versus(nodes, base_nodes)
            entry["by_replicate"] = by_replicate(nodes, base_nodes, compared_per_swarm(spec))
            entry["by_half"] = by_half(nodes, base_nodes, rounds)
            entry["conclusion"] = conclusion(
                entry["p_reward"],
                total,
                entry["by_replicate"],
                sum(n["cumulative_reward"] for n in base_nodes),
            )
            if "p_reward_per_compute_s" in entry:  # the same rule on reward per compute-second
                entry["by_replicate_per_compute_s"] = by_replicate_rate(
                    nodes, base_nodes, compared_per_swarm(spec)
                )
                entry["conclusion_per_compute_s"] = conclusion(
                    entry["p_reward_per_compute_s"],
                    _rate(_sums(nodes)) or 0.0,
                    entry["by_replicate_per_compute_s"],
                    _rate(_sums(base_nodes)) or 0.0,
                )
        # the endpoints of the late-joiner and staying scenarios, where the spec asks
        versus = base_nodes if a is not baseline else None
        timing = time_to_accuracy_summary(nodes, versus)
        if timing is not None:
            entry["time_to_accuracy"] = timing
            entry["heldout_over_time"] = heldout_over_time(nodes, versus)
            levels = [n["final_levels"] for n in nodes if n.get("final_levels")]
            if levels:
                entry["final_levels_mean"] = {
                    f: _mean_of(x.get(f, 0) for x in levels) for f in levels[0]
                }
        for which, key in (("eval_start", "heldout_start_by"), ("eval_end", "heldout_end_by")):
            by = heldout_by(nodes, which)
            if by is not None:
                entry[key] = by
        plain = next((p for p in order if p.ratio == a.ratio and p.plain), None)
        if not a.plain and plain is not None:
            entry["versus_plain"] = {"label": plain.label, **_versus(nodes, data[plain.label])}
        out["configurations"].append(entry)
    base_total = next(
        (
            c["cumulative_reward"]
            for c in out["configurations"]
            if baseline and c["label"] == baseline.label
        ),
        None,
    )
    base_rate = next(
        (_rate(c) for c in out["configurations"] if baseline and c["label"] == baseline.label),
        None,
    )
    for c in out["configurations"]:
        c["ratio"] = c["cumulative_reward"] / base_total if base_total else None
        c["reward_per_compute_s"] = _rate(c)
        rate = c["reward_per_compute_s"]
        c["ratio_per_compute_s"] = rate / base_rate if rate is not None and base_rate else None
    n = len(base_nodes or [])
    out["pairs"] = n
    out["smallest_p"] = smallest_p(n)
    e = spec.experiment
    if e.confirmatory_runs_on_question is not None:
        out["confirmatory_runs_on_question"] = e.confirmatory_runs_on_question
        if e.question:
            out["question"] = e.question
    if e.late_joiner is not None:
        out["late_joiner"] = e.late_joiner.model_dump()
    if e.setting:
        out["setting"] = {"note": e.setting, "base": _flatten(spec.base)}
    if e.curriculum:
        out["curriculum"] = True
    return out


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config overrides as dotted keys.

    >>> _flatten({"train": {"lr": 1e-5}, "a": 1})
    {'train.lr': 1e-05, 'a': 1}
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _rate(c: dict[str, Any]) -> float | None:
    """Cumulative reward per second of compute (of a node or a configuration)."""
    return c["cumulative_reward"] / c["compute_seconds"] if c.get("compute_seconds") else None


def _versus(nodes, base_nodes) -> dict[str, Any]:
    """Paired by node seed (same index, same seed): per-node differences and their p."""
    pairs = list(zip(nodes, base_nodes, strict=True))
    reward = [x["cumulative_reward"] - b["cumulative_reward"] for x, b in pairs]
    out: dict[str, Any] = {"p_reward": sign_flip_p(reward), "diff_reward": reward}
    if all(_rate(x) is not None and _rate(b) is not None for x, b in pairs):
        rate = [_rate(x) - _rate(b) for x, b in pairs]
        out |= {"p_reward_per_compute_s": sign_flip_p(rate), "diff_reward_per_compute_s": rate}
    if all(x["eval_end"] and b["eval_end"] for x, b in zip(nodes, base_nodes, strict=True)):
        acc = [
            x["eval_end"]["greedy"] - b["eval_end"]["greedy"]
            for x, b in zip(nodes, base_nodes, strict=True)
        ]
        out |= {"p_heldout": sign_flip_p(acc), "diff_heldout": acc}
    return out


def by_replicate(nodes, base_nodes, per_swarm: int) -> list[float | None]:
    """Cumulative reward over J = 0's within each replicate (independent swarm pair).

    >>> by_replicate([{"cumulative_reward": x} for x in (2, 2, 3, 3)],
    ...              [{"cumulative_reward": 1}] * 4, 2)
    [2.0, 3.0]
    """
    out = []
    for k in range(0, len(nodes), per_swarm):
        mine = sum(n["cumulative_reward"] for n in nodes[k : k + per_swarm])
        base = sum(n["cumulative_reward"] for n in base_nodes[k : k + per_swarm])
        out.append(_ratio(mine, base))
    return out


def _sums(nodes) -> dict[str, float]:
    return {
        "cumulative_reward": sum(n["cumulative_reward"] for n in nodes),
        "compute_seconds": sum(n.get("compute_seconds", 0.0) for n in nodes),
    }


def by_replicate_rate(nodes, base_nodes, per_swarm: int) -> list[float | None]:
    """Reward per compute-second over J = 0's within each replicate.

    >>> by_replicate_rate([{"cumulative_reward": 2, "compute_seconds": 2}] * 2,
    ...                   [{"cumulative_reward": 1, "compute_seconds": 2}] * 2, 1)
    [2.0, 2.0]
    """
    out = []
    for k in range(0, len(nodes), per_swarm):
        mine = _rate(_sums(nodes[k : k + per_swarm]))
        base = _rate(_sums(base_nodes[k : k + per_swarm]))
        out.append(mine / base if mine is not None and base else None)
    return out


def by_half(nodes, base_nodes, rounds: int) -> list[dict[str, Any]]:
    """The primary endpoint in rounds 0..R/2-1 and R/2..R-1: ratio to J = 0, and the
    sign-flip p over per-node differences of the half's cumulative reward."""
    mid = rounds // 2
    out = []
    for lo, hi in ((0, mid), (mid, rounds)):
        mine = [sum(n["rewards"][lo:hi]) for n in nodes]
        base = [sum(n["rewards"][lo:hi]) for n in base_nodes]
        out.append(
            {
                "rounds": [lo, hi - 1],
                "ratio": _ratio(sum(mine), sum(base)),
                "p": sign_flip_p([x - b for x, b in zip(mine, base, strict=True)]),
                "pairs_favouring": sum(x > b for x, b in zip(mine, base, strict=True)),
            }
        )
    return out


ALPHA = 0.05


def conclusion(p: float, total: float, replicates: Sequence[float | None], base: float) -> str:
    """The decision rule fixed before the evidence run (docs/results/evidence-cpu/
    PREREGISTRATION.md): "helped" (or "hurt") needs p < ALPHA, the pooled ratio above
    (below) 1, and every replicate's ratio on the same side; else "no detectable
    difference".

    >>> conclusion(0.0078, 12.0, [1.1, 1.3], 10.0)
    'helped'
    >>> conclusion(0.0078, 12.0, [0.9, 1.3], 10.0)
    'no detectable difference'
    """
    if p < ALPHA and total > base and all(r is not None and r > 1 for r in replicates):
        return "helped"
    if p < ALPHA and total < base and all(r is not None and r < 1 for r in replicates):
        return "hurt"
    return "no detectable difference"
