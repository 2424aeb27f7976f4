"""The node's facts as Prometheus metric families (``/metrics`` of the status endpoint,
status.py): every family named ``sapo_*``, from one snapshot of :meth:`Status.facts`.
docs/operations.md lists them; the Grafana dashboard in deploy/ draws them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

# the round loop's phases whose seconds (phase_s/<phase>) become sapo_phase_seconds
PHASES = ("generate", "score", "screen", "train", "eval", "round")


class FactsCollector(Collector):
    """Prometheus metrics of a node's facts (``Status.facts``), built at each scrape."""

    def __init__(self, facts: Callable[[], dict[str, Any]]) -> None:
        self.facts = facts

    def collect(self) -> Iterator[Metric]:
        return iter(metric_families(self.facts()))


def metric_families(f: dict[str, Any]) -> list[Metric]:
    """The ``sapo_*`` metrics of one snapshot of facts."""
    out: list[Metric] = [
        InfoMetricFamily(
            "sapo",
            "What runs here.",
            value={k: str(f.get(k) or "") for k in ("version", "role", "peer_id", "model")},
        )
    ]

    def gauge(name: str, doc: str, value: float) -> None:
        out.append(GaugeMetricFamily(name, doc, value=float(value)))

    def labelled(name: str, doc: str, label: str, values: dict[str, float], kind=GaugeMetricFamily):
        family = kind(name, doc, labels=[label])
        for key, value in values.items():
            family.add_metric([key], float(value))
        out.append(family)

    gauge("sapo_healthy", "1 when /healthz answers 200, else 0.", f["healthy"])
    gauge("sapo_uptime_seconds", "Seconds since the node's process started.", f["uptime_s"])
    gauge("sapo_resident_memory_bytes", "Resident memory of the node process.", f["rss_mb"] * 2**20)
    if f["role"] == "node":
        gauge("sapo_round", "Rounds completed (the number of the next round).", f["round"])
        gauge(
            "sapo_seconds_since_progress",
            "Seconds since a phase or round of the loop last finished.",
            f["since_progress_s"],
        )
        gauge("sapo_cumulative_reward", "Sum of the rounds' mean rewards.", f["cumulative_reward"])
        gauge("sapo_pool_groups", "Peers' groups held in the pool.", f["pool"]["groups"])
        gauge("sapo_pool_bytes", "Bytes of the messages held in the pool.", f["pool"]["mb"] * 2**20)
        labelled(
            "sapo_peer_groups",
            "Peers' groups by outcome: accepted, refused (by reason), evicted or expired; "
            "counted since the pool was created.",
            "outcome",
            f["peer_groups"],
            CounterMetricFamily,
        )
        labelled(
            "sapo_peer_completions",
            "Peers' completions that the poisoning checks looked at (completions_checked) "
            "and refused, by reason; counted since the pool was created.",
            "outcome",
            f["peer_completions"],
            CounterMetricFamily,
        )
        if (r := f["last_round"]) is not None:
            _round_metrics(r, gauge, labelled)
        if (e := f["last_eval"]) is not None:
            gauge("sapo_eval_round", "Round of the last held-out evaluation.", e["round"])
            gauge("sapo_eval_pass1", "Held-out pass@1 at the sampling temperature.", e["pass1"])
            gauge("sapo_eval_greedy", "Held-out greedy accuracy.", e["greedy"])
    if (n := f.get("net")) is not None:
        gauge("sapo_peers", "Swarm peers on the topic now.", n["peers"])
        if n.get("reachability"):
            labelled(
                "sapo_net_reachability",
                "1 for this node's reachability: public, private or local (loopback only).",
                "state",
                {k: float(k == n["reachability"]) for k in ("public", "private", "local")},
            )
        labelled(
            "sapo_net_connections",
            "Connections to peers now, direct or through a circuit relay.",
            "kind",
            {"direct": n["connections_direct"], "relayed": n["connections_relayed"]},
        )
        gauge("sapo_dht_routing_table", "Peers in the DHT routing table.", n["routing_table"])
        if n.get("shards"):
            joined = n["shards"].split(" of ")[0].split(",")
            labelled(
                "sapo_net_shard_mesh_peers",
                "GossipSub mesh peers on each shard topic this node joined (docs/scale.md).",
                "shard",
                dict(zip(joined, n.get("mesh_peers") or (), strict=False)),
            )
        gauge(
            "sapo_dht_lan_addresses",
            "LAN addresses the DHT would hand out (routing table, provider records).",
            n["dht_lan_addrs"],
        )
        for key, name, doc in (
            ("published", "sapo_net_published", "Groups handed to the network."),
            ("publish_dropped", "sapo_net_unsent", "Groups not shared: the queue was full."),
            ("received", "sapo_net_received", "Messages received that passed the wire checks."),
            ("rejected", "sapo_net_rejected", "Messages refused by the network's wire checks."),
            ("inbox_dropped", "sapo_net_inbox_dropped", "Messages dropped, the inbox full."),
            ("bytes_in", "sapo_net_received_bytes", "Bytes received (GossipSub frames)."),
            ("bytes_out", "sapo_net_sent_bytes", "Bytes sent (GossipSub frames)."),
            ("restarts", "sapo_net_restarts", "Restarts of the network process."),
        ):
            out.append(CounterMetricFamily(name, doc, value=float(n[key])))
        if "silent_s" in n:
            gauge(
                "sapo_net_seconds_since_report",
                "Seconds since the network process last reported.",
                n["silent_s"],
            )
    return out


def _round_metrics(r: dict[str, Any], gauge, labelled) -> None:
    """The last round's record as gauges."""
    gauge("sapo_last_round_timestamp_seconds", "When the last round was recorded.", r["time"])
    gauge("sapo_reward", "Mean reward of the node's own completions, last round.", r["reward/mean"])
    gauge("sapo_answer_tag_rate", "Own completions with answer tags.", r["rollout/answer_tag_rate"])
    gauge("sapo_tokens_per_second", "Generation speed, last round.", r["rollout/tokens_per_s"])
    gauge("sapo_train_loss", "GRPO loss, last round.", r["train/loss"])
    families = _labels(r, "family_reward/")
    labelled("sapo_family_reward", "Mean own reward per family, last round.", "family", families)
    levels = _labels(r, "family_level/")
    labelled("sapo_family_level", "Curriculum level per family.", "family", levels)
    labelled(
        "sapo_round_groups",
        "Groups in the last round: own, peers', and trained on (with signal).",
        "kind",
        {
            "local": r["groups/local"],
            "external": r["groups/external"],
            "trained": r["groups/trained"],
        },
    )
    labelled(
        "sapo_phase_seconds",
        "Seconds per phase of the last round.",
        "phase",
        {p: r[f"phase_s/{p}"] for p in PHASES if f"phase_s/{p}" in r},
    )
    if "groups/external_age_s" in r:
        gauge(
            "sapo_trained_group_age_seconds",
            "Mean age of the peers' groups the last round trained on.",
            r["groups/external_age_s"],
        )


def _labels(r: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The keys of a record that carry a label value last (``family_reward/<family>``), by
    that value: a Prometheus metric's label, as ``sapo_family_reward{family}``.

    >>> _labels({"family_reward/arith": 0.5, "reward/mean": 0.5}, "family_reward/")
    {'arith': 0.5}
    """
    return {k.removeprefix(prefix): v for k, v in r.items() if k.startswith(prefix)}
