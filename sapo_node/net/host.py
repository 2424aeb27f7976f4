"""The network process: a py-libp2p host running GossipSub for one swarm.

Started by :class:`sapo_node.net.process.Libp2pTransport` as ``python -m
sapo_node.net.host``; it never imports torch. It talks to its parent over stdin/stdout
in length-prefixed MessagePack frames (``sapo_node.net.ipc``):

    parent -> here   ["settings", {...}] first, then ["publish", bytes], ["penalise", author],
                     ["flush", token, seconds]
    here -> parent   ["ready", peer_id, [addr, ...], [listen, ...]], ["message", bytes, author],
                     ["stats", {...}] every second, ["fatal", text],
                     ["flushed", token, written]: the publishes before that flush are
                     written to the peers' streams (false: not within its seconds)

It holds nothing worth saving: what it learns about peers that must outlive it (bans
with their wall-clock ends, score penalties) goes to the parent in its stats, and comes
back in the settings of the next one (the parent keeps it in the data directory,
peerstate.py). It ignores SIGINT and SIGTERM: a signal sent to the node's whole process
group (Ctrl-C, ``timeout``, a supervisor) is the node's to act on, and the node then
stops it with SIGUSR1. It exits by itself when its parent is gone (stdin closes, or it
is given another parent), within a second.

Where each part of the network lives (one behaviour per protocol, as rust-libp2p composes
them; the network drives them):

- ``net/network.py``: :class:`Network`, the host and the loops that drive the behaviours;
- ``net/pubsub.py``: GossipSub, the validator, scoring, bans, backpressure;
- ``net/discovery.py``: dialling and backoff, bootstrap peers, the DHT and its providers;
- ``net/reachability.py``: relays, hole punching, AutoNAT (``net/autonat.py``), the
  router's port mapping (``net/upnp.py``), the addresses shown to peers (``addresses.py``);
- ``net/state.py``: what they share with the library's hooks (counters, the shown addresses);
- ``net/patches.py``: every change to py-libp2p's internals, checked at start by
  :func:`_main`; docs/libp2p.md says what the network relies on in the library, and why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import multiaddr
import structlog
import trio

from sapo_node import addresses
from sapo_node.logs import configure_logging
from sapo_node.net import NetError, ipc, patches, upnp
from sapo_node.net.network import Network
from sapo_node.net.ports import check_ports_free
from sapo_node.net.reachability import announced_addresses

log = structlog.get_logger("sapo_node.net")


async def _main(in_fd: int, out_fd: int) -> int:
    commands = ipc.FrameReader(trio.lowlevel.FdStream(in_fd))
    out = ipc.FrameWriter(trio.lowlevel.FdStream(out_fd))
    first = await commands.receive()
    if first is None or first[0] != "settings":
        return 2
    settings = first[1]
    configure_logging(json_logs=settings.get("json_logs", False), models=False)
    try:
        patches.apply()  # a py-libp2p they do not fit: one line, as the fatal error
        addresses.count_as_lan(settings.get("lan_ranges", []))
        check_ports_free([multiaddr.Multiaddr(a) for a in settings["listen"]])
        mapping = await _map_port(settings)
        network = Network(settings, out, mapping, exit_now=_exit)
        patches.warn_unless_holding()  # the library's modules it uses are loaded now
    except (NetError, ValueError) as exc:
        await out.send(["fatal", str(exc)])
        return 1
    failure = None
    try:
        await network.run(commands)
    except* ipc.PeerGone:  # the node exited without a word: nothing left to serve
        pass
    except* OSError as group:  # listen failures surface here
        failure = f"cannot listen on {settings['listen']}: {group.exceptions[0]}"
    if failure is None:
        return 0
    await out.send(["fatal", failure])
    return 1


async def _map_port(settings: dict[str, Any]) -> upnp.Mapping | None:
    """A node that would be private, with net.upnp on, asks its home router to map its
    TCP listen port (at most upnp.DISCOVER_S). Given a mapping, it announces the router's
    external address (so it reads public, reason upnp), deletes the mapping when it stops,
    and renews it meanwhile (Network._keep_mapping). One log line either way."""
    if not settings.get("upnp") or settings["announce"] or settings.get("reachability") != "auto":
        return None
    shown = announced_addresses(settings["listen"], [])
    if addresses.decide("auto", [], shown) != "private":
        return None
    ports = [
        int(parts[4])
        for parts in (a.split("/") for a in settings["listen"])
        if len(parts) > 4 and parts[1] == "ip4" and parts[3] == "tcp"
    ]
    if not ports or ports[0] == 0:
        log.info(
            "UPnP not tried: the TCP listen port is chosen at start (port 0); give a "
            "fixed one (net.listen) for the router to map",
            listen=settings["listen"],
        )
        return None
    result = await upnp.open_mapping(ports[0])
    if isinstance(result, str):
        log.info("UPnP: no port mapping, this node stays private", reason=result)
        return None
    log.info(
        "UPnP: the router maps a TCP port to this node, which is public at its address",
        addr=result.addr,
        to=f"{result.lan_ip}:{result.port}",
        lease_s=upnp.LEASE_S,
    )
    settings["announce"] = [result.addr]
    _AT_EXIT.append(lambda: upnp.delete_now(result))
    # The parent stops this process with SIGUSR1 (main): delete the mapping first.
    signal.signal(signal.SIGUSR1, lambda *_: _exit(0))
    return result


_AT_EXIT: list[Any] = []  # bounded cleanups before this process exits (a UPnP mapping's)


def _run_at_exit() -> None:
    """The cleanups in _AT_EXIT, once (each bounded by itself)."""
    while _AT_EXIT:
        with contextlib.suppress(Exception):
            _AT_EXIT.pop()()


def _exit(code: int) -> None:
    """Exit now, after the cleanups in _AT_EXIT."""
    _run_at_exit()
    os._exit(code)


def _watch_parent(parent_pid: int) -> None:
    """Exit as soon as the parent is gone, even while the event loop is busy (a publish
    waiting out backpressure reads no command, and so no end of stdin, for 10 s)."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    _exit(0)


def main() -> None:
    # Frames own stdout; anything printed by a library goes to stderr instead.
    out_fd = os.dup(1)
    os.dup2(2, 1)
    # The parent decides when to stop: a SIGINT or SIGTERM sent to the whole process
    # group reaches this process too, and dying of it made the node restart its network
    # while stopping. The parent stops it with SIGUSR1 (its default action ends it; with
    # a UPnP mapping, _map_port's handler deletes the mapping first).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    # py-libp2p logs routine events (a failed dial, a stream refused by a busy peer) as
    # errors, several lines each. What matters is logged here in our own words (bad
    # frames, bans, restarts); SAPO_LIBP2P_LOG=DEBUG shows the library's own logs.
    level = os.environ.get("SAPO_LIBP2P_LOG", "CRITICAL").upper()
    for name in ("libp2p", "multiaddr", "zeroconf", "aioquic", "async_service"):
        logging.getLogger(name).setLevel(level)
    code = trio.run(_main, 0, out_fd)
    _run_at_exit()  # a fatal error after a mapping
    sys.exit(code)


if __name__ == "__main__":
    main()
