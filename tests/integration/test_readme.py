"""The README's "two nodes on one machine", run as written: the identity command, then
A and B with default settings but for the lines' own flags (on the tiny model, given
through the environment), until B's pool accepts A's groups."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.swarm import REPO, wait_until

MARKER = "<!-- two nodes on one machine -->"


def readme_commands(text: str) -> list[str]:
    """The shell lines of the fenced block after MARKER, continuations joined and
    comments dropped."""
    block = text.split(MARKER, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    joined = block.replace("\\\n", " ")
    return [line.split("   #", 1)[0].strip() for line in joined.splitlines() if line.strip()]


def _tiny_env(model_dir: Path) -> dict[str, str]:
    """The test's own settings removed (the README runs on defaults), then the tiny model
    practising Sevens. mDNS stays off: it multicasts on every interface."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAPO_")}
    return env | {
        "PYTHONPATH": str(REPO),
        "SAPO_NET__MDNS": "false",
        "SAPO_MODEL__NAME": json.dumps(str(model_dir)),
        "SAPO_NODE__THREADS": "1",
        "SAPO_GENERATION__MAX_NEW_TOKENS": "6",
        "SAPO_GENERATION__COMPLETIONS_PER_TASK": "4",
        "SAPO_TASKS__FAMILIES": '[{name = "tests.support.families:Sevens"}]',
        "SAPO_TASKS__ONE_SHOT": "false",
        "SAPO_TASKS__SYSTEM_PROMPT": '"Reply."',
        "SAPO_TASKS__REWARD": '"partial"',
        "SAPO_TRAIN__LOCAL_GROUPS": "2",
        "SAPO_TRAIN__EXTERNAL_GROUPS": "2",
        "SAPO_POOL__SAMPLING": '"uniform"',
    }


def _argv(line: str, tmp_path: Path) -> list[str]:
    argv = shlex.split(line.replace("/tmp/", f"{tmp_path}/"))
    assert argv[0] == ".venv/bin/sapo-node", line
    return [str(Path(sys.executable).parent / "sapo-node"), *argv[1:]]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _accepted(data_dir: Path) -> int:
    try:
        lines = (data_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    return sum(json.loads(x).get("net/accepted", 0) for x in lines if x.startswith("{"))


def test_the_readme_two_nodes_start_and_b_takes_a_groups(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    identity, start_a, start_b = readme_commands((REPO / "README.md").read_text())
    ports = sorted({int(p) for p in re.findall(r"/tcp/(\d+)", start_a + start_b)})
    if not all(_port_free(p) for p in ports):
        pytest.skip(f"the README's ports {ports} are taken on this machine")
    env = _tiny_env(tiny_model_dir)
    out = subprocess.run(
        _argv(identity, tmp_path), cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    peer = re.search(r"peer id: (\S+)", out.stdout).group(1)
    start_b = start_b.replace("<A's peer id>", peer)
    nodes = []
    try:
        for name, line in (("a", start_a), ("b", start_b)):
            with (tmp_path / f"{name}.log").open("wb") as log:
                nodes.append(
                    subprocess.Popen(
                        _argv(line, tmp_path), cwd=REPO, env=env, stdout=log, stderr=log
                    )
                )
        a, b = nodes
        exited = lambda: a.poll() is not None or b.poll() is not None  # noqa: E731
        took = wait_until(lambda: _accepted(tmp_path / "b") > 0 or exited(), 240)
        logs = {n: (tmp_path / f"{n}.log").read_text()[-3000:] for n in "ab"}
        assert a.poll() is None and b.poll() is None, logs
        assert took and _accepted(tmp_path / "b") > 0, logs
        # each serves its own status endpoint, and says where
        urls = {json.loads((tmp_path / n / "status.json").read_text())["url"] for n in "ab"}
        assert len(urls) == 2, urls
    finally:
        for proc in nodes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in nodes:
            try:
                assert proc.wait(90) == 0
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                raise
