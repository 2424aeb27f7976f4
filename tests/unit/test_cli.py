from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapo_node.cli import main
from sapo_node.ops.plot import plot_metrics
from tests.support.cli import run_cli


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["start", "--bogus"], "No such option: --bogus"),
        (["start", "--rounds", "-1"], "--rounds"),
        (["start", "--local", "x"], "--local"),
        (["start", "--device", "tpu"], "--device"),
        (["start", "--config", "/no/such.toml"], "config file not found"),
        (["nope"], "No such command"),
        (["plot", "/no/such/metrics.jsonl"], "does not exist"),
    ],
)
def test_usage_errors_are_one_line_with_exit_code_2(argv, needle, capsys) -> None:
    code, _, err = run_cli(argv, capsys)
    assert code == 2
    assert needle in err
    assert err.startswith("sapo-node: error: ") and err.count("\n") == 1


def test_invalid_config_values_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nlr = -1\n")
    code, _, err = run_cli(["start", "--config", str(bad)], capsys)
    assert code == 2 and "train.lr" in err


def test_cli_flags_that_break_cross_checks_exit_2(capsys) -> None:
    code, _, err = run_cli(["start", "--local", "0", "--external", "0"], capsys)
    assert code == 2 and "at least 1" in err


def test_help_explains_every_start_option(capsys) -> None:
    main(["start", "--help"])
    out = capsys.readouterr().out
    for opt in (
        "--config",
        "--model",
        "--data-dir",
        "--rounds",
        "--local",
        "--external",
        "--json-logs",
        "--device",
        "--lora",
        "--seed",
        "--swarm-file",
    ):
        assert opt in out


def test_start_and_doctor_take_the_same_options() -> None:
    import typer

    from sapo_node.cli import app

    commands = typer.main.get_command(app).commands
    start, doctor = ([p.opts for p in commands[c].params] for c in ("start", "doctor"))
    assert start == doctor and ["--no-train"] in start
    helps = {c: {p.name: p.help for p in commands[c].params} for c in ("start", "doctor")}
    assert helps["doctor"] == {**helps["start"], "json_logs": "Ignored."}


def test_model_that_cannot_be_loaded_exits_1(tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(
        ["start", "--model", str(tmp_path / "missing"), "--data-dir", str(tmp_path / "d")], capsys
    )
    assert code == 1
    assert "model directory not found" in err and "Traceback" not in err


def test_config_command_prints_resolved_config(capsys) -> None:
    main(["config"])
    assert json.loads(capsys.readouterr().out)["train"]["local_groups"] == 2


def test_plot_writes_pngs(tmp_path: Path) -> None:
    rows = [
        {
            "round": r,
            "reward/mean": r / 10,
            "reward/cumulative": r * r / 20,
            "family_reward/basic_arithmetic": r / 10,
            "family_level/basic_arithmetic": r // 3,
        }
        for r in range(10)
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{torn")
    written = plot_metrics(path, tmp_path / "plots", window=3)
    assert [p.name for p in written] == ["reward.png", "cumulative_reward.png", "levels.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unreadable_node_state_exits_1(tmp_path: Path, capsys) -> None:
    (tmp_path / "node.json").write_text("{broken")
    code, _, err = run_cli(["start", "--data-dir", str(tmp_path), "--model", "/no/model"], capsys)
    assert code == 1 and "node.json cannot be read" in err


def test_pool_prints_what_the_pool_holds_and_per_peer_counts(tmp_path: Path, capsys) -> None:
    from sapo_node.intake import wire
    from sapo_node.intake.pool import Pool, PooledGroup, group_digest
    from sapo_node.tasks import TaskRef

    group = wire.RolloutGroup(
        TaskRef.make("basic_arithmetic", {}, 1, 2),
        "reasoning_gym 0.1.25",
        "What is 2 + 2?",
        ("4", "5"),
        model="m",
        round=0,
        created_ms=0,
    )
    pool = Pool(tmp_path / "pool.sqlite3")
    pool.add(
        PooledGroup(group, "peer-a", (1.0, 0.0)), wire.encode(group), group_digest("peer-a", group)
    )
    pool.record("peer-b", "question_mismatch")
    pool.close()
    main(["pool", "--data-dir", str(tmp_path)])
    shown = json.loads(capsys.readouterr().out)
    assert shown["groups"] == 1 and shown["groups_with_signal"] == 1
    assert shown["families"] == {"basic_arithmetic": 1}
    assert shown["peers"] == {
        "peer-a": {"held": 1, "accepted": 1},
        "peer-b": {"held": 0, "question_mismatch": 1},
    }
    code, _, err = run_cli(["pool", "--data-dir", str(tmp_path / "none")], capsys)
    assert code == 1 and "no pool at" in err


def test_identity_is_created_once_and_printed_with_addresses(tmp_path: Path, capsys) -> None:
    argv = ["identity", "--data-dir", str(tmp_path), "--listen", "/ip4/127.0.0.1/tcp/4141"]
    main(argv)
    first = capsys.readouterr().out
    main(argv)
    assert capsys.readouterr().out == first
    peer = first.splitlines()[0].removeprefix("peer id: ")
    assert peer.startswith("12D3KooW")
    assert f"address: /ip4/127.0.0.1/tcp/4141/p2p/{peer}" in first
    assert "reachability: local" in first
    argv = ["identity", "--data-dir", str(tmp_path), "--listen", "/ip4/192.168.1.20/tcp/4141"]
    main(argv)
    assert "reachability: private" in capsys.readouterr().out
    main([*argv, "--announce", "/ip4/203.0.113.7/tcp/4141"])
    out = capsys.readouterr().out
    assert "address: /ip4/203.0.113.7/tcp/4141/p2p/" in out and "reachability: public" in out
    assert (tmp_path / "identity.key").stat().st_mode & 0o777 == 0o600


def test_a_busy_port_is_one_line_and_exit_1_before_the_model_loads(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import socket

    monkeypatch.setenv("SAPO_NET__ENABLED", "true")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        argv = ["start", "--data-dir", str(tmp_path), "--model", str(tmp_path / "no-model")]
        code, _, err = run_cli([*argv, "--listen", f"/ip4/127.0.0.1/tcp/{port}"], capsys)
    last = err.splitlines()[-1]  # after the logged config
    assert code == 1 and last.startswith("sapo-node: error: ")
    assert f"port {port} on 127.0.0.1 is in use" in last
    assert "node ready" not in err


def test_no_train_needs_the_network(capsys) -> None:
    code, _, err = run_cli(["start", "--no-train", "--offline"], capsys)
    assert code == 2 and "--no-train" in err


def test_tasks_prints_what_a_default_node_accepts(capsys) -> None:
    import re

    capsys.readouterr()
    main(["tasks"])
    accepted = json.loads(capsys.readouterr().out)
    from sapo_node.tasks import RG_VERSION, canonical_json

    assert accepted["basic_arithmetic"]["generator"] == f"reasoning_gym {RG_VERSION}"
    configs = {canonical_json(c) for c in accepted["basic_arithmetic"]["configs"]}
    spec = (Path(__file__).parents[2] / "protocol" / "SPEC.md").read_text()
    example = re.search(r"node accepts\):\n`(\{.*\})`", spec).group(1)
    assert example in configs  # the spec's example config is one a default node accepts
