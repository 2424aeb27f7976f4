"""A public swarm through real NAT, built in network namespaces this test creates (a wan,
two home routers doing nftables masquerade, one of them symmetric) and removes when its
user namespace ends: ``tests/support/nat_swarm.py`` says what it builds and checks.

Nothing leaves the namespaces, and their addresses are in 198.18.0.0/15 only: 198.18/16
the internet, 198.19/16 the LANs behind the home routers (each node counts it as LAN:
``net.lan_ranges``, tests/support/nat_swarm.py; but in tests/support/nat_inside.py,
where it is a home numbered outside the LAN ranges). The UPnP router's IGD is a
small Python one (tests/support/igd.py; tests/support/nat_upnp.py says why not miniupnpd).
Where namespaces or nftables are missing the test is skipped with the reason; `.ci/run`
installs nftables and sets ``SAPO_REQUIRE_NAMESPACES=1``, so CI runs it or fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.namespaces import need_namespaces, nft_problem, run_unshared
from tests.support.nat_upnp import IGD_ACTIONS

RUN_S = 150  # ~45 s quiet (six network processes start one after another), 75 s loaded


def checks_of(module: str, *args: str, timeout: float) -> dict:
    """The checks of ``module`` run in namespaces of its own (skipped, with the reason,
    where nftables or namespaces are missing: ``need_namespaces``); the test fails unless
    every one passed."""
    need_namespaces(nft_problem())
    code, result, log = run_unshared(module, *args, timeout=timeout)
    assert code == 0 and result["ok"], f"exit {code}: {result}\nlog:\n{log}"
    return result["checks"]


@pytest.mark.timeout(RUN_S + 30)
def test_home_nodes_behind_nat_join_through_public_nodes_and_leak_no_lan_address() -> None:
    checks = checks_of("tests.support.nat_swarm", timeout=RUN_S)
    assert checks["reachability"] == {
        "pub1": "public",
        "pub2": "public",
        "h1": "private",
        "h2": "private",
        "h4": "private",
        "h3": "public",
    }
    # the public nodes' DHTs: each other and the home node with a forwarded port, only
    assert checks["routing_table"] == {"pub1": 2, "pub2": 2}
    assert checks["dht_lan_addrs"] == {"pub1": 0, "pub2": 0}
    assert checks["home_exchange"] and checks["exchange_without_pub1"]
    # the two home nodes reach each other through a public node's relay (circuit v2)
    assert checks["relayed_home_link"]
    assert all(relayed >= 1 for _, relayed in checks["connections"].values())
    assert checks["forwarded_port_dialled"]
    # DCUtR: h1 and h4 (NATs that keep ports) end with one direct connection and no
    # relayed one, and still exchange with both public nodes gone; h2 (symmetric NAT)
    # has no direct connection to either, only relayed ones
    assert checks["punched"], checks["links"]
    assert checks["links"]["h1-h4"] == [1, 0] and checks["links"]["h4-h1"] == [1, 0]
    assert all(h >= 1 for h, _ in (checks["hole_punches"][n] for n in ("h1", "h4")))
    assert checks["symmetric_stays_relayed"], checks["symmetric_links"]
    assert all(checks["links"][k][0] == 0 < checks["links"][k][1] for k in ("h2-h1", "h2-h4"))
    assert all(d == 0 for d, _ in checks["symmetric_links"].values())  # also at the end
    assert checks["hole_punches_at_end"]["h2"][0] == 0  # none of its punches worked
    assert checks["exchange_direct_only"]


@pytest.mark.timeout(RUN_S + 60)
def test_whole_nodes_behind_nat_take_each_others_groups(tiny_model_dir: Path) -> None:
    """The same NAT, with real `sapo-node start` processes: two relays (--no-train) on
    the wan and a tiny-model trainer in each home (tests/support/nat_nodes.py)."""
    checks = checks_of(
        "tests.support.nat_nodes", "--model", str(tiny_model_dir), timeout=RUN_S + 30
    )
    assert checks["each_takes_the_others_groups"]
    assert checks["reachability"] == {"h1": "private", "h2": "private"}
    assert checks["reason"] == {"h1": "nat", "h2": "nat"}  # UPnP asked, no router
    assert set(checks["exit_codes"].values()) == {0}  # every node stopped cleanly


@pytest.mark.timeout(150)
def test_home_node_with_upnp_reads_public_and_is_dialled_directly() -> None:
    """A UPnP router (a Python IGD, nftables DNAT) in front of a home LAN
    (tests/support/nat_upnp.py): the node with net.upnp on maps its port, reads public
    (reason upnp), announces the router's address and is dialled there by a public node,
    not through a relay; with upnp off, or no router to ask, a home node reads private."""
    # ~15 s quiet; 36 s measured with the machine's load at 35
    checks = checks_of("tests.support.nat_upnp", timeout=120)
    assert checks["reachability"] == {
        "up": ["public", "upnp"],
        "off": ["private", "nat"],
        "none": ["private", "nat"],
    }
    assert checks["announced"] == ["/ip4/198.18.1.2/tcp/4141"]
    assert checks["pub_dialled_up"] and checks["pub_connections"] == [1, 0]  # direct, 0 relayed
    assert checks["router_maps_4141"] and checks["mapping_deleted"]
    # the router was asked by the node with UPnP on (found, selected, mapped, unmapped) only
    assert checks["igd_asked_by"] == {"198.19.1.2": IGD_ACTIONS}


@pytest.mark.timeout(150)
def test_a_firewalled_node_with_a_public_address_turns_private_by_autonat() -> None:
    checks = checks_of("tests.support.nat_autonat", timeout=120)
    assert checks["verdict"] == {"fw": "private", "open": "public"}
    assert checks["reachability"]["fw"] == ["private", "autonat"]
    assert checks["relay_reserved"] and checks["routing_table_dropped_fw"] and checks["exchange"]


@pytest.mark.timeout(150)
def test_a_dialable_looking_node_alone_with_one_public_node_turns_private() -> None:
    """A swarm of one public node and two nodes whose addresses are outside the LAN
    ranges but firewalled (tests/support/nat_alone.py): the one public node's failed
    dial-back and no peer dialling in for autonat.ALONE_S make each private, and the two
    meet through the public node's relay (found in the DHT at their relayed addresses);
    once its firewall opens, the next check makes one public again."""
    checks = checks_of("tests.support.nat_alone", timeout=120)
    assert checks["at_start"] == {"fw1": ["public", "address"], "fw2": ["public", "address"]}
    assert checks["reachability"] == {"fw1": ["private", "autonat"], "fw2": ["private", "autonat"]}
    assert checks["relay_reserved"] and checks["routing_table_dropped"] and checks["exchange"]
    assert checks["met"], checks["fw1_fw2_link"]
    assert checks["public_again"] and checks["back_in_routing_table"]
    assert checks["fw2_still_private"]


@pytest.mark.timeout(180)
def test_home_nodes_behind_nat_numbered_outside_the_lan_ranges_turn_private_and_meet() -> None:
    """Two homes behind NAT whose inside addresses are not LAN addresses, and one public
    node (tests/support/nat_inside.py): each home node reads public, the public node dials
    its router back at its port and fails, and with nobody dialling in it turns private,
    reserves a relay slot, and the two meet. A server that refused such an asker (its
    addresses are not on the IP its connection comes from) left it public for good.

    Not the default timings: with one public node a verdict rests on one failed answer
    and autonat.ALONE_S (120 s) with nobody dialling in, which would hold a test worker
    for about 160 s of the suite's 8 minutes. Every other timing is the default, and
    ``unshare -rn python -m tests.support.nat_inside`` runs it on all of them
    (docs/benchmarks.md)."""
    checks = checks_of("tests.support.nat_inside", "--alone-s", "5", timeout=150)
    assert checks["reachability"] == {"h1": ["private", "autonat"], "h2": ["private", "autonat"]}
    assert checks["answers"] == {"h1": {"198.18.0.1": 100}, "h2": {"198.18.0.1": 100}}
    assert checks["relay_reserved"] and checks["exchange"]
    assert checks["met"], checks["h1_h2_link"]
