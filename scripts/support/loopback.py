"""A node's network settings on loopback, for the in-process swarms of the benchmarks
and the transport tests: 127.0.0.1 only, no mDNS, a swarm of the caller's own."""

from __future__ import annotations

from collections.abc import Iterable

from sapo_node.config import NetSection


def loopback_net(
    swarm: str, bootstrap: Iterable[str] = (), *, port: int = 0, redial_s: float = 1.0, **fields
) -> NetSection:
    """Listen on 127.0.0.1:``port`` (0: any free one), dial ``bootstrap`` only."""
    return NetSection(
        listen=[f"/ip4/127.0.0.1/tcp/{port}"],
        bootstrap=list(bootstrap),
        mdns=False,
        redial_s=redial_s,
        swarm=swarm,
        **fields,
    )
