"""``sapo-node swarm`` as a user runs it: two real nodes on loopback, bootstrapped to
each other, two rounds each, one combined view."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sapo_node.local_swarm import busy_ports
from tests.support.nodes import sevens_overrides

REPO = Path(__file__).resolve().parents[2]


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for the paths and names used here
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def _toml(config: dict) -> str:
    """Sections of scalars, lists and lists of tables (enough for sevens_overrides)."""
    lines = []
    for section, values in config.items():
        lines.append(f"[{section}]")
        tables = {k: v for k, v in values.items() if isinstance(v, list) and v and _dicts(v)}
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items() if k not in tables]
        for key, items in tables.items():
            for item in items:
                lines.append(f"[[{section}.{key}]]")
                lines += [f"{k} = {_toml_value(v)}" for k, v in item.items()]
    return "\n".join(lines) + "\n"


def _dicts(items: list) -> bool:
    return all(isinstance(x, dict) for x in items)


def _free_ports(n: int) -> int:
    """A base port with the next n - 1 also free on loopback."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + n - 1 <= 65535 and not busy_ports(range(port, port + n)):
            return port
    pytest.fail("no free port range on 127.0.0.1")


def _command() -> list[str]:
    script = Path(sys.executable).with_name("sapo-node")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sapo_node.cli"]


def _metrics(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.timeout(240)
def test_a_local_swarm_of_two_runs_its_rounds_and_shows_one_view(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    overrides = sevens_overrides(
        tiny_model_dir,
        tmp_path / "unused",  # each node's --data-dir wins over the file's
        train={"local_groups": 2, "external_groups": 2},
        net={"redial_s": 1.0},
    )
    config = tmp_path / "swarm.toml"
    config.write_text(_toml(overrides))
    base = tmp_path / "base"
    port = _free_ports(2)
    argv = [
        *_command(),
        "swarm",
        "--nodes",
        "2",
        "--rounds",
        "2",
        "--config",
        str(config),
        "--base-dir",
        str(base),
        "--port",
        str(port),
        "--every",
        "1",
        "--seed",
        "10",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "SAPO_NET__ENABLED": "true"}
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the swarm stops its nodes (they have sessions)
        try:
            out, err = proc.communicate(timeout=75)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        logs = "\n".join(p.read_text()[-1500:] for p in base.glob("node-*/node.log"))
        pytest.fail(f"swarm too slow\n{out[-3000:]}\n{err[-2000:]}\n{logs}")

    logs = "\n".join(p.read_text()[-2000:] for p in sorted(base.glob("node-*/node.log")))
    assert proc.returncode == 0, f"{out[-3000:]}\n{err[-2000:]}\n{logs}"
    assert not (tmp_path / "unused").exists()

    records = [_metrics(base / f"node-{i}" / "metrics.jsonl") for i in range(2)]
    assert [[r["round"] for r in recs] for recs in records] == [[0, 1], [0, 1]]
    assert max(r.get("net/peers", 0) for recs in records for r in recs) >= 1, logs
    for i in range(2):
        node = base / f"node-{i}"
        assert f"--listen /ip4/127.0.0.1/tcp/{port + i}" in (node / "node.log").read_text()
        assert json.loads((node / "node.json").read_text())["seed"] == 10 + i  # SEED + i

    rows = [line.split() for line in out.splitlines()]
    for name in ("node-0", "node-1"):
        mine = [r for r in rows if r and r[0] == name and len(r) == 10]
        assert mine, out[-3000:]
        assert mine[-1][2:4] == ["exited", "0"] and mine[-1][4] == "2"  # 2 rounds done
