"""The live page's server side without a browser: the history of metrics.jsonl (every
round, thinned past a bound, a resumed file read again, torn lines skipped), the page's
files, its headers, the refusal of unknown Host names whatever the endpoint listens on,
and the endpoint's bounds on time and threads (all on 127.0.0.1)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from sapo_node.config import ConfigError, load_config
from sapo_node.net.memory import MemoryHub
from sapo_node.ops.history import History, moving_average, thin
from sapo_node.ops.lifecycle import status_endpoint
from sapo_node.ops.status import Status, StatusServer, host_allowed, points_of, static_file


def _write(path: Path, rounds: range, **extra) -> None:
    with path.open("a") as f:
        for r in rounds:
            rec = {
                "round": r,
                "time": 1000.0 + r,
                "reward/mean": r / 10,
                "family_level/a:B": r // 5,
            }
            rec.update(extra)
            if r % 3 == 2:
                rec["eval/pass1"], rec["eval/greedy"] = 0.5, 0.25
            f.write(json.dumps(rec) + "\n")


def test_history_every_round_then_thinned_with_the_true_moving_average(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    h = History(path)
    assert h.series()["rounds"] == 0 and h.series()["round"] == []
    _write(path, range(10))
    s = h.series(window=2)
    assert s["rounds"] == s["shown"] == 10 and s["round"] == list(range(10))
    assert s["series"]["reward_ma"][1] == pytest.approx(0.05)
    assert s["series"]["family_level/a:B"][-1] == 1 and s["series"]["net/peers"] == [None] * 10
    assert s["eval"]["round"] == [2, 5, 8] and s["eval"]["pass1"] == [0.5] * 3

    with path.open("a") as f:  # a line being written is read once it is whole
        f.write('{"round": 10, "reward')
    assert h.series()["rounds"] == 10
    with path.open("a") as f:
        f.write('/mean": 1.0}\nnot json\n')
    _write(path, range(11, 1000))
    s = h.series(points=100, window=10)
    assert s["rounds"] == 1000 and s["shown"] == 100 and s["round"][0] == 0
    assert s["round"][-1] == 999 and s["series"]["reward_ma"][-1] == pytest.approx(99.45)


def test_history_reads_a_cut_back_file_again_and_counts_a_redone_round_once(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    _write(path, range(5))
    h = History(path)
    assert h.series()["rounds"] == 5
    path.write_text("")  # a resume cut it back
    _write(path, range(3))
    _write(path, range(2, 4), **{"reward/mean": 9.0})  # round 2 again, after a crash
    s = h.series()
    assert s["round"] == [0, 1, 2, 3] and s["series"]["reward/mean"][2] == 9.0


def test_helpers() -> None:
    assert thin(3, 2000) == [0, 1, 2] and len(thin(10**5, 2000)) == 2000
    assert moving_average([None, 1.0], 3) == [None, 1.0]
    assert points_of({"points": ["5"]}) == 5 and points_of({"points": ["x"]}) == 2000
    assert points_of({"points": ["99999999"]}) == 2000
    for host in ("127.0.0.1:9141", "localhost:1", "[::1]:9141", "127.0.0.2", "LOCALHOST"):
        assert host_allowed(host), host
    for host in ("192.168.1.2:9141", "[fe80::1]:1", "localhost."):  # addresses rebind nothing
        assert host_allowed(host), host
    for host in ("evil.example:9141", "localhost.evil", "sapo", "", "[bad"):
        assert not host_allowed(host), host
    assert host_allowed("SAPO.:9141", frozenset({"sapo"}))
    assert static_file("node.js")[0] == 200 and static_file("node.html")[1].startswith("text/html")
    for name in ("../status.py", "..", ".hidden.js", "x.py", "nothing.js"):
        assert static_file(name)[0] == 404, name


@pytest.fixture()
def endpoint(tmp_path: Path):
    cfg = load_config(overrides={"node": {"data_dir": str(tmp_path)}}, environ={})
    server = StatusServer("127.0.0.1:0")
    server.serve(Status(cfg, transport=MemoryHub().join("relay-id")))
    try:
        yield server
    finally:
        server.close()


def _get(server: StatusServer, path: str, host: str | None = None):
    port = int(server.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("GET", path, skip_host=host is not None)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    answer = conn.getresponse()
    return answer.status, dict(answer.getheaders()), answer.read()


def test_the_page_its_files_and_headers(endpoint) -> None:
    code, headers, body = _get(endpoint, "/")
    assert code == 200 and b'src="/static/node.js"' in body and b"http" not in body
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    for name in ("charts.js", "node.js", "page.css", "icon.svg", "swarm.html", "swarm.js"):
        code, _, body = _get(endpoint, f"/static/{name}")
        body = body.replace(b"http://www.w3.org/2000/svg", b"")  # a namespace, not a URL
        assert code == 200 and b"https://" not in body and b"http://" not in body, name
    assert _get(endpoint, "/static/../status.py")[0] == 404
    code, _, body = _get(endpoint, "/history?points=10")
    assert code == 200 and json.loads(body)["rounds"] == 0  # a relay records no rounds


def test_a_loopback_endpoint_refuses_other_host_names(endpoint) -> None:
    """A page elsewhere that rebinds its DNS name to 127.0.0.1 cannot read the node."""
    assert _get(endpoint, "/status", host="attacker.example:9141")[0] == 403
    assert _get(endpoint, "/", host="attacker.example")[0] == 403
    assert _get(endpoint, "/status", host="localhost:9141")[0] == 200


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "0.0.0.0:0", "[::]:0"])
def test_the_host_check_is_the_configs_whatever_the_listen_address(tmp_path, listen) -> None:
    """operations.md advised 0.0.0.0 in a container, which turned the Host check off: a
    browser on the host could read /status through a rebound DNS name. The check is now
    [status] allowed_hosts', on every address. Served on 127.0.0.1 here (tests use
    loopback only), with the config of each listen address: the server the node builds
    from it (lifecycle.status_endpoint) answers the same."""
    cfg = load_config(
        overrides={
            "node": {"data_dir": str(tmp_path)},
            "status": {"listen": listen, "allowed_hosts": ["Sapo-Node."]},
        },
        environ={},
    )
    assert cfg.status.allowed_hosts == ["sapo-node"]
    cfg.status.listen = "127.0.0.1:0"  # what is served; the rest is the config's
    server = status_endpoint(cfg)
    server.serve(Status(cfg, transport=MemoryHub().join("relay-id")))
    try:
        assert _get(server, "/status", host="attacker.example:9141")[0] == 403
        assert _get(server, "/status", host="sapo-node:9141")[0] == 200
        assert _get(server, "/metrics", host="127.0.0.1:9141")[0] == 200
    finally:
        server.close()


@pytest.mark.parametrize("name", ["*", "sapo:9141", "http://sapo", "a b", "-x", "x..y"])
def test_allowed_hosts_are_host_names(name: str) -> None:
    with pytest.raises(ConfigError, match="allowed_hosts"):
        load_config(overrides={"status": {"allowed_hosts": [name]}}, environ={})


def _silent_client(server: StatusServer, first: bytes = b"GET /status HTTP/1.0\r\n"):
    port = int(server.url.rsplit(":", 1)[1])
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.sendall(first)  # and never the end of its request
    return client


def test_a_slow_client_is_cut_off_however_it_trickles(tmp_path) -> None:
    """No handler timeout held a thread for as long as a client kept its connection: one
    that sends nothing more, or a byte now and then."""
    cfg = load_config(overrides={"node": {"data_dir": str(tmp_path)}}, environ={})
    server = StatusServer("127.0.0.1:0", request_timeout_s=1.0)
    server.serve(Status(cfg, transport=MemoryHub().join("relay-id")))
    try:
        silent = _silent_client(server)
        trickling = _silent_client(server)
        started = time.monotonic()
        while time.monotonic() - started < 3.0:  # a header byte every 0.2 s, for 3 s
            try:
                trickling.sendall(b"X")
            except OSError:
                break
            time.sleep(0.2)
        cut = time.monotonic() - started
        assert cut < 2.9, "the trickling client was never cut off"
        for client in (silent, trickling):
            with client, contextlib.suppress(ConnectionResetError):
                assert client.recv(1024) == b""  # closed by the server, no answer
        assert _get(server, "/healthz")[0] == 200  # and the endpoint still answers
    finally:
        server.close()


def test_threads_are_bounded_and_one_more_request_is_answered_busy(tmp_path) -> None:
    """Each request had a thread of its own, without bound: a client opening connections
    and sending nothing piled up threads in the node's process."""
    cfg = load_config(overrides={"node": {"data_dir": str(tmp_path)}}, environ={})
    server = StatusServer("127.0.0.1:0", max_threads=4, request_timeout_s=30.0)
    server.serve(Status(cfg, transport=MemoryHub().join("relay-id")))
    clients = []
    try:
        before = threading.active_count()
        clients = [_silent_client(server) for _ in range(4)]
        deadline = time.monotonic() + 10
        while threading.active_count() < before + 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        clients += [_silent_client(server) for _ in range(20)]
        time.sleep(0.5)
        assert threading.active_count() <= before + 4
        code, _, _ = _get(server, "/healthz")
        assert code == 503  # busy, at once, rather than queued behind the silent ones
        for client in clients[:4]:
            client.close()
        deadline = time.monotonic() + 10
        while _get(server, "/healthz")[0] != 200:  # slots come back as the clients leave
            assert time.monotonic() < deadline, "no slot came back"
            time.sleep(0.1)
    finally:
        for client in clients:
            client.close()
        server.close()
