"""The page of ``sapo-node swarm``: its JSON from the nodes' files and status endpoints,
and the page itself in a real headless Chromium (skipped, saying why, without one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapo_node import local_swarm as sw
from sapo_node.ops.status import StatusServer
from tests.support.browser import NO_PROXY, Browser, find_chromium

HOSTILE_ID = "<img src=/x onerror=window.__pwned=1>"


def _swarm(tmp_path: Path) -> tuple[sw.Swarm, sw.SwarmView]:
    ids = iter(["12D3KooWnodeZero000000000", "12D3KooWnodeOne0000000000"])
    specs = sw.plan(tmp_path, 2, 4150, peer_id_of=lambda _d: next(ids))
    swarm = sw.Swarm(specs, sw.Passthrough())
    for i, c in enumerate(swarm.children):
        c.spec.data_dir.mkdir(parents=True)
        with c.spec.metrics_path.open("w") as f:
            for r in range(5 + i):  # node-1 has one round more
                if i == 0 and r < 3:  # node-0 resumed on a file in the names before 0.3.0
                    rec = {"round": r, "time": 1.0, "reward_mean": 0.1 * r, "cumulative_reward": r}
                    rec |= {"peers": 1, "pool_size": 3}
                else:
                    rec = {"round": r, "time": 1.0, "reward/mean": 0.1 * r, "reward/cumulative": r}
                    rec |= {"net/peers": 1, "pool/groups": 3}
                f.write(json.dumps(rec) + "\n")
    view = sw.SwarmView(swarm)
    authors = {
        "node-0": [
            {
                "peer": specs[1].peer_id,
                "accepted": 7,
                "outcomes": {"question_mismatch": 2},
                "distrusted": False,
            },
            {"peer": HOSTILE_ID, "accepted": 0, "outcomes": {"malformed": 4}, "distrusted": True},
        ],
        "node-1": [
            {
                "peer": specs[0].peer_id,
                "accepted": 5,
                "outcomes": {"evicted_full": 1},
                "distrusted": False,
            }
        ],
    }
    view._facts = lambda c: {"url": "http://127.0.0.1:1", "healthy": True,
                             "authors": authors[c.spec.name]}  # fmt: skip
    return swarm, view


def test_the_swarm_json_puts_the_nodes_side_by_side(tmp_path: Path) -> None:
    _, view = _swarm(tmp_path)
    s = view.snapshot()
    assert [n["name"] for n in s["nodes"]] == ["node-0", "node-1"]
    assert [n["rounds"] for n in s["nodes"]] == [5, 6]
    assert s["nodes"][1]["history"]["round"] == list(range(6))
    assert s["nodes"][0]["last"]["round"] == 4
    for n in s["nodes"]:  # the old rows of node-0 read in the current names
        assert n["history"]["reward/mean"] == pytest.approx([0.1 * r for r in range(n["rounds"])])
        assert n["history"]["reward/cumulative"] == list(range(n["rounds"]))
    links = {(lk["to"], lk["from"]): lk for lk in s["links"]}
    assert links[("node-0", "node-1")]["accepted"] == 7
    assert links[("node-0", "node-1")]["refused"] == 2
    assert links[("node-1", "node-0")]["refused"] == 0  # an eviction is no refusal
    assert links[("node-0", HOSTILE_ID)]["outside"] and links[("node-0", HOSTILE_ID)]["distrusted"]


def test_the_swarm_page_in_a_real_browser(tmp_path: Path) -> None:
    binary, why = find_chromium()
    if binary is None:
        pytest.skip(why)
    _, view = _swarm(tmp_path)
    server = StatusServer("127.0.0.1:0")
    server.serve_routes(view)
    browser = None
    try:
        with NO_PROXY.open(f"{server.url}/swarm", timeout=10) as answer:
            assert json.loads(answer.read())["nodes"][0]["name"] == "node-0"
        browser = Browser(binary, tmp_path / "profile", width=400, height=900)
        browser.navigate(server.url + "/")
        browser.wait_for(
            "document.querySelectorAll('#nodes tbody tr').length === 2 && "
            "document.querySelector('svg[data-chart=swarm-reward]').dataset.points === '6'",
            30,
            "two nodes and their overlaid curves",
        )
        paths = browser.evaluate(
            "document.querySelectorAll('svg[data-chart=swarm-cumulative] path[data-series]').length"
        )
        assert paths == 2
        rows = browser.evaluate(
            "[...document.querySelectorAll('#nodes tbody tr')]"
            ".map(r => [...r.cells].slice(4).map(c => c.textContent))"
        )
        assert rows == [["0.400", "4.00", "1", "3"], ["0.500", "5.00", "1", "3"]]
        cells = browser.evaluate(
            "[...document.querySelectorAll('#matrix tbody tr')].map(r => r.textContent)"
        )
        assert cells[0].startswith("node-0") and "7 / 2" in cells[0] and "distrusted" in cells[0]
        assert "5 / 0" in cells[1]
        heads = browser.evaluate("[...document.querySelectorAll('#matrix th')].map(t => t.title)")
        assert HOSTILE_ID in heads  # the author's ID as text, in full on hover
        assert browser.evaluate("document.querySelectorAll('body img').length") == 0
        assert browser.evaluate("window.__pwned === undefined")
        assert browser.errors() == []
        host = server.url.removeprefix("http://")
        assert all(u.startswith(f"http://{host}/") for u in browser.requests())
    finally:
        if browser is not None:
            browser.close()
        server.close()
