"""A port mapping on the home router (UPnP IGD), so that a node behind NAT is public.

At start, a node that would be private (``addresses.decide``: only LAN addresses, nothing to
announce) asks the router on its LAN for a mapping of its TCP listen port, as kubo does.
It then announces ``/ip4/<the router's external IP>/tcp/<port>`` and is public (reason
``upnp``). It is not when no router answers within ``DISCOVER_S``, the router refuses
the mapping, or the router's external address is itself a LAN one (a double NAT, or
carrier-grade NAT: 100.64/10): the node stays private, with one log line saying which.

py-libp2p 0.8.1 has a UPnP helper (``libp2p.discovery.upnp.UpnpManager``) but
is not used here. miniupnpc raises an exception reading "Success" when *no* device
answered, which it counts as one found; it judges the external IP with
``ipaddress.is_private``, which calls 198.18/15 private and 100.64/10 (carrier-grade
NAT) public, the opposite of addresses.is_lan; it maps for ever (lease 0: a node that
crashed keeps the port open on the router) and never renews; its blocking calls run in
threads trio cannot abandon, so a bound around its discovery waits for miniupnpc's own
(4 s here with no router); and it does not advertise the address it mapped. Each
would need a patch, so the few miniupnpc calls it wraps are made here, in one thread,
abandoned at the bound (docs/libp2p.md#upnp).

A mapping is leased (``LEASE_S``) and renewed at half its lease, so that a node that
dies leaves nothing open for long; a node that stops deletes it (best effort, bounded).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import trio

from sapo_node import addresses

DISCOVER_S = 2.0  # the most start-up waits for a router to answer and map
DISCOVER_DELAY_MS = 1000  # miniupnpc's wait for SSDP answers, per search
LEASE_S = 3600  # a mapping lasts this long unless renewed
RENEW_S = LEASE_S / 2
CALL_S = 5.0  # the most a renewal or the deletion waits for the router
DESCRIPTION = "sapo-node"


@dataclass
class Mapping:
    """A TCP port mapped on the router: ``external_ip:port`` leads to ``lan_ip:port``."""

    gateway: Any  # miniupnpc.UPnP, its router selected
    external_ip: str
    lan_ip: str
    port: int

    @property
    def addr(self) -> str:
        return f"/ip4/{self.external_ip}/tcp/{self.port}"

    def renew(self) -> None:
        """Map again (the router extends the lease); raises if it refuses."""
        self.gateway.addportmapping(
            self.port, "TCP", self.lan_ip, self.port, DESCRIPTION, "", LEASE_S
        )

    def delete(self) -> None:
        self.gateway.deleteportmapping(self.port, "TCP")


def map_port(port: int) -> Mapping | str:
    """Blocking: find the router, check its external address, map ``port`` (TCP) to this
    machine for LEASE_S. The mapping, or why there is none (one sentence)."""
    import miniupnpc

    gateway = miniupnpc.UPnP()
    gateway.discoverdelay = DISCOVER_DELAY_MS
    try:
        found = gateway.discover()
    except Exception:  # miniupnpc's "Success": nothing answered
        found = 0
    if not found:
        return "no UPnP router (IGD) answered on this LAN"
    try:
        gateway.selectigd()
    except Exception as exc:
        return f"no UPnP router (IGD) among the devices that answered ({exc})"
    try:
        external = gateway.externalipaddress() or ""
    except Exception as exc:
        return f"the UPnP router gave no external address ({exc})"
    if not external or addresses.is_lan(external):
        return (
            f"the UPnP router's external address ({external or 'none given'}) is not public: "
            "a double NAT or carrier-grade NAT"
        )
    mapping = Mapping(gateway, external, gateway.lanaddr, port)
    try:
        mapping.renew()
    except Exception as exc:
        return f"the UPnP router refused to map TCP port {port} ({exc})"
    return mapping


async def open_mapping(port: int, within_s: float = DISCOVER_S) -> Mapping | str:
    """:func:`map_port` in a thread, abandoned after ``within_s`` (the thread ends by
    itself with miniupnpc's own timeouts; a mapping it made then lapses with its lease)."""
    result: Mapping | str = f"no UPnP router (IGD) answered within {within_s:g} s"
    with trio.move_on_after(within_s):
        result = await trio.to_thread.run_sync(map_port, port, abandon_on_cancel=True)
    return result


async def call(fn: Any, within_s: float = CALL_S) -> str | None:
    """Run a blocking router call in a thread, bounded: None if it worked, else why."""
    with trio.move_on_after(within_s):
        try:
            await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
        except Exception as exc:
            return str(exc) or type(exc).__name__
        return None
    return f"no answer in {within_s:g} s"


def delete_now(mapping: Mapping, within_s: float = 1.0) -> bool:
    """Delete ``mapping`` from any thread, waiting at most ``within_s`` (a process about
    to exit: the lease ends it otherwise)."""
    done = threading.Event()

    def run() -> None:
        try:
            mapping.delete()
            done.set()
        except Exception:
            pass

    threading.Thread(target=run, name="upnp-delete", daemon=True).start()
    return done.wait(within_s)
