"""The Grafana dashboard and the compose profile that provisions it: every query names
only metrics the node exports (metric_families of a node's and a relay's facts, every
optional part present), and the profile stays on loopback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from sapo_node.net import NetStats
from sapo_node.ops.prometheus import metric_families

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "sapo-node.json"


def _exported() -> set[str]:
    last = {
        "time": 1.0, "reward/mean": 0.5, "rollout/answer_tag_rate": 1.0,
        "rollout/tokens_per_s": 9.0, "train/loss": 0.1, "family_reward/a": 0.5,
        "family_level/a": 1, "groups/local": 2, "groups/external": 2, "groups/trained": 3,
        "phase_s/generate": 1.0, "phase_s/score": 1.0, "phase_s/train": 1.0,
        "phase_s/round": 3.0, "groups/external_age_s": 4.0,
    }  # fmt: skip
    net = {
        **dict.fromkeys(vars(NetStats()), 1),
        **{"shards": "3,17 of 64", "mesh_peers": [4, 5]},  # a sharded swarm's
        "reachability": "private",
        "silent_s": 1,
    }
    facts = {
        "version": "0", "role": "node", "peer_id": "p", "model": "m", "healthy": True,
        "uptime_s": 1.0, "rss_mb": 1.0, "round": 3, "since_progress_s": 1.0,
        "cumulative_reward": 1.0, "pool": {"groups": 1, "mb": 1.0},
        "peer_groups": {"accepted": 1}, "peer_completions": {"completions_checked": 1},
        "last_round": last, "last_eval": {"round": 2, "pass1": 0.5, "greedy": 0.5},
        "net": net,
    }  # fmt: skip
    return {s.name for family in metric_families(facts) for s in family.samples}


def test_every_query_names_a_metric_the_node_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _exported()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(exprs) > 20
    named = set()
    for expr in exprs:
        names = set(re.findall(r"\bsapo_[a-z0-9_]+", expr))
        assert names, expr
        named |= names
    assert named <= exported, named - exported
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and dashboard["uid"] == "sapo-node"


def test_the_monitoring_profile_provisions_the_dashboard_on_loopback() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert "profiles" not in services["sapo-node"]  # the node starts without the profile
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), source
    assert "--web.listen-address=127.0.0.1:9090" in services["prometheus"]["command"]
    assert services["grafana"]["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9141"]
