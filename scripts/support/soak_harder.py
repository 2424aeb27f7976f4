"""The harder runs of scripts/soak.py, each an option: the partition (``--partition-at``),
the skewed clock (``--skewed-peer``) and the rogue peer (``--rogue-peer``). Their steps
during the run and their sections of the report, as methods of the soak."""

from __future__ import annotations

import contextlib

from sapo_node.config import PoolSection
from sapo_node.intake import wire
from sapo_node.intake.pool import PoolError, summary
from scripts.support.procs import event_time, json_events
from scripts.support.report import target
from scripts.support.soak_nodes import (
    BANNED,
    CHECKS,
    CUT_GRACE_S,
    HEAL_POLL_S,
    NOT_ARRIVALS,
    ROGUE_CHECK_S,
    ROGUE_DOWN_S,
    ROGUE_MIN_LINES,
    ROGUE_RESTART_AFTER_S,
    Node,
)


class HarderRuns:
    """Mixed into the soak (scripts/soak.py): what ``--partition-at``, ``--skewed-peer``
    and ``--rogue-peer`` add to its run and its report."""

    def _partition_step(self, t: float) -> None:
        """Cut the link at --partition-at; from CUT_GRACE_S later until the heal, count
        the groups that still cross; heal it --partition-for s after the cut, then time
        until each node takes in a group from the other half again."""
        a, p = self.args, self.partition
        if "cut_at" not in p:
            if t >= a.partition_at:
                self.halves.cut()
                p["cut_at"] = round(t, 1)
                print(f"[soak] {t:7.0f} s  partition: the link is cut", flush=True)
        elif "during" not in p:
            if t >= p["cut_at"] + CUT_GRACE_S:
                p["during"] = self._across()
        elif "healed_at" not in p:
            if t >= a.partition_at + a.partition_for:
                now = self._across()
                p["crossed_while_cut"] = {
                    k: v - p["during"][k] for k, v in now.items() if k in p["during"]
                }
                self.halves.heal()
                p["healed_at"], p["at_heal"], p["heal_s"] = round(t, 1), now, {}
                print(f"[soak] {t:7.0f} s  partition: the link is back", flush=True)
        elif self.heal_poll_at <= t < p["healed_at"] + a.heal_within:
            self.heal_poll_at = t + HEAL_POLL_S
            for name, k in self._across().items():
                if name not in p["heal_s"] and k > p["at_heal"].get(name, k):
                    p["heal_s"][name] = round(t - p["healed_at"], 1)

    def _across(self) -> dict[str, int]:
        """Per node (whose pool can be read now): the groups it has taken in so far,
        accepted or refused, from the nodes in the other half."""
        side = {n.peer_id: n.side for n in self.nodes}
        out = {}
        for n in self.nodes:
            with contextlib.suppress(PoolError):
                peers = summary(n.data_dir / "pool.sqlite3")["peers"]
                out[n.name] = sum(
                    k
                    for author, counts in peers.items()
                    if side.get(author, n.side) != n.side
                    for outcome, k in counts.items()
                    if outcome not in NOT_ARRIVALS and not outcome.startswith(CHECKS)
                )
        return out

    def _at(self, n: Node, event: dict) -> float | None:
        """When a node logged ``event``, on the soak's clock (its own clock's skew out)."""
        wall = event_time(event)
        return None if wall is None else round(wall - n.skew - self.wall0, 1)

    def _rogue_bans(self) -> dict[str, list[tuple[float, float]]]:
        """Per node that banned the rogue: (when, for how many seconds) of each ban."""
        out: dict[str, list[tuple[float, float]]] = {}
        for n in self.nodes:
            for life in n.lives:
                for e in json_events(life.log):
                    if e.get("event") == BANNED and e.get("peer") == self.rogue.peer_id:
                        ban = (self._at(n, e), float(e.get("seconds", 0.0)))
                        out.setdefault(n.name, []).append(ban)
        return out

    def _rogue_step(self, t: float) -> None:
        """Kill the rogue once every live node has banned it (or ROGUE_RESTART_AFTER_S
        after its first ban), and start it again with the same key ROGUE_DOWN_S later."""
        r = self.rogue
        if len(r.lives) > 1:
            return
        if r.lives[0]["ended"] is None:
            bans = self._rogue_bans()
            first = min((b[0][0] for b in bans.values()), default=None)
            alive = {n.name for n in self.nodes if n.alive()}
            if first is not None and (alive <= set(bans) or t >= first + ROGUE_RESTART_AFTER_S):
                r.kill(t)
                self.rogue_restart_at = t + ROGUE_DOWN_S
                print(f"[soak] {t:7.0f} s  rogue banned by {sorted(bans)}: killed", flush=True)
        elif t >= self.rogue_restart_at:
            r.start(self.nodes, wire.topic(self.swarm), t)
            print(f"[soak] {t:7.0f} s  rogue started again, same key", flush=True)

    def _banning_to_kill(self, t: float) -> set[str]:
        """With --rogue-peer, once the rogue is back: the nodes that ban it with at least
        ROGUE_CHECK_S of their ban left, until one of them has been killed during its
        ban (then none: the churn picks among all)."""
        if self.rogue is None or len(self.rogue.lives) < 2:
            return set()
        names = set()
        for name, bans in self._rogue_bans().items():
            start, seconds = bans[0]
            if any(k["node"] == name and start < k["t"] < start + seconds for k in self.kills):
                return set()
            if t < start + seconds - ROGUE_CHECK_S:
                names.add(name)
        return names

    def _partition_report(
        self, honest_bans: list[dict], net_restarts: dict[str, list[float | None]]
    ) -> tuple[dict, dict]:
        a, p = self.args, self.partition
        end = p.get("healed_at", a.duration) + a.heal_within
        window = [p.get("cut_at", a.partition_at), end]
        bans = [b for b in honest_bans if b["t"] is not None and window[0] <= b["t"] <= end]
        restarts = {
            k: [t for t in v if t is not None and window[0] <= t <= end]
            for k, v in net_restarts.items()
        }
        restarts = {k: v for k, v in restarts.items() if v}
        crossed = {k: v for k, v in p.get("crossed_while_cut", {}).items() if v}
        heal_s = p.get("heal_s", {})
        slow = [n.name for n in self.nodes if n.name not in heal_s]
        section = {
            "halves": {n.name: n.side for n in self.nodes},
            "cut_at": p.get("cut_at"),
            "healed_at": p.get("healed_at"),
            "taken_in_across_while_cut": p.get("crossed_while_cut"),
            "seconds_to_take_in_across_after_heal": heal_s,
            "honest_bans_in_window": bans,
            "network_process_restarts_in_window": restarts,
        }
        ok = "healed_at" in p and "during" in p and not crossed and not slow
        verdict = target(
            ok and not bans and not restarts,
            f"cut at {p.get('cut_at')} s, healed at {p.get('healed_at')} s; groups across "
            f"while cut: {crossed or 'none'}; each node took in a group from the other half "
            f"again {max(heal_s.values(), default=None)} s after the heal at worst "
            f"(max {a.heal_within})"
            + (f", not: {slow}" if slow else "")
            + f"; bans {len(bans)}, network process restarts {restarts or 0} "
            f"from the cut to {end:.0f} s",
        )
        return section, verdict

    def _skew_report(self) -> tuple[dict, dict]:
        """How the others took the skewed node's groups: all accepted (no clock refusal)
        within the tolerance, all refused beyond it (SPEC.md, the clock rule)."""
        skew, skewed = self.args.skewed_peer, self.nodes[-1]
        pool = PoolSection()
        within = within_tolerance(skew)
        at = {
            n.name: (n.pool_counts[-1][1] if n.pool_counts else {}).get(skewed.peer_id, {})
            for n in self.nodes
            if n is not skewed
        }
        accepted = {k: c.get("accepted", 0) for k, c in at.items()}
        future = {k: c.get("from_the_future", 0) for k, c in at.items()}
        too_old = {k: c.get("too_old", 0) for k, c in at.items()}
        if within:
            ok = all(accepted.values()) and not any(future.values())
        else:
            ok = not any(accepted.values()) and (any(future.values()) or any(too_old.values()))
        section = {
            "node": skewed.name,
            "skew_s": skew,
            "tolerance": {"ahead_s": pool.max_clock_skew_s, "behind_s": pool.max_age_s},
            "expected": "accepted" if within else "refused",
            "its_groups_at_the_others": at,
        }
        detail = (
            f"{skewed.name} {skew:+g} s ({'within' if within else 'beyond'} the tolerance: "
            f"{pool.max_clock_skew_s:g} s ahead, {pool.max_age_s:g} s behind); its groups "
            f"accepted {accepted}, from_the_future {future}, too_old {too_old}"
        )
        return section, target(ok, detail)

    def _rogue_report(self) -> tuple[dict, dict]:
        """Whether each ban of the rogue held through its restart and through the banning
        node's restarts: in each window (from that restart to the ban's end) the node
        refused no message of the rogue again and did not ban it again (a ban that
        held keeps its messages out), while the rogue was up, dialling it."""
        r = self.rogue
        status = [(e["time"] - self.wall0, e) for e in r.status()]
        back = round(r.lives[1]["started"], 1) if len(r.lives) > 1 else None
        per_node, windows = {}, []
        for n in self.nodes:
            events = [(self._at(n, e), e) for life in n.lives for e in json_events(life.log)]
            mine = [(t, e) for t, e in events if t is not None]
            bans = [t for t, e in mine if e.get("event") == BANNED and e.get("peer") == r.peer_id]
            if not bans:
                continue
            start = bans[0]
            seconds = next(
                float(e.get("seconds", 0.0))
                for t, e in mine
                if e.get("event") == BANNED and e.get("peer") == r.peer_id
            )
            end = start + seconds
            checks = []
            if back is not None and back < end:
                checks.append(("rogue restarted", back))
            checks += [
                ("node restarted", life.started) for life in n.lives if start < life.started < end
            ]
            for what, since in checks:
                refused = sum(
                    since <= t < end
                    and e.get("event") == "message refused"
                    and e.get("author") == r.peer_id
                    for t, e in mine
                )
                again = sum(since < t < end for t in bans[1:])
                seen = [e for t, e in status if since <= t < end]
                windows.append(
                    {
                        "node": n.name,
                        "after": what,
                        "from": round(since, 1),
                        "to": round(end, 1),
                        "refused_again": refused,
                        "banned_again": again,
                        "rogue_status_lines": len(seen),
                        "rogue_connected_in": sum(n.peer_id in e["connected"] for e in seen),
                        "rogue_had_a_stream_in": sum(n.peer_id in e["streams"] for e in seen),
                    }
                )
            per_node[n.name] = {"bans_at": bans, "first_ban_s": seconds}
        held = [w for w in windows if not w["refused_again"] and not w["banned_again"]]
        covered = {w["after"] for w in windows if w["rogue_status_lines"] >= ROGUE_MIN_LINES}
        ok = (
            bool(per_node)
            and len(held) == len(windows)
            and covered
            == {
                "rogue restarted",
                "node restarted",
            }
        )
        section = {
            "peer_id": r.peer_id,
            "lives": r.lives,
            "bans": per_node,
            "windows": windows,
        }
        detail = (
            f"banned by {sorted(per_node)}; the ban held in {len(held)} of {len(windows)} "
            f"windows (after the rogue's restart at {back} s, after a banning node's "
            f"restart: {sum(w['after'] == 'node restarted' for w in windows)})"
        )
        return section, target(ok, detail)


def within_tolerance(skew: float) -> bool:
    """Whether peers take the groups of a node whose clock is ``skew`` s ahead (SPEC.md,
    the clock rule, with the default pool settings the soak's nodes run with)."""
    pool = PoolSection()
    return -pool.max_age_s < skew <= pool.max_clock_skew_s


def counts_at(history: list[tuple[float, dict]], t: float) -> dict:
    """The last pool counts read before ``t`` (empty if none)."""
    before = [c for when, c in history if when <= t]
    return before[-1] if before else {}
