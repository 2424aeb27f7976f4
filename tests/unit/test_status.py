"""The status endpoint in-process: a relay's facts over the in-memory transport asked with
a real HTTP client, a busy address, the round loop's stall limit, the client's errors."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sapo_node.cli import main
from sapo_node.config import load_config, parse_host_port
from sapo_node.net.memory import MemoryHub
from sapo_node.node import Progress
from sapo_node.ops.status import (
    STATUS_FILE,
    Status,
    StatusError,
    StatusServer,
    json_body,
    read_status,
    summary,
)
from tests.support.cli import run_cli

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str) -> tuple[int, bytes]:
    try:
        with NO_PROXY.open(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture()
def relay(tmp_path: Path):
    cfg = load_config(overrides={"node": {"data_dir": str(tmp_path)}}, environ={})
    hub = MemoryHub()
    transport, peer = hub.join("relay-id"), hub.join("peer-id")
    peer.publish(b"x" * 100)
    transport.publish(b"y" * 10)
    server = StatusServer("127.0.0.1:0")
    server.serve(Status(cfg, transport=transport))
    try:
        yield server, tmp_path
    finally:
        server.close()


def test_a_relay_serves_status_metrics_and_healthz(relay, capsys) -> None:
    server, data = relay
    where = json.loads((data / STATUS_FILE).read_text())
    assert where["url"] == server.url and server.url.startswith("http://127.0.0.1:")

    code, body = _get(f"{server.url}/status")
    facts = json.loads(body)
    assert code == 200 and facts["role"] == "relay" and facts["peer_id"] == "relay-id"
    assert facts["net"]["peers"] == 1 and facts["net"]["bytes_in"] == 100
    assert facts["healthy"] and "round" not in facts

    code, body = _get(f"{server.url}/metrics")
    samples = {
        s.name: s
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert code == 200 and samples["sapo_peers"].value == 1
    assert samples["sapo_net_received_bytes_total"].value == 100
    assert samples["sapo_net_sent_bytes_total"].value == 10
    assert samples["sapo_info"].labels["role"] == "relay"
    assert "sapo_round" not in samples

    assert _get(f"{server.url}/healthz") == (200, b'{\n "healthy": true,\n "problems": []\n}\n')
    assert _get(f"{server.url}/nothing")[0] == 404

    assert read_status(data)["peer_id"] == "relay-id"
    lines = summary(read_status(data))
    assert lines[0].startswith("sapo-node ") and "relay" in lines[0]
    assert lines[-1] == "healthy" and any(line.startswith("swarm: 1 peers") for line in lines)

    server.close()
    assert not (data / STATUS_FILE).exists()


def test_a_busy_address_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(StatusError, match=f"cannot listen on 127.0.0.1:{port}.*--status"):
            StatusServer(f"127.0.0.1:{port}")


def test_the_round_loop_is_stuck_past_a_multiple_of_the_median_round() -> None:
    cfg = load_config(overrides={"status": {"stall_min_s": 60, "stall_factor": 4}}, environ={})
    node = SimpleNamespace(progress=Progress(), transport=None)
    status = Status(cfg, node=node)
    assert status.stall_limit_s() == 60 and status.problems() == []  # no round yet: the floor
    for seconds in (5.0, 30.0, 35.0):
        node.progress.enter("round")
        node.progress.leave("round", seconds)
    assert status.stall_limit_s() == 4 * 30.0
    node.progress.enter("round")
    node.progress.enter("generate")
    node.progress.beat = time.monotonic() - 121
    (problem,) = status.problems()
    assert problem.startswith("round loop: nothing finished for 121 s, in phase 'generate'")
    node.progress.leave("generate", 121.0)
    assert status.problems() == [] and node.progress.phase == "round"


def test_the_status_command_without_a_running_node_exits_1(tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(["status", "--data-dir", str(tmp_path)], capsys)
    assert code == 1 and "no sapo-node is running with data directory" in err
    with socket.socket() as s:  # a port nobody listens on: the node was killed
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    (tmp_path / STATUS_FILE).write_text(json.dumps({"url": url, "pid": 4242}))
    code, _, err = run_cli(["status", "--data-dir", str(tmp_path)], capsys)
    assert code == 1 and f"no sapo-node answers at {url}" in err and "pid 4242" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("listen", ["4142", "localhost:", "127.0.0.1:70000", ":80"])
def test_a_bad_status_address_is_a_usage_error(listen: str, capsys) -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        parse_host_port(listen)
    code, _, err = run_cli(["start", "--status-listen", listen, "--offline"], capsys)
    assert code == 2 and "status.listen" in err and err.count("\n") == 1


def test_help_lists_the_status_command(capsys) -> None:
    main(["status", "--help"])
    assert "--data-dir" in capsys.readouterr().out


def test_the_default_address_taken_serves_on_a_free_port_and_another_is_an_error() -> None:
    from sapo_node.ops.status import StatusError, StatusServer

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        taken = f"127.0.0.1:{held.getsockname()[1]}"
        with pytest.raises(StatusError, match="cannot listen on"):
            StatusServer(taken)
        server = StatusServer(taken, or_free_port=True)
        try:
            assert server.url.startswith("http://127.0.0.1:")
            assert not server.url.endswith(taken.split(":")[1])
        finally:
            server.close()


def test_a_non_finite_figure_is_served_as_null() -> None:
    """Issue 47: a skipped step's NaN loss reaches the last round's record; the page's
    JSON (which has no NaN) gets null there, not a body a browser cannot parse."""

    def strict(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    body = json_body({"last_round": {"train/loss": float("nan"), "x": [float("-inf"), 1.0]}})
    assert json.loads(body, parse_constant=strict) == {
        "last_round": {"train/loss": None, "x": [None, 1.0]}
    }


def test_the_intakes_refusals_are_read_while_the_round_thread_adds_more() -> None:
    """The status thread lists the intake's last refusals while the round thread refuses
    groups: a deque iterated during an append raises (a 500 on /status and /metrics)."""
    import sys
    import threading

    from sapo_node.intake.checks import RECENT_REFUSALS, Intake
    from sapo_node.intake.pool import Pool
    from sapo_node.ops.status import recent_refusals
    from sapo_node.tasks import Scorer

    pool, scorer = Pool(None), Scorer()
    intake = Intake(pool, scorer, known_configs={})
    stop, failures, reads = threading.Event(), [], [0]

    def status_thread() -> None:
        while not stop.is_set():
            try:
                peers = [r["peer"] for r in recent_refusals(intake)]
                assert peers == sorted(peers, reverse=True), "not newest first"
            except (RuntimeError, AssertionError) as exc:
                failures.append(exc)
                return
            reads[0] += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns as often as they can
    reader = threading.Thread(target=status_thread, daemon=True)
    try:
        reader.start()
        deadline, n = time.monotonic() + 1.5, 0
        while time.monotonic() < deadline and not failures:
            intake.receive(b"not msgpack", f"peer-{n:09d}")  # refused: one more entry
            n += 1
    finally:
        stop.set()
        reader.join(5)
        sys.setswitchinterval(interval)
        scorer.close()
        pool.close()
    assert not failures, failures[0]
    assert reads[0] > 0 and n > RECENT_REFUSALS
    assert [r["peer"] for r in recent_refusals(intake)][:2] == [
        f"peer-{n - 1:09d}",
        f"peer-{n - 2:09d}",
    ]


def test_a_node_that_fails_to_build_frees_its_status_port(tmp_path: Path) -> None:
    """The status endpoint binds its port before the model loads (a busy port is found at
    once); when the model then fails to load, the port is let go with the error."""
    import threading

    from sapo_node.config import Config
    from sapo_node.ops.lifecycle import NodeFailed, hold_data_dir, run_node

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    cfg = Config.model_validate(
        {
            "node": {"data_dir": str(tmp_path / "data")},
            "model": {"name": str(empty)},
            "net": {"enabled": False},
            "status": {"enabled": True, "listen": f"127.0.0.1:{port}"},
        }
    )
    assert cfg.status.listen == f"127.0.0.1:{port}"
    # The error is held, as a caller that reports it holds it (with its traceback, and
    # so run_node's frame): the port must not wait for the garbage collector.
    with pytest.raises(NodeFailed, match="not a model directory") as failed:
        run_node(cfg, threading.Event())
    with socket.socket() as probe:  # nobody listens there any more
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    StatusServer(f"127.0.0.1:{port}").close()  # and the port can be taken again
    hold_data_dir(tmp_path / "data").close()  # as the data directory can
    assert failed.traceback
