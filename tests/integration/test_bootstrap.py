"""The way into a swarm, through real network processes on loopback: a bootstrap name
resolved by a real DNS server (/dnsaddr/, as IPFS resolves it) leads to the peer, and a
node that finds nobody says so once, with what to do."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sapo_node.config import NetSection, PoolSection
from sapo_node.net.process import Libp2pTransport
from tests.unit.test_dnsaddr import DnsServer


class QuickNotice(Libp2pTransport):
    """The node's network process, saying it is alone after 1 s instead of 60."""

    def _spawn(self) -> None:
        self.settings["alone_notice_s"] = 1.0
        super()._spawn()


def _wait(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.timeout(90)
def test_a_dnsaddr_bootstrap_name_leads_to_the_peer(tmp_path: Path) -> None:
    local = dict(listen=["/ip4/127.0.0.1/tcp/0"], mdns=False, dht=False, redial_s=1.0)
    a = Libp2pTransport(NetSection(swarm="names", **local), PoolSection(), tmp_path / "a")
    dns = DnsServer(
        {
            ("_dnsaddr.boot.test", "TXT"): [f'"dnsaddr={a.addrs[0]}"'],
            ("_dnsaddr.other.test", "TXT"): ['"dnsaddr=/ip4/127.0.0.1/tcp/9/p2p/12D3KooWx"'],
        }
    )
    b = None
    try:
        net = NetSection(
            swarm="names",
            bootstrap=[f"/dnsaddr/boot.test/p2p/{a.peer_id}"],
            nameservers=[dns.address],
            **local,
        )
        b = Libp2pTransport(net, PoolSection(), tmp_path / "b")
        assert _wait(lambda: b.peers() >= 1 and a.peers() >= 1, 45), b.child_stats
        assert ("_dnsaddr.boot.test.", "TXT") in dns.queries
    finally:
        for t in (b, a):
            if t is not None:
                t.close()
        dns.close()


@pytest.mark.timeout(60)
def test_a_node_that_finds_nobody_says_so_once(tmp_path: Path, capfd) -> None:
    net = NetSection(swarm="alone", listen=["/ip4/127.0.0.1/tcp/0"], mdns=False, redial_s=0.5)
    t = QuickNotice(net, PoolSection(), tmp_path / "a")
    try:
        time.sleep(4.0)  # several passes past the notice
    finally:
        t.close()
    err = capfd.readouterr().err
    assert err.count("no peer found") == 1, err
    assert "--swarm-file" in err and "--bootstrap" in err
