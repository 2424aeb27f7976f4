"""Whole nodes through real NAT: ``tests/integration/test_nat.py`` runs

    unshare -rn python -m tests.support.nat_nodes --model TINY_MODEL_DIR

in the namespaces of ``nat_swarm.py`` (a wan with two public addresses, home1 behind a
port-preserving masquerade, home2 behind a symmetric one), with real ``sapo-node start``
processes: two relays (``--no-train``, no model) on the wan, and a tiny-model trainer in
each home, listening on 0.0.0.0 as by default, bootstrapped from the relays; each is
given ``net.lan_ranges`` (the homes' 198.19/16, through the environment). It checks
that each trainer reads itself private, the relays public, and that each trainer
accepts groups authored by the other (its status endpoint, asked inside its own
namespace). It prints one JSON line and exits 0 if so, 1 if not, 3 if not in a fresh
namespace.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from sapo_node.net import identity
from tests.support.mdns_pair import wait_for
from tests.support.namespaces import script_main
from tests.support.nat_swarm import LAN_RANGES, Netns, build
from tests.support.swarm import REPO, node_config

RELAYS = {"pub1": "198.18.0.1", "pub2": "198.18.0.2"}
HOMES = {"h1": "home1", "h2": "home2"}
STATUS = "127.0.0.1:9141"  # each home node's, on its own namespace's loopback


class Member:
    def __init__(self, name: str, root: Path, where: str | None) -> None:
        self.name, self.where = name, where
        self.data_dir = root / name
        self.peer_id = identity.peer_id_of(self.data_dir)
        self.log = root / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, ns: Netns, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "SAPO_NET__ENABLED": "true"}
        env["SAPO_NET__MDNS"] = "false"
        # the homes' LANs (198.19/16) count as LAN on every member (nat_swarm.LAN_RANGES)
        env["SAPO_NET__LAN_RANGES"] = json.dumps(LAN_RANGES)
        with ns.inside(self.where), self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sapo_node.cli", "start", "--data-dir",
                 str(self.data_dir), "--json-logs", "--swarm", "nat-nodes", *args],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def status(self, ns: Netns) -> dict | None:
        try:
            with (
                ns.inside(self.where),
                urllib.request.urlopen(f"http://{STATUS}/status", timeout=2) as r,
            ):
                return json.loads(r.read())
        except (OSError, ValueError):
            return None

    def tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
        except FileNotFoundError:
            return ""


def run(model: Path, within: float) -> dict[str, object]:
    result: dict[str, object] = {"ok": False, "checks": {}}
    checks: dict[str, object] = result["checks"]  # type: ignore[assignment]
    ns = Netns(["r1", "home1", "r2", "home2"])
    build(ns)
    with tempfile.TemporaryDirectory(prefix="nat-nodes-") as tmp:
        root = Path(tmp)
        relays = {n: Member(n, root, None) for n in RELAYS}
        homes = {n: Member(n, root, where) for n, where in HOMES.items()}
        members = {**relays, **homes}
        try:
            boot = []
            for name, ip in RELAYS.items():
                listen = f"/ip4/{ip}/tcp/4001"
                relays[name].start(ns, ["--no-train", "--listen", listen, "--status-listen",
                                        f"{ip}:9141"])  # fmt: skip
                boot += ["--bootstrap", f"{listen}/p2p/{relays[name].peer_id}"]
            config = node_config(root / "tiny.toml", model, "nat-nodes")
            for home in homes.values():
                home.start(ns, ["--config", str(config), "--listen", "/ip4/0.0.0.0/tcp/4141",
                                "--status-listen", STATUS, *boot])  # fmt: skip
            t0 = time.monotonic()
            h1, h2 = homes["h1"], homes["h2"]

            def takes(a: Member, b: Member) -> bool:
                facts = a.status(ns) or {}
                return any(
                    r["peer"] == b.peer_id and r["accepted"] > 0 for r in facts.get("authors", [])
                )

            alive = lambda: all(m.proc.poll() is None for m in members.values())  # noqa: E731
            both = wait_for(lambda: not alive() or (takes(h1, h2) and takes(h2, h1)), within)
            checks["each_takes_the_others_groups"] = both and alive()
            checks["seconds"] = round(time.monotonic() - t0, 1)
            facts = {n: h.status(ns) or {} for n, h in homes.items()}
            checks["reachability"] = {
                n: f.get("net", {}).get("reachability") for n, f in facts.items()
            }
            # why, as /status says it (these asked for a UPnP mapping: no router answered)
            checks["reason"] = {
                n: f.get("net", {}).get("reachability_reason") for n, f in facts.items()
            }
            checks["relayed"] = {
                n: f.get("net", {}).get("connections_relayed") for n, f in facts.items()
            }
            checks["rounds"] = {n: f.get("round") for n, f in facts.items()}
            if not checks["each_takes_the_others_groups"]:
                result["error"] = "the home nodes did not take each other's groups"
                result["logs"] = {n: m.tail() for n, m in members.items()}
                return result
            if checks["reachability"] != {"h1": "private", "h2": "private"}:
                result["error"] = f"reachability {checks['reachability']}"
                return result
            result["ok"] = True
            return result
        finally:
            for m in members.values():
                if m.proc is not None and m.proc.poll() is None:
                    m.proc.send_signal(signal.SIGTERM)
            codes = {}
            for n, m in members.items():
                if m.proc is None:
                    continue
                try:
                    codes[n] = m.proc.wait(60)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    codes[n] = m.proc.wait(10)
            checks["exit_codes"] = codes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--within", type=float, default=150.0)
    args = parser.parse_args()

    def checked() -> dict[str, object]:
        result = run(args.model, args.within)
        exits = result["checks"].get("exit_codes", {})  # type: ignore[union-attr]
        if result["ok"] and set(exits.values()) != {0}:
            result.update(ok=False, error=f"a node did not stop cleanly: {exits}")
        return result

    return script_main(checked)


if __name__ == "__main__":
    sys.exit(main())
