"""The report of scripts/soak.py: the raw figures a run leaves (``state.json``), read
again by ``--report-only``, and the report made of them, with its targets."""

from __future__ import annotations

import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from scripts.support.procs import json_events
from scripts.support.report import target
from scripts.support.soak_harder import counts_at, within_tolerance
from scripts.support.soak_nodes import (
    BANNED,
    CHECKS,
    EXTERNAL_GROUPS,
    LAST_ROUNDS,
    MAX_OUTLIVE_S,
    NET_RESTART,
    Life,
    Node,
    Rogue,
)


class SoakReport:
    """Mixed into the soak (scripts/soak.py): its state and its report."""

    def state(self) -> dict[str, Any]:
        """The raw figures, from which ``--report-only`` makes the report again."""
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(self.args).items()}
        return {
            "settings": settings,
            "ran_s": self.ran_s,
            "startup_s": self.startup_s,
            "wall0": self.wall0,
            "kills": self.kills,
            "crashes": self.crashes,
            "stop_codes": self.stop_codes,
            "stop_how": self.stop_how,
            "stop_children": self.stop_children,
            "partition": self.partition,
            "rogue_lives": self.rogue.lives if self.rogue else None,
            "nodes": {
                n.name: {
                    "port": n.port,
                    "lives": [vars(life) | {"log": str(life.log)} for life in n.lives],
                    "records": list(n.records.values()),
                    "rss": n.rss,
                    "pool_counts": n.pool_counts,
                }
                for n in self.nodes
            },
        }

    def load(self) -> None:
        st = json.loads((self.out / "state.json").read_text())
        self.kills, self.crashes, self.stop_codes = st["kills"], st["crashes"], st["stop_codes"]
        self.ran_s, self.startup_s = st["ran_s"], st.get("startup_s", 0.0)
        self.wall0, self.partition = st.get("wall0", 0.0), st.get("partition", {})
        self.stop_how, self.stop_children = st.get("stop_how", {}), st.get("stop_children", {})
        given = {"out", "report_only", "settle", "max_rss_growth"}  # may differ this time
        if self.args.warmup is not None:
            given.add("warmup")
        for k, v in st["settings"].items():
            if k not in given:
                setattr(self.args, k, v)
        a = self.args
        for i, (name, v) in enumerate(st["nodes"].items()):
            side = ("left" if i < a.nodes // 2 else "right") if a.partition_at is not None else None
            skew = a.skewed_peer if a.skewed_peer and i == a.nodes - 1 else 0.0
            n = Node(name, self.out / "nodes", self.out / "node.toml", {}, 0, v["port"], side, skew)
            n.lives = [Life(**(life | {"log": Path(life["log"])})) for life in v["lives"]]
            n.records = {(r["round"], r["time"]): r for r in v["records"]}
            n.rss = [tuple(x) for x in v["rss"]]
            n.pool_counts = [tuple(x) for x in v["pool_counts"]]
            self.nodes.append(n)
        if st.get("rogue_lives"):
            self.rogue = Rogue(self.out, {}, 0)
            self.rogue.lives = st["rogue_lives"]

    def report(self) -> dict[str, Any]:
        a = self.args
        by_peer = {n.peer_id: n.name for n in self.nodes}
        if self.rogue is not None:
            by_peer[self.rogue.peer_id] = "rogue"
        tenth = max((a.duration - a.warmup) / 10, 3 * a.sample_every)
        nodes: dict[str, Any] = {}
        pool_refusals: Counter[str] = Counter()
        received_from: dict[str, Counter[str]] = {n.name: Counter() for n in self.nodes}
        recent_from: dict[str, int] = {n.name: 0 for n in self.nodes}
        for n in self.nodes:
            final = n.pool_counts[-1][1] if n.pool_counts else {}
            before = counts_at(n.pool_counts, a.duration - tenth)
            for author, counts in final.items():
                name = by_peer.get(author, author[:16])
                for outcome, k in counts.items():
                    if outcome.startswith(CHECKS):
                        continue
                    if outcome != "held":
                        received_from.setdefault(name, Counter())[outcome] += k
                    if outcome not in ("held", "accepted"):
                        pool_refusals[outcome] += k
                if name in recent_from:
                    old = before.get(author, {})
                    recent_from[name] += counts.get("accepted", 0) - old.get("accepted", 0)
        net_refusals: Counter[str] = Counter()
        bans: dict[str, list[dict]] = {n.name: [] for n in self.nodes}  # of each node
        net_restarts: dict[str, list[float | None]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for life in n.lives:
                for e in json_events(life.log):
                    if e.get("event") == "message refused":
                        net_refusals[e.get("reason", "?")] += 1
                    elif e.get("event") == BANNED:
                        banned = by_peer.get(e.get("peer"), str(e.get("peer"))[:16])
                        ban = {"by": n.name, "at": e.get("timestamp"), "s": e.get("seconds")}
                        bans.setdefault(banned, []).append(ban | {"t": self._at(n, e)})
                    elif e.get("event") == NET_RESTART:
                        net_restarts[n.name].append(self._at(n, e))
        restarts = self._restarts()
        for n in self.nodes:
            recs = sorted(n.records.values(), key=lambda r: (r["time"], r["round"]))
            settled = [s for s in n.rss if s[0] >= a.warmup and self._settled(n.lives[s[3]], s[0])]
            t_first, t_last = (settled[0][0], settled[-1][0]) if settled else (0, 0)
            first = [s[1] + s[2] for s in settled if s[0] < t_first + tenth]
            last = [s[1] + s[2] for s in settled if s[0] > t_last - tenth]
            rss: dict[str, Any] = {
                "first_mb": round(statistics.median(first), 1) if first else None,
                "last_mb": round(statistics.median(last), 1) if last else None,
                "peak_mb": round(max((s[1] + s[2] for s in n.rss), default=0), 1),
            }
            rss["growth_pct"] = (
                round(100 * (rss["last_mb"] - rss["first_mb"]) / rss["first_mb"], 2)
                if first and last
                else None
            )
            rss["samples"] = [[s[0], round(s[1], 1), round(s[2], 1), s[3]] for s in n.rss]
            tail = recs[-LAST_ROUNDS:]
            published = sum(r["net/published"] for r in recs)
            got = received_from.get(n.name, Counter())
            # Unable to publish: nothing of it reached the others lately. Unsent groups
            # alone are not that: a node that makes groups faster than the receivers' rate
            # limit (tiny models, short completions) fills its queue and drops the excess
            # by design (net/unsent), while the others still get its groups at the rate.
            problems = []
            refused_by_design = n.skew and not within_tolerance(n.skew)  # its own target
            if len(self.nodes) > 1 and recent_from.get(n.name, 0) == 0 and not refused_by_design:
                problems.append("no other node accepted a group of it in the last tenth")
            nodes[n.name] = {
                "peer_id": n.peer_id,
                "port": n.port,
                "processes": len(n.lives),
                "killed": sum(life.killed for life in n.lives),
                "last_round": max((r["round"] for r in recs), default=None),
                "rounds_run": len(recs),
                "groups_published": published,
                "groups_unsent": sum(r["net/unsent"] for r in recs),
                "groups_received": sum(r["net/received"] for r in recs),
                "groups_accepted": sum(r["net/accepted"] for r in recs),
                "received_by_others": dict(got),
                "accepted_by_others_last_tenth": recent_from.get(n.name, 0),
                "delivery_ratio": round(sum(got.values()) / (published * (len(self.nodes) - 1)), 3)
                if published and len(self.nodes) > 1
                else None,
                "peers_last_rounds": [r["net/peers"] for r in tail],
                "banned_by_others": bans.get(n.name, []),
                "unable_to_publish": problems,
                "stop_exit_code": self.stop_codes.get(n.name),
                "data_dir_mb": round(
                    sum(p.stat().st_size for p in n.data_dir.rglob("*") if p.is_file()) / 2**20,
                    2,
                ),
                "rss": rss,
            }
        growth = {k: v["rss"]["growth_pct"] for k, v in nodes.items()}
        unmeasured = [k for k, g in growth.items() if g is None]
        bad_growth = {k: g for k, g in growth.items() if g is not None and g > a.max_rss_growth}
        not_resumed = [r for r in restarts if not r["resumed"]]
        stuck = {k: v["unable_to_publish"] for k, v in nodes.items() if v["unable_to_publish"]}
        unclean = {k: c for k, c in self.stop_codes.items() if c != 0}
        last_restarts = {
            n.name: k
            for n in self.nodes
            if (k := sum(e.get("event") == NET_RESTART for e in json_events(n.life.log)))
        }
        left_at_stop = {k: c for k, c in self.stop_children.items() if c}
        outlived = {f"{r['node']}@{r['t']:.0f}": r["child_outlived_s"] for r in restarts}
        too_long = {k: v for k, v in outlived.items() if v is not None and v > MAX_OUTLIVE_S} | {
            f"{k} at the stop": f"{c} left" for k, c in left_at_stop.items()
        }
        accounts = self._accounting()
        unexplained = {
            k: v["unexplained"]
            for k, v in accounts.items()
            if not 0 <= v["unexplained"] <= v["tolerance"]
        }
        targets = {
            "no_survivor_crash": target(not self.crashes, f"{len(self.crashes)} crash(es)"),
            "rss_growth": target(
                not bad_growth and not unmeasured,
                f"growth % {growth} (max {a.max_rss_growth})"
                + (f"; not measured: {unmeasured}" if unmeasured else ""),
            ),
            "every_restart_resumed": target(
                bool(restarts) and not not_resumed,
                f"{len(restarts) - len(not_resumed)} of {len(restarts)} resumed",
            ),
            "every_node_publishes": target(not stuck, json.dumps(stuck) if stuck else "all do"),
            "clean_stop": target(
                not unclean and not last_restarts and len(self.stop_codes) == len(self.nodes),
                f"exit codes on SIGTERM {self.stop_codes}, sent to {self.stop_how}; "
                f"network process restarted in the stopped process: {last_restarts or 'none'}",
            ),
            "children_end_with_their_node": target(
                not too_long,
                f"at most {max((v for v in outlived.values() if v is not None), default=0)} s "
                f"after a SIGKILL ({len(outlived)} kills), max {MAX_OUTLIVE_S}"
                + (f"; over it: {too_long}" if too_long else "; none left at the stop"),
            ),
            "every_group_accounted_for": target(
                not unexplained,
                "accepted groups drawn from each pool (neither expired, evicted nor held) "
                "against those its rounds trained on or distrusted, off by "
                f"{ {k: v['unexplained'] for k, v in accounts.items()} } (at most a round "
                "cut short a process: "
                f"{ {k: v['tolerance'] for k, v in accounts.items()} })",
            ),
        }
        extra: dict[str, Any] = {}
        honest_bans = [b | {"of": k} for k, v in bans.items() if k != "rogue" for b in v]
        if a.partition_at is not None:
            extra["partition"], targets["partition_heals"] = self._partition_report(
                honest_bans, net_restarts
            )
        if a.skewed_peer:
            extra["skewed_peer"], targets["skewed_peer"] = self._skew_report()
        if self.rogue is not None:
            extra["rogue"], targets["rogue_ban_holds"] = self._rogue_report()
        return {
            "command": [sys.executable, *sys.argv],
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
            "startup_s": round(self.startup_s, 1),
            "ran_s": round(self.ran_s, 1),
            "cpu_count": os.cpu_count(),
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "ok": all(t["ok"] for t in targets.values()),
            "targets": targets,
            "survivor_crashes": self.crashes,
            "kills": len(self.kills),
            "restarts": restarts,
            "refusals": {"pool": dict(pool_refusals), "network": dict(net_refusals)},
            "bans": {k: len(v) for k, v in bans.items()},
            "network_process_restarts": {k: len(v) for k, v in net_restarts.items()},
            "groups_accounted": accounts,
            **extra,
            "nodes": nodes,
        }

    def _accounting(self) -> dict[str, dict[str, int]]:
        """Per receiver, from its final pool counts: the accepted groups that left the
        pool neither aged out (``expired``) nor evicted, and are not held: the ones its
        rounds drew. Against them, the peers' groups its rounds trained on, or dropped
        as distrusted, in its metrics. A round cut short by a kill or the stop drew its
        groups but wrote no line: at most ``external_groups`` per process."""
        out = {}
        for n in self.nodes:
            total: Counter[str] = Counter()
            for counts in (n.pool_counts[-1][1] if n.pool_counts else {}).values():
                total.update(counts)
            evicted = total["evicted_quota"] + total["evicted_full"]
            drawn = total["accepted"] - total["expired"] - evicted - total["held"]
            trained = sum(
                r.get("groups/external", 0) + r.get("defence/distrusted", 0)
                for r in n.records.values()
            )
            out[n.name] = {
                "accepted": total["accepted"],
                "expired": total["expired"],
                "evicted": evicted,
                "held": total["held"],
                "drawn": drawn,
                "trained_or_distrusted": trained,
                "unexplained": drawn - trained,
                "tolerance": EXTERNAL_GROUPS * len(n.lives),
            }
        return out

    def _settled(self, life: Life, t: float) -> bool:
        """Whether a sample at ``t`` is ``--settle`` s past the process's first round."""
        return life.first_round_at is not None and t - life.first_round_at >= self.args.settle

    def _restarts(self) -> list[dict]:
        """Per kill: the checkpoint the killed process last logged, the round the next one
        resumed at, and the first round it ran."""
        out = []
        names = {n.name: n for n in self.nodes}
        for k in self.kills:
            n = names[k["node"]]
            saved = [
                e["round"]
                for life in n.lives[: k["life"] + 1]
                for e in json_events(life.log)
                if e.get("event") == "checkpoint saved"
            ]
            nxt = n.lives[k["life"] + 1]
            resumed = [e["round"] for e in json_events(nxt.log) if e.get("event") == "resumed"]
            r = {
                "node": n.name,
                "t": k["t"],
                "last_checkpoint_logged": max(saved, default=None),
                "orphans_after_kill": n.lives[k["life"]].orphans,
                "child_outlived_s": n.lives[k["life"]].outlived_s,
                "resumed_round": resumed[0] if resumed else None,
                "first_round_after": nxt.first_round,
                "seconds_to_first_round": round(nxt.first_round_at - nxt.started, 1)
                if nxt.first_round_at is not None
                else None,
            }
            r["resumed"] = (
                r["resumed_round"] is not None
                and r["resumed_round"] >= (r["last_checkpoint_logged"] or 0)
                and r["first_round_after"] == r["resumed_round"]
            )
            out.append(r)
        return out


def print_report(rep: dict[str, Any]) -> None:
    print(f"\nsoak: {rep['settings']['nodes']} nodes, {rep['ran_s']:.0f} s, {rep['kills']} kills")
    print(
        f"{'node':5} {'procs':>5} {'rounds':>6} {'pub':>6} {'unsent':>6} {'got':>6} "
        f"{'by others':>9} {'ratio':>5} {'rss first':>9} {'last':>7} {'growth':>7} {'exit':>4}"
    )
    for name, v in rep["nodes"].items():
        rss = v["rss"]
        print(
            f"{name:5} {v['processes']:5} {v['rounds_run']:6} {v['groups_published']:6} "
            f"{v['groups_unsent']:6} {v['groups_received']:6} "
            f"{sum(v['received_by_others'].values()):9} {v['delivery_ratio'] or 0:5.2f} "
            f"{rss['first_mb'] or 0:9.1f} {rss['last_mb'] or 0:7.1f} "
            f"{rss['growth_pct'] if rss['growth_pct'] is not None else 'n/a':>7} "
            f"{v['stop_exit_code']!s:>4}"
        )
    resumed = sum(r["resumed"] for r in rep["restarts"])
    print(f"restarts resumed: {resumed} of {len(rep['restarts'])}")
    print(f"refusals: pool {rep['refusals']['pool']}, network {rep['refusals']['network']}")
    print(f"bans of each node by the others (not a target): {rep['bans']}")
    for name, t in rep["targets"].items():
        print(f"  {'ok  ' if t['ok'] else 'FAIL'} {name}: {t['detail']}")
    print("all targets met" if rep["ok"] else "TARGETS MISSED")
