"""``sapo-node swarm``: its pure helpers (plan, argv, env, view, metrics tail) and the
process supervision, on stand-in children that start in milliseconds."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sapo_node import local_swarm as sw
from sapo_node.cli import main
from tests.support.cli import run_cli

pytestmark = pytest.mark.timeout(60)


def _fake_ids(data_dir: Path) -> str:
    return f"12D3KooW{data_dir.name.replace('-', '').upper()}xxxxxxxxxxxx"


def _plan(tmp_path: Path, n: int = 3, port: int = 4150) -> list[sw.NodeSpec]:
    return sw.plan(tmp_path / "base", n, port, peer_id_of=_fake_ids)


# --- plan, argv, env -------------------------------------------------------------------


def test_small_swarms_dial_everyone_larger_ones_node_0_and_ring_neighbours() -> None:
    assert sw.bootstrap_indices(0, 1) == []
    assert sw.bootstrap_indices(0, 2) == [1]
    assert sw.bootstrap_indices(1, 3) == [0, 2]
    assert sw.bootstrap_indices(4, sw.FULL_MESH_UP_TO) == [0, 1, 2, 3, 5, 6, 7]
    n = sw.FULL_MESH_UP_TO + 4
    assert sw.bootstrap_indices(5, n) == [0, 4, 6]
    assert sw.bootstrap_indices(0, n) == [1, n - 1]
    assert sw.bootstrap_indices(n - 1, n) == [0, n - 2]


def test_plan_gives_each_node_its_dir_port_and_the_others_addresses(tmp_path: Path) -> None:
    specs = _plan(tmp_path, 3, 5000)
    assert [s.name for s in specs] == ["node-0", "node-1", "node-2"]
    assert [s.data_dir for s in specs] == [tmp_path / "base" / f"node-{i}" for i in range(3)]
    assert [s.listen for s in specs] == [f"/ip4/127.0.0.1/tcp/{5000 + i}" for i in range(3)]
    assert specs[1].log_path == tmp_path / "base" / "node-1" / "node.log"
    assert specs[1].metrics_path == tmp_path / "base" / "node-1" / "metrics.jsonl"
    assert specs[0].bootstrap == (specs[1].address, specs[2].address)
    assert specs[2].bootstrap == (specs[0].address, specs[1].address)
    assert specs[0].address == f"/ip4/127.0.0.1/tcp/5000/p2p/{specs[0].peer_id}"


@pytest.mark.parametrize(("n", "port"), [(0, 4150), (2, 0), (2, 65535), (3, 65534)])
def test_plan_refuses_no_nodes_and_ports_out_of_range(tmp_path: Path, n: int, port: int) -> None:
    with pytest.raises(ValueError):
        _plan(tmp_path, n, port)


def test_plan_creates_identities_once_and_keeps_them(tmp_path: Path) -> None:
    first = sw.plan(tmp_path, 2, 4150)
    assert all((s.data_dir / "identity.key").exists() for s in first)
    assert first[0].peer_id != first[1].peer_id
    assert [s.peer_id for s in sw.plan(tmp_path, 2, 4150)] == [s.peer_id for s in first]


def test_child_argv_runs_start_on_loopback_with_the_options_passed_through(
    tmp_path: Path,
) -> None:
    spec = _plan(tmp_path, 2)[1]
    through = sw.Passthrough(
        config=Path("rel/node.toml"),
        model="tiny",
        rounds=2,
        swarm="lab",
        device="cpu",
        local=3,
        external=1,
        seed=10,
    )
    argv = sw.child_argv(spec, through, python="/py")
    assert argv[:4] == ["/py", "-m", "sapo_node.cli", "start"]
    opts = dict(zip(argv[4::2], argv[5::2], strict=True))
    assert opts["--data-dir"] == str(spec.data_dir)
    assert opts["--listen"] == "/ip4/127.0.0.1/tcp/4151"
    assert argv.count("--bootstrap") == 1 and opts["--bootstrap"] == spec.bootstrap[0]
    assert opts["--config"] == str(Path.cwd() / "rel" / "node.toml")  # absolute
    assert (opts["--model"], opts["--rounds"], opts["--swarm"]) == ("tiny", "2", "lab")
    assert (opts["--device"], opts["--local"], opts["--external"]) == ("cpu", "3", "1")
    assert opts["--seed"] == "11"  # node i: seed + i
    assert sw.child_argv(spec, sw.Passthrough())[0] == sys.executable
    bare = sw.child_argv(spec, sw.Passthrough(), python="/py")
    assert not {"--config", "--model", "--rounds", "--seed", "--swarm"} & set(bare)


def test_child_env_turns_the_network_on_and_mdns_off() -> None:
    parent = {"PATH": "/bin", "SAPO_NET__ENABLED": "false", "SAPO_NET__MDNS": "true"}
    env = sw.child_env(parent)
    assert env["PATH"] == "/bin"
    assert env["SAPO_NET__ENABLED"] == "true"
    assert env["SAPO_NET__MDNS"] == "false"
    assert env["SAPO_NET__BOOTSTRAP"] == "[]" and env["SAPO_NET__ANNOUNCE"] == "[]"
    assert parent["SAPO_NET__ENABLED"] == "false"  # not changed in place


def test_busy_ports_are_found(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert sw.busy_ports([port]) == [port]
        with pytest.raises(sw.SwarmError, match=f"{port}.*--port"):
            sw.run_swarm(1, base_dir=tmp_path, port=port)
    assert sw.busy_ports([port]) == []


# --- metrics tail ----------------------------------------------------------------------


def _line(**rec) -> str:
    return json.dumps(rec) + "\n"


def test_last_record_of_a_missing_or_empty_file_is_none(tmp_path: Path) -> None:
    assert sw.read_last_record(tmp_path / "none.jsonl") is None
    (tmp_path / "empty.jsonl").write_text("")
    assert sw.read_last_record(tmp_path / "empty.jsonl") is None
    assert sw.read_last_record(tmp_path) is None  # a directory: no crash


def test_a_torn_last_line_falls_back_to_the_previous_round(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(_line(round=0) + _line(round=1) + '{"round": 2, "reward_me')
    assert sw.read_last_record(path) == {"round": 1}
    path.write_text('{"round": 0, "rew')
    assert sw.read_last_record(path) is None
    path.write_text(_line(round=0) + "\n\n")
    assert sw.read_last_record(path) == {"round": 0}
    path.write_bytes(_line(round=3).encode() + b'{"round": 4, "x": "\xff\xfe')
    assert sw.read_last_record(path) == {"round": 3}
    path.write_text(_line(round=5) + "[1, 2]\n" + "null\n")  # not objects
    assert sw.read_last_record(path) == {"round": 5}


def test_the_tail_reads_further_back_past_long_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(_line(round=0, pad="x" * 5000) + _line(round=1, pad="y" * 5000) + "{")
    assert sw.read_last_record(path, chunk=100)["round"] == 1
    path.write_text(_line(round=7, pad="x" * 5000))
    assert sw.read_last_record(path, chunk=100)["round"] == 7


# --- the view --------------------------------------------------------------------------


def test_table_has_one_aligned_row_per_node_and_dashes_for_the_unknown() -> None:
    rec = {
        "round": 4,
        "reward/mean": 0.125,
        "reward/cumulative": 1.5,
        "net/peers": 2,
        "groups/external": 3,
        "pool/groups": 17,
    }
    rows = [
        sw.Row("node-0", "12D3KooWabcdefghijklmnop", "running", rec),
        sw.Row("node-1", "12D3KooWqrstuvwxyz012345", "starting", None),
        sw.Row("node-2", "short", "exited 1", {"round": "x", "net/peers": None}),
    ]
    lines = sw.format_table(rows)
    assert lines[0].split() == list(sw.COLUMNS)
    assert lines[1].split() == [
        "node-0",
        "..ijklmnop",
        "running",
        "5",  # rounds completed: last round index + 1
        "0.125",
        "1.50",
        "2",
        "3",
        "17",
    ]
    assert lines[2].split() == ["node-1", "..yz012345", "starting"] + ["-"] * 6
    assert lines[3].split() == ["node-2", "short", "exited", "1", "?", "-", "-", "?", "-", "-"]
    assert len({len(line) for line in lines[:3]}) == 1  # aligned


def test_exit_states() -> None:
    assert sw.describe_exit(0) == "exited 0"
    assert sw.describe_exit(2) == "exited 2"
    assert sw.describe_exit(-signal.SIGKILL) == "killed SIGKILL"
    assert sw.describe_exit(-200) == "killed signal 200"


def test_a_node_is_starting_until_it_records_a_round_of_this_run(tmp_path: Path) -> None:
    child = sw.Child(_plan(tmp_path, 1)[0], [])

    class Alive:
        def poll(self):
            return None

    child.proc, child.started = Alive(), 1000.0
    assert child.state(None) == "starting"
    assert child.state({"round": 3, "time": 999.0}) == "starting"  # an earlier run's
    assert child.state({"round": 3, "time": "bad"}) == "starting"
    assert child.state({"round": 4, "time": 1001.0}) == "running"
    child.stopping = True
    assert child.state({"round": 4, "time": 1001.0}) == "stopping"


# --- supervision, with stand-in children ---------------------------------------------

# A stand-in node: records a round, then waits; SIGTERM makes it exit with code TERM_CODE
# (or it ignores SIGTERM when TERM_CODE is "ignore"); EXIT_AFTER ends it on its own.
_STANDIN = """
import json, os, signal, sys, time
data, term, exit_after, code = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
if term == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(int(term)))
with open(os.path.join(data, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"round": 0, "time": time.time(), "reward/mean": 0.5,
                        "reward/cumulative": 0.5, "net/peers": 1, "groups/external": 0,
                        "pool/groups": 2}) + "\\n")
print("stand-in up", flush=True)
time.sleep(exit_after)
sys.exit(code)
"""


def _swarm(tmp_path: Path, behaviour: list[tuple[str, float, int]], **kw) -> sw.Swarm:
    specs = _plan(tmp_path, len(behaviour))
    out, err = io.StringIO(), io.StringIO()
    swarm = sw.Swarm(specs, sw.Passthrough(), out=out, err=err, every=0.2, **kw)
    for child, (term, after, code) in zip(swarm.children, behaviour, strict=True):
        child.argv = [sys.executable, "-c", _STANDIN, str(child.spec.data_dir), term]
        child.argv += [str(after), str(code)]
    return swarm


def _wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Until ``condition()`` holds, or ``timeout`` s (the test's asserts then say what
    did not happen): a condition, not a fixed sleep, however loaded the machine."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_when_up(swarm: sw.Swarm, signum: int, times: int = 1) -> threading.Thread:
    def go() -> None:
        n = len(swarm.children)
        _wait_for(lambda: f"swarm of {n}: {n} running" in swarm.out.getvalue())  # a view
        for _ in range(times):
            if not swarm.alive():  # run() has ended: its handlers are gone
                return
            os.kill(os.getpid(), signum)
            _wait_for(lambda: "stopping" in swarm.out.getvalue())  # taken in: the next

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def test_the_swarm_ends_when_every_node_has_exited_and_names_the_failed(
    tmp_path: Path,
) -> None:
    swarm = _swarm(tmp_path, [("0", 0.5, 0), ("0", 0.8, 3)])
    assert swarm.run() == 1
    out, err = swarm.out.getvalue(), swarm.err.getvalue()
    assert "node-0 exited 0" in out and "node-1 exited 3" in out
    assert "1 of 2 failed: node-1 exited 3" in err
    assert str(swarm.children[1].spec.log_path) in err
    assert "node-0" not in err
    assert "stand-in up" in swarm.children[0].spec.log_path.read_text()
    last = out.splitlines()[-3:]  # the final view
    assert last[0].split()[:2] == ["node", "peer"]
    assert last[1].split()[:4] == ["node-0", _short(swarm, 0), "exited", "0"]
    assert last[2].split()[2:9] == ["exited", "3", "1", "0.500", "0.50", "1", "0"]


def _short(swarm: sw.Swarm, i: int) -> str:
    return sw.short_peer(swarm.children[i].spec.peer_id)


def test_all_exiting_0_is_success(tmp_path: Path) -> None:
    swarm = _swarm(tmp_path, [("0", 0.3, 0)])
    assert swarm.run() == 0
    assert swarm.err.getvalue() == ""


def test_a_signal_stops_every_node_with_sigterm(tmp_path: Path) -> None:
    swarm = _swarm(tmp_path, [("0", 60, 0), ("0", 60, 0)])
    before = signal.getsignal(signal.SIGINT)
    _signal_when_up(swarm, signal.SIGINT)
    started = time.monotonic()
    assert swarm.run() == 0
    assert time.monotonic() - started < 20
    out = swarm.out.getvalue()
    assert "stopping 2 nodes" in out
    assert "running" in out  # the view showed them up before the stop
    assert all(c.proc.returncode == 0 for c in swarm.children)
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored


def test_stragglers_are_killed_after_the_grace_period(tmp_path: Path) -> None:
    swarm = _swarm(tmp_path, [("0", 60, 0), ("ignore", 60, 0)], grace_s=1.0)
    _signal_when_up(swarm, signal.SIGTERM)
    assert swarm.run() == 1
    assert swarm.children[0].proc.returncode == 0
    assert swarm.children[1].proc.returncode == -signal.SIGKILL
    assert "killing node-1" in swarm.err.getvalue()
    assert "node-1 killed SIGKILL" in swarm.err.getvalue()


def test_a_second_signal_kills_at_once(tmp_path: Path) -> None:
    swarm = _swarm(tmp_path, [("ignore", 60, 0)], grace_s=60.0)
    _signal_when_up(swarm, signal.SIGINT, times=2)
    started = time.monotonic()
    assert swarm.run() == 1
    assert time.monotonic() - started < 20
    assert swarm.children[0].proc.returncode == -signal.SIGKILL


# --- the command -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["swarm", "--nodes", "0"], "--nodes"),
        (["swarm", "--port", "70000"], "--port"),
        (["swarm", "--config", "/no/such.toml"], "config file not found"),
        (["swarm", "--device", "tpu"], "--device"),
        (["swarm", "--local", "0", "--external", "0"], "at least 1"),
    ],
)
def test_swarm_usage_errors_exit_2_before_any_node_starts(
    argv, needle, capsys, tmp_path: Path
) -> None:
    code, _, err = run_cli([*argv, "--base-dir", str(tmp_path / "b")], capsys)
    assert code == 2 and needle in err
    assert not (tmp_path / "b").exists()


def test_swarm_on_a_busy_port_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, _, err = run_cli(
            ["swarm", "--nodes", "1", "--port", str(port), "--base-dir", str(tmp_path)], capsys
        )
    assert code == 1
    assert err.startswith("sapo-node: error: ") and err.count("\n") == 1
    assert str(port) in err


def test_help_lists_the_swarm_options(capsys) -> None:
    main(["swarm", "--help"])
    out = capsys.readouterr().out
    for opt in ("--nodes", "--base-dir", "--port", "--every", "--config", "--rounds", "--swarm"):
        assert opt in out
