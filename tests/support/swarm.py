"""Real `sapo-node start` processes on loopback, for swarm tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from sapo_node.metrics import upgrade
from sapo_node.net import identity

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    predicate: Callable[[], object], timeout: float, *, alive: tuple[NodeProcess, ...] = ()
) -> bool:
    """Poll ``predicate`` until true; False after ``timeout`` or once a node in ``alive``
    has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if not all(n.alive() for n in alive):
            return False
        time.sleep(0.5)
    return bool(predicate())


def node_config(path: Path, model_dir: Path, swarm: str, **net: object) -> Path:
    """A tiny-model node that practises Sevens, 2 own + 2 shared groups a round."""
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in net.items())
    path.write_text(
        f"""
[node]
checkpoint_every = 3
threads = 1
[model]
name = "{model_dir}"
[generation]
completions_per_task = 4
max_new_tokens = 6
[tasks]
one_shot = false
system_prompt = "Reply."
reward = "partial"
[[tasks.families]]
name = "tests.support.families:Sevens"
[train]
local_groups = 2
external_groups = 2
[pool]
sampling = "uniform"
[net]
swarm = "{swarm}"
redial_s = 1.0
{extra}"""
    )
    return path


class NodeProcess:
    """One `sapo-node start` with its own data directory, port and log file."""

    def __init__(self, name: str, root: Path, config: Path) -> None:
        self.name, self.config = name, config
        self.data_dir = root / name
        self.port = free_port()
        self.peer_id = identity.peer_id_of(self.data_dir)
        self.log = self.data_dir / "node.log"
        self.proc: subprocess.Popen | None = None

    @property
    def addr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.port}/p2p/{self.peer_id}"

    def start(self, *bootstrap: NodeProcess, extra: tuple[str, ...] = ()) -> NodeProcess:
        args = [a for peer in bootstrap for a in ("--bootstrap", peer.addr)]
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SAPO_NET__ENABLED": "true",
            "SAPO_NET__MDNS": "false",
        }
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sapo_node.cli", "start", "--config", str(self.config)]
                + ["--data-dir", str(self.data_dir), "--json-logs"]
                + ["--listen", f"/ip4/127.0.0.1/tcp/{self.port}", *args, *extra],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def records(self) -> list[dict]:
        path = self.data_dir / "metrics.jsonl"
        out = []
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    out.append(upgrade(json.loads(line)))
        return out

    def net(self) -> dict | None:
        """The swarm facts of the node's status endpoint now (peers, connections, routing
        table, mesh), or None if it does not answer: what a failing wait prints."""
        try:
            url = json.loads((self.data_dir / "status.json").read_text())["url"]
            with urllib.request.urlopen(f"{url}/status", timeout=5) as r:
                return json.loads(r.read()).get("net")
        except (OSError, ValueError, KeyError):
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 60.0, *, signalled: bool = False) -> int | None:
        """SIGTERM (the node saves and exits 0), then SIGKILL after ``timeout``. (A second
        SIGTERM would abort the node without saving: ``signalled`` says one was sent.)"""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if not signalled:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def tail(self, n: int = 30, *, events: int = 0) -> str:
        """The last ``n`` lines of the log; with ``events``, the last ``events`` lines
        other than rounds, checkpoints and the config before them (the network's say in a
        long run)."""
        with contextlib.suppress(FileNotFoundError):
            lines = self.log.read_text(errors="replace").splitlines()
            quiet = ('"event": "round"', '"event": "checkpoint saved"', '"event": "config"')
            said = [x for x in lines[:-n] if not any(q in x for q in quiet)][-events:]
            return "\n".join((said if events else []) + lines[-n:])
        return ""


def stop_all(*nodes: NodeProcess, timeout: float = 60.0) -> list[int | None]:
    """Stop nodes together (SIGTERM to all, then wait): their exit codes."""
    for n in nodes:
        if n.alive():
            n.proc.send_signal(signal.SIGTERM)
    return [n.stop(timeout, signalled=True) for n in nodes]
