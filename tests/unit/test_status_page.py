"""The live page's server side without a browser: the history of metrics.jsonl (every
round, thinned past a bound, a resumed file read again, torn lines skipped), the page's
files, its headers, and the refusal of non-loopback Host names on a loopback endpoint."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest

from sapo_node.config import load_config
from sapo_node.history import History, moving_average, thin
from sapo_node.net.memory import MemoryHub
from sapo_node.status import Status, StatusServer, _loopback_host, points_of, static_file


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
        assert _loopback_host(host), host
    for host in ("evil.example:9141", "192.168.1.2:9141", "[fe80::1]:1", "localhost.evil"):
        assert not _loopback_host(host), host
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
