"""What a node remembers of its peers across restarts (sapo_node/intake/peerstate.py): the file
format, its refusal of what is not its own, expiry by wall-clock deadlines, bounds, and
what ``sapo-node pool`` shows of it."""

from __future__ import annotations

import doctest
import json
import threading

import structlog

from sapo_node.intake import peerstate
from sapo_node.intake.pool import Pool, summary


def test_doctests() -> None:
    assert doctest.testmod(peerstate).failed == 0


def test_saved_state_loads_back_and_the_write_leaves_no_temporary(tmp_path) -> None:
    path = tmp_path / peerstate.NET_FILE
    state = {"banned": {"peer-a": 2e9}, "penalties": {"peer-b": [3.0, 0.0, 1e9]}}
    assert peerstate.save(path, "net", state)
    assert peerstate.load(path, "net") == state
    assert [p.name for p in tmp_path.iterdir()] == [peerstate.NET_FILE]


def test_two_threads_saving_at_once_both_succeed_and_leave_one_whole_file(tmp_path) -> None:
    """The round loop and the network's reader thread both save peer state. With one
    temporary name per process, one thread's write truncated or removed the other's
    temporary file before it was moved into place."""
    path = tmp_path / peerstate.NET_FILE
    results: list[bool] = []
    start = threading.Barrier(2)

    def saver(who: str) -> None:
        start.wait()
        for i in range(100):
            big = {f"peer-{who}-{j}": 2e9 + i for j in range(200)}
            results.append(peerstate.save(path, "net", {"banned": big, "penalties": {}}))

    threads = [threading.Thread(target=saver, args=(w,)) for w in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 200, results.count(False)
    banned = peerstate.load(path, "net")["banned"]
    assert len(banned) == 200 and len({k.split("-")[1] for k in banned}) == 1  # one whole state
    assert [p.name for p in tmp_path.iterdir()] == [peerstate.NET_FILE]


def test_a_file_that_is_not_this_state_is_refused_in_one_line(tmp_path) -> None:
    path = tmp_path / peerstate.NET_FILE
    cases = {
        "not json": "not JSON",
        "[]": "not a JSON object",
        json.dumps({"kind": "defence", "version": 1, "state": {}}): "kind 'defence'",
        json.dumps({"kind": "net", "version": 99, "state": {}}): "version 99",
        json.dumps({"kind": "net", "version": 1, "state": []}): "no state object",
    }
    for text, why in cases.items():
        path.write_text(text)
        with structlog.testing.capture_logs() as logs:
            assert peerstate.load(path, "net") == {}
        assert len(logs) == 1, logs
        assert logs[0]["event"] == "peer state file refused: starting with no saved net state"
        assert why in logs[0]["reason"] and logs[0]["log_level"] == "warning"
        assert not path.exists()  # moved aside, kept for whoever wants to look
    assert len(list(tmp_path.glob(f"{peerstate.NET_FILE}.unusable-*"))) == len(cases)
    with structlog.testing.capture_logs() as logs:
        assert peerstate.load(path, "net") == {}  # no file: nothing to say
    assert logs == []


def test_deadlines_expire_are_bounded_and_skip_junk() -> None:
    raw = {f"p{i}": 100.0 + i for i in range(10)} | {"x": "soon", "y": True, "z": None}
    assert peerstate.deadlines(raw, 104.5, 1000) == {f"p{i}": 100.0 + i for i in range(5, 10)}
    assert list(peerstate.deadlines(raw, 0.0, 3)) == ["p7", "p8", "p9"]  # latest ends kept
    assert peerstate.deadlines(["p0"], 0.0, 3) == {}


def test_penalties_decay_with_time_and_are_bounded() -> None:
    p = peerstate.Penalties({}, 0.0, decay=0.999, limit=2)
    assert p.put("a", 5.0, 0.0, 0.0) and p.put("b", 5.0, 0.0, 1.0) and p.put("c", 5.0, 0.0, 2.0)
    assert set(p.state(2.0)) == {"b", "c"}  # the least recently penalised went
    invalid, _ = p.get("b", 1.0 + 693.0)  # half-life of 0.999 a second: ~693 s
    assert abs(invalid - 2.5) < 0.01
    kept = peerstate.Penalties(p.state(2.0), now=2.0 + 10 * 693.0)  # 5 / 1024 < floor
    assert kept.state(2.0 + 10 * 693.0) == {}
    future = peerstate.Penalties({"d": [5.0, 0.0, 1e12]}, now=0.0)  # a time to come: junk
    assert future.state(0.0) == {}


def test_the_pool_summary_shows_banned_and_distrusted_peers_with_time_left(tmp_path) -> None:
    """``sapo-node pool`` prints ``pool.summary``."""
    Pool(tmp_path / "pool.sqlite3").close()
    now = __import__("time").time()
    peerstate.save(
        tmp_path / peerstate.NET_FILE, "net", {"banned": {"b1": now + 500, "b0": now - 1}}
    )
    peerstate.save(tmp_path / peerstate.DEFENCE_FILE, "defence", {"distrusted": {"d1": now + 3600}})
    out = summary(tmp_path / "pool.sqlite3")
    assert set(out["banned"]) == {"b1"} and 495 < out["banned"]["b1"]["left_s"] <= 500
    assert set(out["distrusted"]) == {"d1"} and out["distrusted"]["d1"]["left_s"] > 3590
    (tmp_path / peerstate.NET_FILE).write_text("garbage")
    out = summary(tmp_path / "pool.sqlite3")
    assert out["banned"] == {} and "not JSON" in out["banned_unreadable"]
