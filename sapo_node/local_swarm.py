"""``sapo-node swarm``: a local swarm for everyone, N nodes on this machine.

Each node is an ordinary ``sapo-node start`` child process with a data directory of its
own (``BASE/node-0`` ... ``BASE/node-<N-1>``), listening on loopback only
(``/ip4/127.0.0.1/tcp/PORT+i``), with mDNS off and the network on. The peer IDs are
known before any child starts (each node's identity key is created here first), so every
node is given the others as bootstrap peers: all of them up to :data:`FULL_MESH_UP_TO`
nodes, beyond that node 0 and its two neighbours on a ring (GossipSub and the DHT find
the rest). A child's output goes to ``BASE/node-i/node.log``.

The parent prints one combined view every few seconds: a row per node from the last
complete line of its ``metrics.jsonl``. Ctrl-C or SIGTERM sends SIGTERM to each child
(a node saves a checkpoint and exits 0), waits up to a grace period, then kills the
stragglers; a second Ctrl-C kills them at once. The children run in sessions of their
own, so a Ctrl-C in the terminal reaches them once, through the parent. The command ends
when every child has exited, with code 0 if all exited 0 and 1 otherwise.

It also serves one page for people (``static/swarm.html``, on loopback: ``--view``'s
address, 127.0.0.1:9140 by default or a free port when taken, printed at start). It puts
the nodes side by side (reward curves overlaid, from each node's ``metrics.jsonl``) and
shows who shares with whom: for each node, the groups it accepted and refused from each of
the others, read from each child's own status endpoint. Each row links to that node's own
live page.

Everything but :class:`Swarm` and :class:`SwarmView` is a pure helper, unit-tested on its
own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import platformdirs

from sapo_node.metrics import upgrade
from sapo_node.ops.history import History

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 4150
DEFAULT_VIEW = "127.0.0.1:9140"
VIEW_POINTS = 500  # rows of each node's history the view draws
NOT_REFUSED = ("evicted", "expired")  # prefixes of outcomes that are no refusal
FULL_MESH_UP_TO = 8
GRACE_S = 60.0

# Environment every child gets: the network on, no multicast discovery, no announce
# addresses or bootstrap peers from a config file (the command line gives its own).
CHILD_ENV = {
    "SAPO_NET__ENABLED": "true",
    "SAPO_NET__MDNS": "false",
    "SAPO_NET__ANNOUNCE": "[]",
    "SAPO_NET__BOOTSTRAP": "[]",
    "SAPO_STATUS__LISTEN": '"127.0.0.1:0"',  # each its own port (sapo-node status finds it)
    "PYTHONUNBUFFERED": "1",
}


class SwarmError(RuntimeError):
    """The swarm cannot start (a busy port, an unreadable identity key)."""


def default_base_dir() -> Path:
    """``sapo-node-swarm`` beside the default data directory of a single node, e.g.
    ``~/.local/share/sapo-node-swarm``."""
    return Path(platformdirs.user_data_dir("sapo-node-swarm", appauthor=False))


@dataclass(frozen=True)
class NodeSpec:
    """Where one node of the swarm lives and whom it dials."""

    index: int
    data_dir: Path
    port: int
    peer_id: str
    bootstrap: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def listen(self) -> str:
        return f"/ip4/{LOOPBACK}/tcp/{self.port}"

    @property
    def address(self) -> str:
        return f"{self.listen}/p2p/{self.peer_id}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "node.log"

    @property
    def metrics_path(self) -> Path:
        return self.data_dir / "metrics.jsonl"


@dataclass(frozen=True)
class Passthrough:
    """Options given to every ``sapo-node start`` child as they are, except ``seed``:
    node i gets ``seed + i``, so that the nodes do not all draw the same tasks."""

    config: Path | None = None
    model: str | None = None
    rounds: int | None = None
    swarm: str | None = None
    device: str | None = None
    local: int | None = None
    external: int | None = None
    seed: int | None = None

    def args(self, index: int) -> list[str]:
        out: list[str] = []
        if self.config is not None:
            out += ["--config", str(Path(self.config).expanduser().absolute())]
        for flag, value in (
            ("--model", self.model),
            ("--rounds", self.rounds),
            ("--swarm", self.swarm),
            ("--device", self.device),
            ("--local", self.local),
            ("--external", self.external),
        ):
            if value is not None:
                out += [flag, str(value)]
        if self.seed is not None:
            out += ["--seed", str(self.seed + index)]
        return out


def bootstrap_indices(index: int, n: int) -> list[int]:
    """The nodes node ``index`` dials: every other one in a small swarm; in a larger one
    node 0 and its neighbours on a ring."""
    small = n <= FULL_MESH_UP_TO
    wanted = range(n) if small else [0, (index - 1) % n, (index + 1) % n]
    return sorted({i for i in wanted if i != index})


def plan(
    base_dir: Path, n: int, port: int, peer_id_of: Callable[[Path], str] | None = None
) -> list[NodeSpec]:
    """The N nodes: data directories, ports and peer IDs (identity keys are created in
    each data directory if missing, so peer IDs survive restarts of the swarm)."""
    if n < 1:
        raise ValueError("a swarm needs at least one node")
    if not 0 < port <= 65535 - (n - 1):
        raise ValueError(f"ports {port}..{port + n - 1} are not all valid TCP ports")
    peer_id_of = peer_id_of or _peer_id
    dirs = [base_dir / f"node-{i}" for i in range(n)]
    ids = [peer_id_of(d) for d in dirs]
    bare = [NodeSpec(i, dirs[i], port + i, ids[i]) for i in range(n)]
    return [
        NodeSpec(
            i,
            dirs[i],
            port + i,
            ids[i],
            tuple(bare[j].address for j in bootstrap_indices(i, n)),
        )
        for i in range(n)
    ]


def _peer_id(data_dir: Path) -> str:
    from sapo_node.net import NetError, identity

    try:
        return identity.peer_id_of(data_dir)
    except NetError as exc:
        raise SwarmError(str(exc)) from None


def child_argv(spec: NodeSpec, passthrough: Passthrough, python: str | None = None) -> list[str]:
    """The command line of one node: ``python -m sapo_node.cli start ...``."""
    argv = [python or sys.executable, "-m", "sapo_node.cli", "start"]
    argv += ["--data-dir", str(spec.data_dir), "--listen", spec.listen]
    for addr in spec.bootstrap:
        argv += ["--bootstrap", addr]
    return argv + passthrough.args(spec.index)


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment with the network forced on, loopback-only settings."""
    return {**environ, **CHILD_ENV}


def busy_ports(ports: Sequence[int], host: str = LOOPBACK) -> list[int]:
    """The ports that cannot be bound on ``host`` now."""
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                busy.append(port)
    return busy


# --- the combined view -----------------------------------------------------------------


def read_last_record(path: Path, chunk: int = 64 * 1024) -> dict[str, Any] | None:
    """The last complete JSON object in a metrics file, reading only its tail, in the
    current names (metrics.upgrade: a swarm resumed on old files).

    A torn last line (a node writing right now, a crash mid-write), blank lines, bad
    UTF-8 or a missing file never raise: the previous good line counts, or None."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            block = chunk
            while True:
                start = max(0, size - block)
                f.seek(start)
                lines = f.read(size - start).split(b"\n")
                if start > 0:
                    lines = lines[1:]  # the first piece may be the end of a longer line
                for raw in reversed(lines):
                    if not raw.strip():
                        continue
                    try:
                        record = json.loads(raw)
                    except ValueError:  # JSONDecodeError and UnicodeDecodeError
                        continue
                    if isinstance(record, dict):
                        return upgrade(record)
                if start == 0:
                    return None
                block *= 4
    except OSError:
        return None


@dataclass
class Row:
    """What the view shows of one node."""

    name: str
    peer_id: str
    state: str
    record: dict[str, Any] | None = None


COLUMNS = ("node", "peer", "state", "rounds", "reward", "cumulative", "peers", "ext", "pool")
_RIGHT = {"rounds", "reward", "cumulative", "peers", "ext", "pool"}


def short_peer(peer_id: str, keep: int = 8) -> str:
    """The end of a peer ID (they all start alike, 12D3KooW for ed25519 keys)."""
    return peer_id if len(peer_id) <= keep + 2 else ".." + peer_id[-keep:]


def _num(record: dict[str, Any] | None, key: str, spec: str, add: int = 0) -> str:
    if record is None or key not in record:
        return "-"
    try:
        return format(record[key] + add, spec)
    except (TypeError, ValueError):
        return "?"


def row_cells(row: Row) -> list[str]:
    """One row of the table; a value a node has not recorded yet shows as ``-``.

    ``rounds`` is how many rounds the node has completed (its last ``round`` + 1, the
    count ``--rounds`` stops at); reward is the mean of its own completions in that
    round, ext the peers' groups it trained on in it."""
    r = row.record
    return [
        row.name,
        short_peer(row.peer_id),
        row.state,
        _num(r, "round", "d", add=1),
        _num(r, "reward/mean", ".3f"),
        _num(r, "reward/cumulative", ".2f"),
        _num(r, "net/peers", "d"),
        _num(r, "groups/external", "d"),
        _num(r, "pool/groups", "d"),
    ]


def format_table(rows: Sequence[Row]) -> list[str]:
    """The view as aligned plain-text lines, a header first."""
    table = [list(COLUMNS)] + [row_cells(r) for r in rows]
    widths = [max(len(line[c]) for line in table) for c in range(len(COLUMNS))]
    out = []
    for line in table:
        cells = [
            cell.rjust(w) if COLUMNS[c] in _RIGHT else cell.ljust(w)
            for c, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return out


def describe_exit(code: int) -> str:
    """A child's exit, as the state column shows it."""
    if code >= 0:
        return f"exited {code}"
    try:
        return f"killed {signal.Signals(-code).name}"
    except ValueError:
        return f"killed signal {-code}"


# --- the running swarm -----------------------------------------------------------------


@dataclass
class Child:
    spec: NodeSpec
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0  # wall clock, comparable to the records' "time"
    stopping: bool = False
    reported: bool = False
    log: Any = field(default=None, repr=False)

    @property
    def code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def state(self, record: dict[str, Any] | None) -> str:
        code = self.code
        if code is not None:
            return describe_exit(code)
        if self.stopping:
            return "stopping"
        fresh = record is not None and _float(record.get("time")) >= self.started
        return "running" if fresh else "starting"


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


class Swarm:
    """N ``sapo-node start`` children, watched, shown, and stopped together."""

    def __init__(
        self,
        specs: Sequence[NodeSpec],
        passthrough: Passthrough,
        *,
        environ: Mapping[str, str] | None = None,
        python: str | None = None,
        every: float = 5.0,
        grace_s: float = GRACE_S,
        out: TextIO | None = None,
        err: TextIO | None = None,
        view: str | None = None,
    ) -> None:
        """``view``: where to serve the swarm's page (None: nowhere)."""
        self.children = [Child(s, child_argv(s, passthrough, python)) for s in specs]
        self.view = view
        self._view_server: Any = None
        self.env = child_env(os.environ if environ is None else environ)
        self.every = every
        self.grace_s = grace_s
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.signals = 0
        self._wake = threading.Event()

    # --- output ----------------------------------------------------------------------

    def _say(self, line: str = "", err: bool = False) -> None:
        stream = self.err if err else self.out
        stream.write(line + "\n")
        stream.flush()

    def rows(self) -> list[Row]:
        rows = []
        for c in self.children:
            record = read_last_record(c.spec.metrics_path)
            rows.append(Row(c.spec.name, c.spec.peer_id, c.state(record), record))
        return rows

    def show(self) -> None:
        rows = self.rows()
        counts: dict[str, int] = {}
        for r in rows:
            key = r.state.split()[0]
            counts[key] = counts.get(key, 0) + 1
        summary = ", ".join(f"{v} {k}" for k, v in counts.items())
        self._say(f"{time.strftime('%H:%M:%S')}  swarm of {len(rows)}: {summary}")
        for line in format_table(rows):
            self._say("  " + line)

    # --- processes -------------------------------------------------------------------

    def start(self) -> None:
        for c in self.children:
            c.spec.data_dir.mkdir(parents=True, exist_ok=True)
            c.log = c.spec.log_path.open("ab")
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            c.log.write(f"=== sapo-node swarm {stamp}: {' '.join(c.argv)}\n".encode())
            c.log.flush()
            c.started = time.time()
            c.proc = subprocess.Popen(
                c.argv,
                stdin=subprocess.DEVNULL,
                stdout=c.log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a terminal's Ctrl-C reaches it through us, once
            )

    def alive(self) -> list[Child]:
        return [c for c in self.children if c.proc is not None and c.proc.poll() is None]

    def _signal(self, children: Sequence[Child], signum: int) -> None:
        for c in children:
            if signum == signal.SIGTERM:
                c.stopping = True
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                c.proc.send_signal(signum)

    def _report_exits(self) -> None:
        for c in self.children:
            code = c.code
            if code is None or c.reported:
                continue
            c.reported = True
            note = "" if code == 0 else f" (log: {c.spec.log_path})"
            self._say(f"{c.spec.name} {describe_exit(code)}{note}")

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.signals += 1
        self._wake.set()

    def run(self) -> int:
        """Start the children, show the view until all have exited, return 0 or 1."""
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in handlers:
            signal.signal(s, self._on_signal)
        try:
            self._serve_view()
            self._header()
            self.start()
            self._loop()
        finally:
            self._reap()
            if self._view_server is not None:
                self._view_server.close()
            for s, h in handlers.items():
                signal.signal(s, h)
        self.show()
        return self._verdict()

    def _serve_view(self) -> None:
        if self.view is None:
            return
        from sapo_node.ops.status import StatusError, StatusServer

        try:
            self._view_server = StatusServer(self.view, or_free_port=True)
        except StatusError as exc:
            raise SwarmError(str(exc)) from None
        self._view_server.serve_routes(SwarmView(self))

    def _header(self) -> None:
        base = self.children[0].spec.data_dir.parent
        self._say(
            f"swarm of {len(self.children)} nodes on {LOOPBACK}, data in {base}, logs in "
            f"{base}/node-*/node.log; Ctrl-C stops them all"
        )
        for c in self.children:
            peers = ",".join(a.rsplit("/p2p/", 1)[-1][-8:] for a in c.spec.bootstrap)
            self._say(f"  {c.spec.name}  {c.spec.address}  bootstrap: {peers or '-'}")
        if self._view_server is not None:
            self._say(f"the swarm's page: {self._view_server.url}/")

    def _loop(self) -> None:
        next_view = time.monotonic() + self.every
        deadline: float | None = None
        killed = False
        while self.alive():
            self._report_exits()
            now = time.monotonic()
            if self.signals and deadline is None:
                self._say(
                    f"stopping {len(self.alive())} nodes (SIGTERM; Ctrl-C again to kill them)"
                )
                self._signal(self.alive(), signal.SIGTERM)
                deadline = now + self.grace_s
            if not killed and (self.signals > 1 or (deadline is not None and now >= deadline)):
                stragglers = self.alive()
                names = ", ".join(c.spec.name for c in stragglers)
                self._say(f"killing {names}", err=True)
                self._signal(stragglers, signal.SIGKILL)
                killed = True
            if now >= next_view:
                self.show()
                next_view = now + self.every
            self._wake.wait(min(0.25, max(0.01, next_view - now)))
            self._wake.clear()
        self._report_exits()

    def _reap(self) -> None:
        """On the way out, whatever happened: no child is left running."""
        left = self.alive()
        if left:
            self._signal(left, signal.SIGTERM)
            end = time.monotonic() + min(self.grace_s, 10.0)
            while self.alive() and time.monotonic() < end:
                time.sleep(0.1)
            self._signal(self.alive(), signal.SIGKILL)
        for c in self.children:
            if c.proc is not None:
                c.proc.wait()
            if c.log is not None:
                c.log.close()

    def _verdict(self) -> int:
        failed = [c for c in self.children if c.code != 0]
        if not failed:
            return 0
        what = "; ".join(
            f"{c.spec.name} {describe_exit(c.code) if c.code is not None else 'not started'}"
            f" (log: {c.spec.log_path})"
            for c in failed
        )
        self._say(f"sapo-node: error: {len(failed)} of {len(self.children)} failed: {what}", True)
        return 1


class SwarmView:
    """The answers of the swarm's page: ``/`` and its files, ``/swarm`` (JSON)."""

    def __init__(self, swarm: Swarm, timeout_s: float = 2.0) -> None:
        self.swarm = swarm
        self.timeout_s = timeout_s
        self._histories = {c.spec.name: History(c.spec.metrics_path) for c in swarm.children}

    def __call__(self, path: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        from sapo_node.ops.status import json_body, static_file

        if path == "/swarm":
            return 200, "application/json", json_body(self.snapshot())
        if path in ("/", "/index.html"):
            return static_file("swarm.html")
        if path.startswith("/static/"):
            return static_file(path.removeprefix("/static/"))
        return 404, "text/plain", b"not found: try / or /swarm\n"

    def _facts(self, child: Child) -> dict[str, Any] | None:
        """A running child's /status, or None (not up yet, gone, slow)."""
        if child.code is not None or child.proc is None:
            return None
        import urllib.request

        try:
            where = json.loads((child.spec.data_dir / "status.json").read_text())
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(f"{where['url']}/status", timeout=self.timeout_s) as answer:
                return json.loads(answer.read()) | {"url": where["url"]}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def snapshot(self) -> dict[str, Any]:
        """Every node: its state, last record and reward history; and the links between
        them: groups each node accepted and refused from each author."""
        names = {c.spec.peer_id: c.spec.name for c in self.swarm.children}
        nodes, links = [], []
        for c in self.swarm.children:
            record = read_last_record(c.spec.metrics_path)
            h = self._histories[c.spec.name].series(VIEW_POINTS)
            facts = self._facts(c)
            nodes.append(
                {
                    "name": c.spec.name,
                    "peer_id": c.spec.peer_id,
                    "state": c.state(record),
                    "url": None if facts is None else facts["url"],
                    "healthy": None if facts is None else facts.get("healthy"),
                    "last": record,
                    "rounds": h["rounds"],
                    "history": {
                        "round": h["round"],
                        **{
                            k: h["series"][k]
                            for k in ("reward/mean", "reward_ma", "reward/cumulative")
                        },
                        "window": h["window"],
                    },
                }
            )
            for a in (facts or {}).get("authors", []):
                links.append(
                    {
                        "to": c.spec.name,
                        "from": names.get(a["peer"], a["peer"]),
                        "outside": a["peer"] not in names,
                        "accepted": a["accepted"],
                        "refused": sum(
                            n for k, n in a["outcomes"].items() if not k.startswith(NOT_REFUSED)
                        ),
                        "outcomes": a["outcomes"],
                        "distrusted": a["distrusted"],
                    }
                )
        return {"nodes": nodes, "links": links, "time": time.time()}


def run_swarm(
    n: int,
    *,
    base_dir: Path | None = None,
    port: int = DEFAULT_PORT,
    every: float = 5.0,
    passthrough: Passthrough | None = None,
    grace_s: float = GRACE_S,
    view: str | None = DEFAULT_VIEW,
) -> int:
    """``sapo-node swarm``: plan, check the ports, run; the exit code."""
    base = (base_dir or default_base_dir()).expanduser().absolute()
    try:
        specs = plan(base, n, port)
    except ValueError as exc:
        raise SwarmError(str(exc)) from None
    busy = busy_ports([s.port for s in specs])
    if busy:
        raise SwarmError(
            f"port(s) {', '.join(map(str, busy))} on {LOOPBACK} are in use (another swarm?); "
            f"choose free ones with --port (node i listens on PORT+i)"
        )
    swarm = Swarm(specs, passthrough or Passthrough(), every=every, grace_s=grace_s, view=view)
    return swarm.run()
