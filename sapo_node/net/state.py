"""What the network process's parts share: its counters and the addresses it shows.

One network runs in each network process (``python -m sapo_node.net.host``), and
py-libp2p calls the hooks that need this state (identify's message, the signed peer
record: net/patches.py) with nothing but the host, so it is one object per process:
:data:`STATE`. Only the network (``net/network.py`` and its behaviours) changes it.
"""

from __future__ import annotations

import math

from sapo_node import addresses


class Counters:
    """What the network process counts, reported in its stats each second."""

    def __init__(self) -> None:
        self.received = self.rejected = self.rate_limited = 0
        self.bytes_in = self.bytes_out = self.published = self.bad_frames = 0
        self.backpressure_waits = 0
        self.inbound_refused = 0  # connections refused at the limits (patches.guard_swarm)
        self.inbound_capped = 0  # of those, refused at their address's share
        self.inbound_pruned = 0  # accepted ones closed for a newcomer (they gave nothing)


class NetState:
    """This node's reachability and the addresses it shows peers
    (docs/libp2p.md#addresses-shown-to-peers)."""

    def __init__(self) -> None:
        self.reachability: addresses.Reachability = "public"
        self.relayed: list[str] = []  # its addresses through its relays (a private node's)
        self.unreachable: set[str] = set()  # addresses AutoNAT found peers cannot dial
        # when (time.monotonic) a peer outside the LAN last dialled this node directly
        # while it was public (patches.guard_swarm): AutoNAT's evidence of reachability
        self.dialled_in_at = -math.inf

    def shown(self, addrs: list[str], peer_ip: str | None) -> list[str]:
        """The addresses a peer from ``peer_ip`` may see (addresses.shown; none that AutoNAT
        found unreachable), then the relayed ones, which anyone may."""
        addrs = [a for a in addrs if a.split("/p2p/")[0] not in self.unreachable]
        relayed = [a for a in self.relayed if a not in addrs]
        return addresses.shown(self.reachability, addrs, peer_ip) + relayed


COUNTERS = Counters()
STATE = NetState()
