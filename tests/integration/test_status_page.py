"""The live page at ``/`` of a real node's status endpoint, in a real headless Chromium.

A `sapo-node start` process on the tiny model trains; a hostile peer (tests/support/rogue.py)
sends it a message the network process refuses and one the intake refuses with a detail
that carries ``<script>``. The round loop is held still (its verifier worker stopped with
SIGSTOP, the endpoint's thread still answering) while the page is read, so the count of
points in each chart can be compared with the rounds done, then let go and held again to
see the charts grow. The page must load with no console error and request nothing but
the node; the hostile detail must show as text.

Skips, saying why, where no Chromium is installed (.ci/run installs Debian's).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import msgpack
import psutil
import pytest

from sapo_node.intake import wire
from sapo_node.tasks import TaskRef, generator_of
from tests.support.browser import NO_PROXY, Browser, find_chromium
from tests.support.swarm import REPO, NodeProcess, node_config

SEVENS = "tests.support.families:Sevens"
HOSTILE = "<script>window.__pwned = 1</script><img src=/x onerror=window.__pwned=2>"
ROUND_CHARTS = "[...document.querySelectorAll('svg[data-kind=round]')]"


def _status(base: str) -> dict:
    with NO_PROXY.open(f"{base}/status", timeout=10) as answer:
        return json.loads(answer.read())


def _wait(pred, timeout: float, what: str, node: NodeProcess):
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if not node.alive():
            pytest.fail(f"node exited while waiting for {what}:\n{node.tail()}")
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}\n{node.tail()}")
        time.sleep(0.2)
    return value


def _hostile_message() -> bytes:
    """A well-formed group whose task config this node never uses: the intake refuses it
    (unknown_config) with the config, the peer's own text, as the detail."""
    ref = TaskRef.make(SEVENS, {"note": HOSTILE}, 1, 0)
    group = wire.RolloutGroup(
        ref=ref,
        generator=generator_of(SEVENS),
        question="q",
        completions=("7", "77", "x", "7"),
        model="<b>model</b>",
        round=0,
        created_ms=int(time.time() * 1000),
    )
    return wire.encode(group)


def _worker(node: NodeProcess) -> psutil.Process:
    """The node's verifier worker: stopped, it holds the round loop (and only it)."""
    for child in psutil.Process(node.proc.pid).children(recursive=True):
        if any("spawn_main" in part for part in child.cmdline()):
            return child
    raise AssertionError("no verifier worker")


@pytest.fixture()
def chromium():
    binary, why = find_chromium()
    if binary is None:
        pytest.skip(why)
    return binary


def test_the_live_page_in_a_real_browser(tmp_path: Path, tiny_model_dir: Path, chromium) -> None:
    swarm = f"page-{time.monotonic_ns() % 10**9}"
    config = node_config(tmp_path / "node.toml", tiny_model_dir, swarm)
    # A stopped verifier worker holds the round loop only while scoring waits for it.
    config.write_text(
        config.read_text() + "[eval]\nevery = 3\ntasks = 4\n[scoring]\ntimeout_s = 600.0\n"
    )
    node = NodeProcess("node", tmp_path, config)
    node.start(extra=("--status-listen", "127.0.0.1:0"))
    rogue = browser = worker = None
    try:
        where = node.data_dir / "status.json"
        _wait(where.exists, 180, "the status endpoint", node)
        base = json.loads(where.read_text())["url"]
        _wait(lambda: _status(base)["round"] >= 2, 180, "2 rounds", node)

        # A hostile peer: one message the network process refuses, one the intake refuses.
        (tmp_path / "garbage.msgpack").write_bytes(msgpack.packb([1, 2, 3]))
        (tmp_path / "hostile.msgpack").write_bytes(_hostile_message())
        log = (tmp_path / "rogue.log").open("wb")
        rogue = subprocess.Popen(
            [sys.executable, "-m", "tests.support.rogue", "invalid", node.addr, wire.topic(swarm)]
            # An absolute --vector is read as that file (pathlib joins it so).
            + ["--count", "2", "--valid", "0", "--interval", "0.3", "--linger", "120"]
            + ["--vector", str(tmp_path / "garbage"), "--vector", str(tmp_path / "hostile")],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        refused = _wait(
            lambda: [r for r in _status(base)["recent_refusals"] if "<script>" in r["detail"]],
            120,
            "the hostile refusal in /status",
            node,
        )
        rogue_id = refused[0]["peer"]
        _wait(
            lambda: any(
                a["peer"] == rogue_id and "not_a_map" in a["outcomes"]
                for a in _status(base)["authors"]
            ),
            60,
            "the network's refusal counted for the rogue",
            node,
        )

        browser = Browser(chromium, tmp_path / "profile", width=420, height=900)
        browser.navigate(base + "/")
        host = urlsplit(base).netloc

        def held_still() -> int:
            """Rounds done with the round loop held; the page then shows exactly that."""
            nonlocal worker
            worker = _worker(node)
            worker.send_signal(signal.SIGSTOP)
            # a round already past scoring may still finish; the next one waits on the worker
            rounds, deadline = _status(base)["round"], time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(2.0)
                settled, rounds = rounds, _status(base)["round"]
                if rounds == settled:
                    break
            else:
                raise AssertionError("the round loop did not stop")
            browser.wait_for(
                f"{ROUND_CHARTS}.length >= 10 && {ROUND_CHARTS}"
                f".every(s => s.getAttribute('data-points') === '{rounds}')",
                60,
                f"every round chart with {rounds} points",
            )
            return rounds

        first = held_still()
        assert first >= 2
        counts = browser.evaluate(
            f"{ROUND_CHARTS}.map(s => [s.dataset.chart, +s.dataset.points, "
            "s.querySelectorAll('path[data-series]').length])"
        )
        assert all(points == first and paths >= 1 for _, points, paths in counts), counts
        # the series the page names are the record's (metrics.py): each is drawn, not empty
        drawn = browser.evaluate(
            "Object.fromEntries([...document.querySelectorAll('svg[data-kind=round] "
            "path[data-series]')].map(p => [p.closest('svg').dataset.chart + ':' + "
            "p.dataset.series, p.getAttribute('d') !== '']))"
        )
        named = (
            "reward:round", "cumulative:cumulative reward", "format:answer tags",
            "time:generate", "time:score", "time:train", "time:round", "speed:tokens/s",
            "memory:peak RSS", "swarm:peers", "pool:groups in the pool",
        )  # fmt: skip
        for name in named:
            assert drawn.get(name), (name, drawn)
        assert any(k.startswith("levels:") and v for k, v in drawn.items()), drawn
        shown = browser.evaluate("document.getElementById('facts').textContent")
        for part in ("took ", "gen ", "score ", "train "):  # fmt gives – for a missing key
            assert part in shown and part + "–" not in shown, shown
        assert "– tok/s" not in shown and "trained on –" not in shown, shown
        evals = browser.evaluate("+document.querySelector('svg[data-chart=eval]').dataset.points")
        assert evals == first // 3

        # The rogue's refusals in the table, the hostile detail as text, nothing run.
        row = browser.wait_for(
            f"[...document.querySelectorAll('#peers tr')].find(r => r.dataset.peer === "
            f"{json.dumps(rogue_id)})?.textContent",
            30,
            "the rogue's row",
        )
        assert "not_a_map 1" in row and "unknown_config 1" in row, row
        details = browser.evaluate(
            "[...document.querySelectorAll('#refusals td.detail')].map(td => td.textContent)"
        )
        assert any(HOSTILE in d for d in details), details
        assert browser.evaluate("document.querySelectorAll('body script, body img').length") == 0
        assert browser.evaluate("window.__pwned === undefined")

        worker.send_signal(signal.SIGCONT)
        _wait(lambda: _status(base)["round"] >= first + 3, 120, "3 more rounds", node)
        second = held_still()
        assert second >= first + 3
        worker.send_signal(signal.SIGCONT)
        worker = None

        assert browser.evaluate("document.getElementById('health').textContent") == "healthy"
        assert browser.errors() == []
        requests = browser.requests()
        assert requests and all(urlsplit(u).netloc == host for u in requests), requests
        assert {urlsplit(u).path for u in requests} >= {"/", "/status", "/history"}
    finally:  # each step whatever the one before did: nothing the test started outlives it
        if worker is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.send_signal(signal.SIGCONT)
        if browser is not None:
            browser.close()
        if rogue is not None:
            rogue.kill()
            rogue.wait(10)
        code = node.stop()
    assert code == 0, node.tail()
