"""mDNS discovery for real: two nodes with no bootstrap address find each other and
exchange a message each way.

mDNS multicasts on every interface it sees, so it runs only inside a user + network
namespace this test creates (``unshare -rn``), where the only interfaces are the ones
``tests/support/mdns_pair.py`` makes: ``lo``, and in the ``veth`` case a veth pair into a
second namespace. Nothing is ever multicast on this machine's own interfaces; where
unprivileged namespaces are not allowed the tests are skipped, with the reason (they
fail instead under ``SAPO_REQUIRE_NAMESPACES=1``, as in CI: tests/support/namespaces.py).
"""

from __future__ import annotations

import pytest

from tests.support.namespaces import need_namespaces, run_unshared, unshare_problem, veth_problem

RUN_S = 100  # a pair starts in ~8 s, finds each other ~1 s later; generous for a loaded CI


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["lo", "veth", "ipfs"])
def test_two_nodes_find_each_other_by_mdns_and_exchange_messages(mode: str) -> None:
    """``lo``: both on 127.0.0.1 in one namespace. ``veth``: two namespaces on one link,
    both listening on 0.0.0.0 as the default config does, so only the interface
    addresses mDNS announces can connect them (py-libp2p alone announced 0.0.0.0).
    ``ipfs``: as ``lo``, beside a peer that announces and browses IPFS's mDNS name: the
    swarm's name (SPEC 2, *Discovery*) keeps the pair from finding it, and from dialling
    it (on IPFS's name, each dialled it within seconds)."""
    need_namespaces(unshare_problem("true") or (veth_problem() if mode == "veth" else None))
    code, result, log = run_unshared("tests.support.mdns_pair", "--mode", mode, timeout=RUN_S)
    assert code == 0 and result["ok"], f"exit {code}: {result}\nlog:\n{log}"
    assert result["mode"] == mode
    if mode == "veth":  # each node's own address on the link, not 0.0.0.0
        assert result["addrs"]["a"][0].startswith("/ip4/198.19.77.1/tcp/")
        assert result["addrs"]["b"][0].startswith("/ip4/198.19.77.2/tcp/")
    if mode == "ipfs":
        assert result["ipfs_dialled_by"] == []
