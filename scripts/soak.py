"""A churn soak: N real nodes on loopback, one killed with SIGKILL and restarted every K s.

Every node is a real ``sapo-node start`` process (the tiny model of the tests, libp2p on
127.0.0.1 only, no mDNS), with its own data directory and port, bootstrapped to all the
others. Once every node has run its first round, the soak's clock starts: every
``--kill-every`` seconds one node, chosen at random (``--seed``) among
those that have run enough rounds since they last started to have saved a checkpoint
(the kill waits until one has), is killed with SIGKILL and started
again on the same data directory and port, so it must resume from its checkpoint. At the
end every node is stopped with SIGTERM and the soak reports, on stdout and in
OUT/report.json:

- survivor crashes: node processes that ended without the soak killing them (each is
  started again, so that the soak goes on), and nodes that did not exit 0 on SIGTERM;
- RSS: each node's process tree (the node and its network process), sampled every
  ``--sample-every`` s; samples taken less than ``--settle`` s after the process's
  first round, or in the first ``--warmup`` s of the run, are left out; growth is the
  median of the rest in the last tenth of the run after the warm-up against their
  median in its first tenth (from the node's first sample left in);
- groups: published per node (its metrics.jsonl, read as the run goes, so that rounds
  a restart cuts from the file are still counted), and received from it by each of the
  others (their pools' per-author counts: accepted, and refused by reason);
- restarts: whether each one resumed (its ``resumed`` log line, at a round no earlier
  than the last checkpoint the killed process logged, and its first round after the
  restart is that round);
- refusals by reason: in the pools (the intake) and in the network processes (wire
  checks, their ``message refused`` log lines);
- bans: how often each node was banned by another (``peer banned`` log lines);
- nodes left unable to publish: no group of it accepted by any other node in the last
  tenth (groups made faster than the receivers' rate are dropped by design, counted as
  ``net/unsent`` in metrics.jsonl, and are not that).

- children: how long each child of a SIGKILLed node (its network process) outlived it;
- groups accounted for: at each receiver, the accepted groups that left its pool
  neither aged out (``expired``) nor evicted nor still held, against the peers' groups
  its rounds trained on (metrics.jsonl);
- the stop: every other node gets the final SIGTERM on its whole process group (as
  ``timeout`` and some supervisors send it: the network process gets it too), the
  rest on the node's process alone; each must exit 0, its children gone within 5 s,
  with no "network process died" line.

Harder runs, each an option:

- ``--partition-at S --partition-for S``: the nodes run in two network namespaces of
  the soak's own, half in each, joined by one link (198.18.10.1 and .2, nothing outside
  them is touched). At S s the link is cut (nftables answers the other half with TCP
  resets, as after a router's reboot), and healed S s later. Checked: no group crosses
  the halves during the cut, groups cross again within ``--heal-within`` s of the heal
  (the time is reported per node), no network process restarts and no node bans
  another over it. Needs root (or ``unshare -rn``), ``ip`` and ``nft``.
- ``--skewed-peer SECONDS``: the last node's wall clock runs that far ahead (or behind,
  if negative): scripts/clock_skew.c, built with ``cc`` and preloaded, moves its wall
  clock only (monotonic clocks, sleeps and timers stay true; why not libfaketime:
  there). Checked: within the receivers' tolerance (SPEC.md, the clock rule) every
  other node accepts its groups; beyond it, they refuse them all (``from_the_future``
  or ``too_old``).
- ``--rogue-peer``: tests/support/rogue.py's ``persist`` peer publishes invalid messages
  to every node until they ban it, is then killed and started again with the same key,
  and the next kill goes to a node that banned it. Checked: while each ban lasts, after
  the rogue's restart and after the banning node's restart, no message of the rogue is
  refused there again and it is not banned again (its messages no longer get in).

Exit status 0 when every target holds (0 survivor crashes, RSS growth at most
``--max-rss-growth`` %, every restart resumed, no node left unable to publish, no child
outliving its node by more than 5 s, every group accounted for, a clean stop, and those
of the options given), 1 when one fails, 2 on bad arguments. Every process it starts
ends with it: they run in their own process groups, which are killed on the way out
(Ctrl-C, SIGTERM, an error), and they die with it if it is killed (PDEATHSIG); the
namespaces have no name and go with their processes, so a killed run leaves none.

Usage: python scripts/soak.py --nodes 4 --kill-every 60 --duration 3600 --out DIR
       [--partition-at 240 --partition-for 300] [--skewed-peer 120] [--rogue-peer]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sapo_node.intake import wire  # noqa: E402
from scripts.support.procs import log_tail  # noqa: E402
from scripts.support.soak_harder import HarderRuns  # noqa: E402
from scripts.support.soak_nodes import (  # noqa: E402
    CHECKPOINT_EVERY,
    CLOCK_SKEW_C,
    CUT_GRACE_S,
    EXTERNAL_GROUPS,
    FIRST_ROUND_GRACE_S,
    MAX_OUTLIVE_S,
    POOL_EVERY_S,
    STARTUP_S,
    STOP_TIMEOUT_S,
    Halves,
    Node,
    Rogue,
)
from scripts.support.soak_report import SoakReport, print_report  # noqa: E402
from tests.support.tiny import build_tiny_model  # noqa: E402

# The tests' tiny node (tests/support/swarm.py), with longer completions (--tokens) so
# that a round takes seconds rather than 70 ms: the node's own groups (2 to 4 a round)
# then stay within the 2 groups/s per author that peers accept. No poisoning defences:
# the tiny model's random completions fail their checks, and honest nodes distrusted
# each other within a minute (they are measured in docs/security.md, not here).
CONFIG = """
[node]
checkpoint_every = {checkpoint_every}
threads = 1
[model]
name = "{model}"
[generation]
completions_per_task = 8
max_new_tokens = {tokens}
[tasks]
one_shot = false
system_prompt = "Reply."
reward = "partial"
[[tasks.families]]
name = "tests.support.families:Sevens"
[train]
local_groups = 2
external_groups = {external_groups}
[pool]
sampling = "uniform"
[defence]
enabled = false
[net]
swarm = "{swarm}"
redial_s = 1.0
"""


class Soak(HarderRuns, SoakReport):
    """The run: its nodes started, churned and stopped (the harder runs and the report:
    the classes it is made with)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = args.out
        self.rng = random.Random(args.seed)
        self.t0 = time.monotonic()
        self.kills: list[dict] = []
        self.crashes: list[dict] = []
        self.stop_codes: dict[str, int | None] = {}
        self.ran_s = self.startup_s = 0.0
        self.wall0 = 0.0  # time.time() at the soak clock's 0
        self.nodes: list[Node] = []
        self.halves: Halves | None = None
        self.rogue: Rogue | None = None
        self.rogue_restart_at = 0.0
        self.heal_poll_at = 0.0
        self.partition: dict[str, Any] = {}
        self.stop_how: dict[str, str] = {}  # node -> "group" or "process"
        self.stop_children: dict[str, int] = {}  # its processes left MAX_OUTLIVE_S after

    def now(self) -> float:
        return time.monotonic() - self.t0

    def setup(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        model = build_tiny_model(self.out / "model")
        config = self.out / "node.toml"
        self.swarm = f"soak-{self.args.seed}"
        config.write_text(
            CONFIG.format(
                model=model,
                checkpoint_every=CHECKPOINT_EVERY,
                external_groups=EXTERNAL_GROUPS,
                tokens=self.args.tokens,
                swarm=self.swarm,
            )
        )
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SAPO_NET__ENABLED": "true",
            "SAPO_NET__MDNS": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        root = self.out / "nodes"
        a = self.args
        if a.partition_at is not None:
            self.halves = Halves()
        self.nodes = []
        for i in range(a.nodes):
            side = ("left" if i < a.nodes // 2 else "right") if self.halves else None
            skew = a.skewed_peer if a.skewed_peer and i == a.nodes - 1 else 0.0
            node_env = env
            if skew:  # its wall clock only: the monotonic ones, sleeps and timers stay true
                lib = self.out / "clock_skew.so"
                subprocess.run(
                    [a.cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(CLOCK_SKEW_C), "-ldl"],
                    check=True,
                )
                node_env = {
                    **env,
                    "LD_PRELOAD": " ".join(filter(None, [str(lib), env.get("LD_PRELOAD")])),
                    "SOAK_CLOCK_SKEW_S": str(skew),
                }
            self.nodes.append(
                Node(
                    f"n{i}",
                    root,
                    config,
                    node_env,
                    a.nice,
                    side=side,
                    skew=skew,
                    halves=self.halves,
                )
            )
        if a.rogue_peer:
            self.rogue = Rogue(self.out, env, a.nice, self.halves)

    def run(self) -> None:
        a = self.args
        self.t0 = time.monotonic()
        for n in self.nodes:
            n.start(self.nodes, self.now(), "first start")
        # the soak's clock starts once every node has run a round (or after STARTUP_S)
        while self.now() < STARTUP_S and any(n.life.first_round is None for n in self.nodes):
            self._tick(self.now())
            if not all(n.alive() for n in self.nodes):
                break  # counted as a crash in the loop below
            time.sleep(1.0)
        self.startup_s = self.now()
        self.t0 += self.startup_s
        self.wall0 = time.time()
        for n in self.nodes:
            n.rss.clear()
            for life in n.lives:
                life.started -= self.startup_s
                if life.first_round_at is not None:
                    life.first_round_at -= self.startup_s
        if self.rogue:
            self.rogue.start(self.nodes, wire.topic(self.swarm), 0.0)
        next_kill, next_sample, next_pool = a.kill_every, 0.0, 0.0
        while (t := self.now()) < a.duration:
            for n in self.nodes:
                if not n.alive():
                    self._crashed(n, t)
            if self.halves:
                self._partition_step(t)
            if t >= next_sample:
                self._tick(t)
                if self.rogue:
                    self._rogue_step(t)
                next_sample += a.sample_every
            if t >= next_pool:
                for n in self.nodes:
                    n.read_pool(t)
                next_pool += POOL_EVERY_S
            if t >= next_kill and self._churn(t):
                next_kill += a.kill_every
            time.sleep(0.2)
        # a process started last must run a round before the end, or its resume is unproven
        grace = a.duration + FIRST_ROUND_GRACE_S
        while self.now() < grace and any(n.life.first_round is None for n in self.nodes):
            self._tick(self.now())
            time.sleep(1.0)

    def _tick(self, t: float) -> None:
        for n in self.nodes:
            n.read_metrics()
            self._note_first_round(n)
            n.sample(t)

    def _note_first_round(self, n: Node) -> None:
        life = n.life
        if life.first_round is not None:
            return
        start = time.time() - (self.now() - life.started)  # wall clock at its start
        fresh = [r for r in n.records.values() if r["time"] - n.skew >= start]
        if fresh:
            first = min(fresh, key=lambda r: r["time"])
            life.first_round = first["round"]
            life.first_round_at = self.now() - (time.time() - (first["time"] - n.skew))

    def _saved_since_start(self, n: Node) -> bool:
        """Whether the node's process has run enough rounds to have saved a checkpoint."""
        life = n.life
        if life.first_round is None:
            return False
        rounds = [r["round"] for r in n.records.values()]
        return max(rounds) >= life.first_round + CHECKPOINT_EVERY

    def _crashed(self, n: Node, t: float) -> None:
        life = n.life
        life.ended, life.returncode = t, n.proc.returncode
        crash = {"node": n.name, "t": round(t, 1), "returncode": n.proc.returncode}
        crash["log_tail"] = log_tail(life.log)
        self.crashes.append(crash)
        print(
            f"[soak] {t:7.0f} s  {n.name} CRASHED (exit {n.proc.returncode}); restarting",
            flush=True,
        )
        n.start(self.nodes, t, "crash")

    def _churn(self, t: float) -> bool:
        """Kill a random node among those with a checkpoint of this process to resume
        from, and start it again; False (to try again shortly) if none has one yet."""
        ready = [n for n in self.nodes if n.alive() and self._saved_since_start(n)]
        if not ready:
            return False
        banning = self._banning_to_kill(t)
        victim = self.rng.choice([n for n in ready if n.name in banning] or ready)
        rounds = [r["round"] for r in victim.records.values()]
        print(f"[soak] {t:7.0f} s  SIGKILL {victim.name} (last round {max(rounds)})", flush=True)
        victim.kill(t)
        victim.read_metrics()  # the rounds a resume will cut from its file
        self.kills.append({"node": victim.name, "t": round(t, 1), "life": victim.life.index})
        victim.start(self.nodes, self.now(), "kill")
        return True

    def stop(self) -> None:
        """SIGTERM every node, each to save and exit 0: every other one (n0, n2, ...) on
        its whole process group, its network process included (as ``timeout`` and some
        supervisors send it), the rest on the node's own process. Then SIGKILL whatever
        is left, and count the children still there MAX_OUTLIVE_S after each node."""
        t = self.now()
        children = {}
        for i, n in enumerate(self.nodes):
            if n.alive():
                children[n.name] = n.group()[1:]
                self.stop_how[n.name] = "group" if i % 2 == 0 else "process"
                if i % 2 == 0:
                    n._killpg(signal.SIGTERM)
                else:
                    n.proc.send_signal(signal.SIGTERM)
        for n in self.nodes:
            if n.proc is None:
                continue
            try:
                n.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                n.proc.kill()
                n.proc.wait(10)
            self.stop_codes[n.name] = n.proc.returncode
            if n.name in children:
                _, alive = psutil.wait_procs(children[n.name], MAX_OUTLIVE_S)
                self.stop_children[n.name] = len(alive)
            if n.life.ended is None:
                n.life.ended, n.life.returncode = t, n.proc.returncode
        self.cleanup()
        for n in self.nodes:
            n.read_metrics()
            n.read_pool(self.now())
        self.ran_s = self.now()

    def cleanup(self) -> None:
        for n in self.nodes:
            if n.proc is not None:
                n._killpg(signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    n.proc.wait(10)
        if self.rogue is not None:
            self.rogue.kill(self.now())
        if self.halves is not None:  # the last descriptors: the kernel removes them
            self.halves.close()
            self.halves = None


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills")
    p.add_argument("--duration", type=float, default=3600.0, help="seconds")
    p.add_argument("--out", type=Path, required=True, help="directory for data and report")
    p.add_argument("--seed", type=int, default=0, help="which nodes are killed")
    p.add_argument("--warmup", type=float, help="seconds left out of RSS (default: 10%%)")
    p.add_argument(
        "--settle", type=float, default=30.0, help="RSS: seconds after a process's first round"
    )
    p.add_argument("--sample-every", type=float, default=5.0, help="RSS sampling, seconds")
    p.add_argument("--tokens", type=int, default=192, help="max_new_tokens of the nodes")
    p.add_argument("--nice", type=int, default=10, help="niceness of the nodes")
    p.add_argument("--report-only", action="store_true", help="report again from OUT/state.json")
    p.add_argument("--max-rss-growth", type=float, default=5.0, help="target, in %%")
    p.add_argument("--partition-at", type=float, help="cut the swarm in two at S s")
    p.add_argument("--partition-for", type=float, help="and heal it S s later")
    p.add_argument(
        "--heal-within",
        type=float,
        default=360.0,
        help="target: seconds for groups to cross again after the heal (default 360: the "
        "longest redial delay, 300 s, and a minute)",
    )
    p.add_argument("--skewed-peer", type=float, help="one node's clock is off by S s (+: ahead)")
    p.add_argument("--rogue-peer", action="store_true", help="a peer that sends invalid messages")
    a = p.parse_args(argv)
    a.out = a.out.resolve()
    if a.nodes < 2:
        p.error("--nodes must be at least 2")
    if a.kill_every <= 0 or a.duration <= a.kill_every:
        p.error("--kill-every must be positive and below --duration")
    if (a.partition_at is None) != (a.partition_for is None):
        p.error("--partition-at and --partition-for go together")
    if a.partition_at is not None and not a.report_only:
        if a.partition_at < 0 or a.partition_for < 2 * CUT_GRACE_S or a.heal_within <= 0:
            p.error(
                f"--partition-at must be 0 or more, --partition-for at least "
                f"{2 * CUT_GRACE_S:g} s, --heal-within positive"
            )
        if a.partition_at + a.partition_for + a.heal_within > a.duration:
            p.error("--partition-at + --partition-for + --heal-within must fit in --duration")
        if os.geteuid() != 0:
            p.error(
                "--partition-at makes network namespaces: run it as root, or under `unshare -rn`"
            )
        missing = [c for c in ("ip", "nft") if shutil.which(c) is None]
        if missing:
            p.error(f"--partition-at needs {missing} (Debian: apt-get install iproute2 nftables)")
    a.cc = shutil.which("cc")
    if a.skewed_peer is not None and not a.report_only:
        if a.skewed_peer == 0:
            p.error("--skewed-peer must not be 0")
        if a.cc is None:
            p.error(
                f"--skewed-peer builds {CLOCK_SKEW_C.name} into the node: it needs a C compiler, "
                "`cc` (Debian: apt-get install gcc)"
            )
    if a.warmup is None and not a.report_only:
        a.warmup = a.duration / 10
    if a.warmup is not None and not 0 <= a.warmup < a.duration:
        p.error("--warmup must be below --duration")
    return a


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    soak = Soak(args)
    if args.report_only:
        soak.load()
    else:
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            soak.setup()
            soak.run()
            soak.stop()
        except KeyboardInterrupt:
            print("[soak] interrupted: the nodes are killed", file=sys.stderr)
            return 130
        finally:
            soak.cleanup()
        (args.out / "state.json").write_text(json.dumps(soak.state()))
    rep = soak.report()
    (args.out / "report.json").write_text(json.dumps(rep, indent=1))
    print_report(rep)
    print(f"report: {args.out / 'report.json'}")
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
