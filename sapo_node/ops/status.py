"""The status endpoint: a running node's state, for people and for Prometheus.

A thread of the node process serves HTTP on an address of its own (``[status] listen``,
127.0.0.1:9141 by default, or a free port when another node on the machine holds it;
never the swarm port):

- ``/metrics``: the Prometheus text format (prometheus-client), ``sapo_*`` metrics;
- ``/status``: the same facts as JSON, with the version, peer ID, model, uptime and the
  last round's whole record (as in metrics.jsonl);
- ``/healthz``: 200 when healthy, 503 and the problems when not;
- ``/``: a live page for people (``static/node.html``, its script and style served from
  ``/static/``; nothing is fetched from anywhere else). It polls ``/status`` and draws
  ``/history``: the node's whole run from its own ``metrics.jsonl`` (history.py), at most
  ``?points=`` rows (2000 by default), so a restarted node shows its whole run.

Peers' text (peer IDs, refusal details) reaches the page only as JSON and is put into it
as text, never as markup; every page answer also carries a Content-Security-Policy that
allows scripts, styles and requests from the endpoint alone. Whatever address it listens
on, the endpoint answers only requests whose ``Host`` is ``localhost``, an IP address or a
name in ``[status] allowed_hosts``, so a web page elsewhere cannot read it through a DNS
name rebound to it (a page's own name is what its browser sends). A client has
``REQUEST_TIMEOUT_S`` for its whole request and answer, and at most ``MAX_THREADS``
requests are served at once; one more is answered 503 at once.

Every answer is built when it is asked for, from the node's current state
(:meth:`Status.facts`): the round loop keeps no counters for the endpoint, and one
snapshot feeds all three paths.

Healthy means both

- the round loop moves: some phase (generate, score, train, eval) or round finished
  within ``stall_factor`` times the median of the last 10 rounds' durations, and never
  sooner than ``stall_min_s`` (also the allowance for the first round);
- the network process speaks: it reports every second, so a silence of ``net_stall_s``
  means it is stuck, or dead and not restarted.

Once it serves, the node writes the endpoint's address to ``<data-dir>/status.json`` and
removes it when it stops; ``sapo-node status`` finds the endpoint there.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.resources
import ipaddress
import json
import os
import socket
import statistics
import threading
import time
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psutil
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sapo_node import __version__
from sapo_node.atomic import write_text_atomic
from sapo_node.config import Config, parse_host_port
from sapo_node.metrics import finite_or_null, upgrade
from sapo_node.ops.history import MAX_POINTS, History
from sapo_node.ops.prometheus import FactsCollector

log = structlog.get_logger(__name__)

STATUS_FILE = "status.json"
# The phases of a round in the record (phase_s/<phase>); eval only in rounds that ran one.
MAX_AUTHORS_SHOWN = 200  # rows of the per-peer table in /status, the most active first
STATIC = importlib.resources.files("sapo_node") / "static"
STATIC_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The page and its assets come from the endpoint alone, and nothing else is allowed.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


class StatusError(RuntimeError):
    """The endpoint cannot be served, or no node answers where one should."""


class Status:
    """What a running node (``node``) or relay (only a ``transport``) reports, read from
    their state each time it is asked for."""

    def __init__(self, config: Config, *, node: Any = None, transport: Any = None) -> None:
        self.config = config
        self.node = node
        self.transport = node.transport if node is not None else transport
        self.role = "node" if node is not None else "relay"
        self._process = psutil.Process()
        self.started = self._process.create_time()
        self.history = History(config.node.resolved_data_dir() / "metrics.jsonl")

    def problems(self) -> list[str]:
        """Why the node is unhealthy; empty when it is not."""
        s, now, out = self.config.status, time.monotonic(), []
        if self.node is not None:
            p, limit = self.node.progress, self.stall_limit_s()
            if now - p.beat > limit:
                out.append(
                    f"round loop: nothing finished for {now - p.beat:.0f} s, in phase "
                    f"{p.phase!r} (limit {limit:.0f} s)"
                )
        heard = getattr(self.transport, "heard_at", None)  # a transport with a process
        if heard is not None and now - heard > s.net_stall_s:
            out.append(
                f"network process: silent for {now - heard:.0f} s (limit {s.net_stall_s:.0f} s)"
            )
        return out

    def stall_limit_s(self) -> float:
        """How long the round loop may go without finishing a phase or round (the wait
        between rounds of ``node.min_round_s`` included)."""
        s, recent = self.config.status, self.node.progress.recent_rounds
        typical = s.stall_factor * (statistics.median(recent) if recent else 0.0)
        return max(s.stall_min_s, typical) + self.config.node.min_round_s

    def facts(self) -> dict[str, Any]:
        """Everything /status shows and /metrics exports."""
        problems = self.problems()
        now = time.time()
        facts: dict[str, Any] = {
            "version": __version__,
            "role": self.role,
            "pid": os.getpid(),
            "peer_id": getattr(self.transport, "peer_id", None),
            "data_dir": str(self.config.node.resolved_data_dir()),
            "started": round(self.started, 3),
            "uptime_s": round(now - self.started, 3),
            "rss_mb": self._process.memory_info().rss / 2**20,
            "healthy": not problems,
            "problems": problems,
        }
        if self.node is not None:
            facts.update(self._node_facts(now))
        if self.transport is not None:
            net = vars(self.transport.stats())
            heard = getattr(self.transport, "heard_at", None)
            if heard is not None:
                net["silent_s"] = time.monotonic() - heard
            facts["net"] = net
        return facts

    def _node_facts(self, now: float) -> dict[str, Any]:
        n, m = self.node, self.config.model
        last, ev = n.last_record, n.last_eval
        outcomes: Counter[str] = Counter()
        per_author = n.pool.counts()
        for counts in per_author.values():
            outcomes.update(counts)
        # The poisoning checks count completions, not groups (defence.py).
        completions = {k: outcomes.pop(k) for k in list(outcomes) if k.startswith("completions_")}
        return {
            "model": m.name,
            "device": str(n.policy.device),
            "lora": m.lora.enabled,
            "round": n.round,
            "phase": n.progress.phase,
            "since_progress_s": time.monotonic() - n.progress.beat,
            "stall_limit_s": self.stall_limit_s(),
            "cumulative_reward": n.cumulative_reward,
            "last_round": None
            if last is None
            else {
                "ago_s": now - last["time"],
                **{k: v for k, v in last.items() if not k.startswith("eval/per_task")},
            },
            "last_eval": None
            if ev is None
            else {
                "round": ev["round"],
                **{
                    k.removeprefix("eval/"): v
                    for k, v in ev.items()
                    if k.startswith("eval/") and not k.startswith("eval/per_task")
                },
            },
            "pool": {"groups": len(n.pool), "mb": n.pool.size_bytes() / 2**20},
            "peer_groups": dict(outcomes.most_common()),
            "peer_completions": dict(sorted(completions.items())),
            "authors": _authors(per_author, _distrusted(n)),
            "recent_refusals": recent_refusals(n.intake),
        }


def recent_refusals(intake: Any) -> list[dict[str, Any]]:
    """The intake's last refusals, newest first, read while the round thread adds more."""
    return [
        {"time": t, "peer": a, "outcome": o, "reason": r, "detail": d}
        for t, a, o, r, d in reversed(intake.recent_refusals())
    ]


def _distrusted(node: Any) -> set[str]:
    defence = getattr(node, "defence", None)
    return set() if defence is None else defence.distrusted_now()


def _authors(per_author: dict[str, dict[str, int]], distrusted: set[str]) -> list[dict]:
    """The per-peer table: groups accepted, refused by reason, and whether the defences
    distrust the peer now; the most active :data:`MAX_AUTHORS_SHOWN` peers."""
    rows = [
        {
            "peer": author,
            "accepted": counts.get("accepted", 0),
            "outcomes": {k: v for k, v in sorted(counts.items()) if k != "accepted"},
            "distrusted": author in distrusted,
        }
        for author, counts in per_author.items()
    ]
    for author in distrusted - per_author.keys():
        rows.append({"peer": author, "accepted": 0, "outcomes": {}, "distrusted": True})
    rows.sort(key=lambda r: (-r["distrusted"], -r["accepted"] - sum(r["outcomes"].values())))
    return rows[:MAX_AUTHORS_SHOWN]


# --- /metrics ------------------------------------------------------------------------------


# --- the server ----------------------------------------------------------------------------


REQUEST_TIMEOUT_S = 10.0  # a connection's whole request and answer, however it trickles
MAX_THREADS = 16  # requests served at once (Prometheus, a page or two, sapo-node status)
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _HTTPServer(ThreadingHTTPServer):
    """One thread per request, at most ``max_threads`` at once, each connection closed
    ``request_timeout_s`` after it was accepted (checked between polls of the serving
    loop, every half second at most)."""

    daemon_threads = True
    routes: Any  # (path, query) -> (code, content type, body); see Routes
    allowed_hosts: frozenset[str] = frozenset()

    def limit(self, request_timeout_s: float, max_threads: int) -> None:
        """Set the bounds; called before the server serves."""
        self.request_timeout_s = request_timeout_s
        self.slots = threading.BoundedSemaphore(max_threads)
        self.deadlines: dict[socket.socket, float] = {}
        self.deadlines_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(BUSY)  # a few bytes into a fresh socket's buffer
                request.setblocking(False)  # take what of the request has come, without
                request.recv(65536)  # waiting: closing on unread bytes resets the answer
            self.shutdown_request(request)
            return
        with self.deadlines_lock:
            self.deadlines[request] = time.monotonic() + self.request_timeout_s
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: it will not give its slot back
            self._done(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: Any) -> None:
        with self.deadlines_lock:
            self.deadlines.pop(request, None)
        self.slots.release()

    def service_actions(self) -> None:
        """Cut connections past their deadline: the handler's read or write then ends."""
        now = time.monotonic()
        with self.deadlines_lock:
            late = [r for r, deadline in self.deadlines.items() if deadline < now]
        for request in late:
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that left or was cut off is not an error worth a traceback."""
        log.debug("status connection ended", client=str(client_address[0]))


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


def static_file(name: str) -> tuple[int, str, bytes]:
    """One of the page's own files (``sapo_node/static``); 404 for anything else."""
    kind = STATIC_TYPES.get(Path(name).suffix)
    if kind is None or "/" in name or name.startswith("."):
        return 404, "text/plain", b"not found\n"
    try:
        return 200, kind, (STATIC / name).read_bytes()
    except OSError:
        return 404, "text/plain", b"not found\n"


def json_body(body: Any) -> bytes:
    """``body`` as JSON, a non-finite figure as null (a browser's JSON has no NaN)."""
    return json.dumps(finite_or_null(body), indent=1, allow_nan=False).encode() + b"\n"


def points_of(query: dict[str, list[str]]) -> int:
    """``?points=N`` of a history request, bounded; the default is the most."""
    try:
        return max(2, min(int(query.get("points", [MAX_POINTS])[0]), MAX_POINTS))
    except ValueError:
        return MAX_POINTS


class Routes:
    """The answers of a node's or relay's endpoint."""

    def __init__(self, status: Status) -> None:
        self.status = status
        self.registry = CollectorRegistry()
        self.registry.register(FactsCollector(status.facts))

    def __call__(self, path: str, query: dict[str, list[str]]) -> tuple[int, str, bytes]:
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == "/status":
            return 200, "application/json", json_body(self.status.facts())
        if path == "/healthz":
            problems = self.status.problems()
            body = {"healthy": not problems, "problems": problems}
            return (503 if problems else 200), "application/json", json_body(body)
        if path == "/history":
            return 200, "application/json", json_body(self.status.history.series(points_of(query)))
        if path in ("/", "/index.html"):
            return static_file("node.html")
        if path.startswith("/static/"):
            return static_file(path.removeprefix("/static/"))
        return 404, "text/plain", b"not found: try /, /status, /metrics, /healthz or /history\n"


def host_allowed(header: str, allowed: frozenset[str] = frozenset()) -> bool:
    """Whether the endpoint answers a request with this ``Host`` header: ``localhost``,
    any IP address (a browser sends an address only when its page was loaded from that
    address, so no DNS name can be rebound onto it), or a name in ``allowed``.

    >>> host_allowed("127.0.0.1:9141"), host_allowed("[::1]:9141"), host_allowed("LOCALHOST.")
    (True, True, True)
    >>> host_allowed("attacker.example:9141"), host_allowed("sapo:9141", frozenset({"sapo"}))
    (False, True)
    """
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":")[0]
    host = host.rstrip(".")
    if host == "localhost" or host in allowed:
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def setup(self) -> None:
        self.timeout = self.server.request_timeout_s  # each read and write; the server cuts
        super().setup()  # the connection when their sum is past it

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        parts = urlsplit(self.path)
        path = parts.path
        try:
            host = self.headers.get("Host")
            if host is not None and not host_allowed(host, self.server.allowed_hosts):
                body = b"unknown Host: add its name to [status] allowed_hosts to serve it\n"
                self._send(403, "text/plain", body)
                return
            self._send(*self.server.routes(path, parse_qs(parts.query)))
        except (BrokenPipeError, ConnectionResetError):
            return  # the client left
        except Exception as exc:  # a bad moment of the node's state must not end the endpoint
            log.error("status request failed", path=path, error=repr(exc))
            self._send(500, "text/plain", f"{type(exc).__name__}: {exc}\n".encode())

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Content-Security-Policy", CSP)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Requests are not logged (Prometheus scrapes every few seconds)."""


class StatusServer:
    """The endpoint. Its address is bound at construction, so a busy port is found before
    the model loads; :meth:`serve` starts answering once there is a node to describe."""

    def __init__(
        self,
        listen: str,
        *,
        or_free_port: bool = False,
        allowed_hosts: list[str] | tuple[str, ...] = (),
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_threads: int = MAX_THREADS,
    ) -> None:
        """``or_free_port``: if ``listen`` is taken, serve on a free port of the same host
        and say so (the default address, which a second node on the machine finds taken).
        ``allowed_hosts``: names besides localhost and IP addresses that a request's
        ``Host`` may give ([status] allowed_hosts), whatever ``listen`` is."""
        host, port = parse_host_port(listen)
        server = _HTTPServer6 if ":" in host else _HTTPServer
        try:
            try:
                self._httpd = server((host, port), _Handler, bind_and_activate=True)
            except OSError as exc:
                if not (or_free_port and exc.errno == errno.EADDRINUSE):
                    raise
                self._httpd = server((host, 0), _Handler, bind_and_activate=True)
                log.warning(
                    "status endpoint's default address is taken (another sapo-node?); "
                    "serving on a free port",
                    taken=listen,
                    url=self.url,
                )
        except OSError as exc:
            raise StatusError(
                f"the status endpoint cannot listen on {listen}: {exc.strerror or exc}; "
                "choose another with --status-listen HOST:PORT (port 0 picks a free one) "
                "or set status.enabled = false"
            ) from None
        self._httpd.allowed_hosts = frozenset(h.lower().rstrip(".") for h in allowed_hosts)
        self._httpd.limit(request_timeout_s, max_threads)
        self._thread: threading.Thread | None = None
        self._file: Path | None = None

    @property
    def url(self) -> str:
        """Where a client on this machine reaches the endpoint."""
        host, port = self._httpd.server_address[:2]
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve(self, status: Status) -> None:
        """Answer in a thread from now on, and say where in ``<data-dir>/status.json``."""
        self.serve_routes(Routes(status))
        self._file = status.config.node.resolved_data_dir() / STATUS_FILE
        where = {"url": self.url, "pid": os.getpid(), "started": status.started}
        write_text_atomic(self._file, json.dumps(where) + "\n")
        log.info("status endpoint", url=self.url, paths="/ /status /metrics /healthz /history")

    def serve_routes(self, routes: Any) -> None:
        """Answer with ``routes(path, query) -> (code, content type, body)`` in a thread."""
        self._httpd.routes = routes
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.5}, name="status"
        )
        self._thread.daemon = True
        self._thread.start()

    def close(self) -> None:
        if self._file is not None:
            self._file.unlink(missing_ok=True)
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()


# --- the client: sapo-node status ----------------------------------------------------------


def read_status(data_dir: Path, timeout_s: float = 5.0) -> dict[str, Any]:
    """The /status of the node running with ``data_dir``; StatusError if none answers."""
    path = data_dir / STATUS_FILE
    try:
        where = json.loads(path.read_text(encoding="utf-8"))
        url = where["url"]
    except FileNotFoundError:
        raise StatusError(
            f"no sapo-node is running with data directory {data_dir} (no {STATUS_FILE}; "
            "or its status endpoint is off)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StatusError(f"cannot read {path}: {exc}") from None
    # Loopback is never reached through a proxy set in the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/status", timeout=timeout_s) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError) as exc:  # urllib's errors are OSErrors
        reason = getattr(exc, "reason", exc)
        raise StatusError(
            f"no sapo-node answers at {url} ({reason}); {path} names pid {where.get('pid')}, "
            "which may have been killed"
        ) from None


def summary(f: dict[str, Any]) -> list[str]:
    """A few lines for people, from the facts of /status."""
    lines = [
        f"sapo-node {f['version']} {f['role']}, pid {f['pid']}, up {_duration(f['uptime_s'])}, "
        f"peer id {f['peer_id'] or '(offline)'}"
    ]
    if f["role"] == "node":
        lora = " (LoRA)" if f["lora"] else ""
        lines.append(f"model {f['model']}{lora} on {f['device']}; data {f['data_dir']}")
        last = f["last_round"]  # in the old names from a node older than 0.3.0: upgraded
        last = None if last is None else upgrade(last)
        if last is None:
            lines.append(f"{f['round']} rounds done, none yet in this run; now: {f['phase']}")
        else:
            lines.append(
                f"{f['round']} rounds done, the last {_duration(last['ago_s'])} ago in "
                f"{last['phase_s/round']:.1f} s (generate {last['phase_s/generate']:.1f}, "
                f"score {last['phase_s/score']:.1f}, train {last['phase_s/train']:.1f}); "
                f"now: {f['phase']}"
            )
            lines.append(
                f"reward {last['reward/mean']:.3f} (last round), cumulative "
                f"{f['cumulative_reward']:.2f}"
            )
        if (e := f["last_eval"]) is not None:
            lines.append(
                f"held-out pass@1 {e['pass1']:.3f}, greedy {e['greedy']:.3f} (round {e['round']})"
            )
        outcomes = ", ".join(f"{k} {v}" for k, v in f["peer_groups"].items()) or "none yet"
        lines.append(
            f"pool {f['pool']['groups']} groups ({f['pool']['mb']:.1f} MiB); "
            f"peers' groups: {outcomes}"
        )
        if f["peer_completions"]:
            checked = ", ".join(f"{k} {v}" for k, v in f["peer_completions"].items())
            lines.append(f"peers' completions (poisoning checks): {checked}")
    if (n := f.get("net")) is not None:
        lines.append(
            f"swarm: {n['peers']} peers; groups out {n['published']} ({n['publish_dropped']} "
            f"unsent), in {n['received']} ({n['rejected']} refused by the network); "
            f"{n['bytes_in'] / 2**20:.1f} MiB in, {n['bytes_out'] / 2**20:.1f} MiB out; "
            f"network restarts {n['restarts']}"
        )
        if n.get("shards"):
            meshes = ", ".join(map(str, n.get("mesh_peers") or ()))
            lines.append(f"shards joined: {n['shards']} (mesh peers per shard: {meshes})")
    lines.append(f"memory {f['rss_mb']:.0f} MiB")
    lines.append("healthy" if f["healthy"] else "UNHEALTHY: " + "; ".join(f["problems"]))
    return lines


def _duration(seconds: float) -> str:
    """Seconds for people.

    >>> _duration(42.4), _duration(3725), _duration(90061)
    ('42 s', '1 h 02 min', '1 d 01 h')
    """
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"
