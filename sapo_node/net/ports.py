"""Whether a TCP port can be listened on: the probe that ``start``, the network process
and ``doctor`` share.

py-libp2p binds with SO_REUSEPORT, so a second node on the same port starts without
error and receives nothing (docs/libp2p.md#port-check). So the port is bound here first,
as the host binds it (SO_REUSEADDR, then listen), and released at once.
"""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING

from sapo_node.net import NetError

if TYPE_CHECKING:  # the probe itself needs no libp2p package: doctor runs without one
    import multiaddr


def bind_error(host: str, port: int) -> OSError | None:
    """Why a TCP listener cannot be bound at (``host``, ``port``), or None if it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError as exc:
            return exc
    return None


def check_ports_free(addrs: list[multiaddr.Multiaddr]) -> None:
    """NetError, its message one line for the user, if a TCP port of ``addrs`` is taken
    or cannot be listened on (port 0 and addresses without TCP are skipped)."""
    for addr in addrs:
        try:
            port = int(addr.value_for_protocol("tcp"))
        except Exception:
            continue
        if port == 0:
            continue
        host = (
            addr.value_for_protocol("ip6")
            if "/ip6/" in str(addr)
            else addr.value_for_protocol("ip4")
        )
        exc = bind_error(host, port)
        if exc is None:
            continue
        if exc.errno == errno.EADDRINUSE:
            raise NetError(
                f"port {port} on {host} is in use (another sapo-node?); pass "
                f"--listen /ip4/{host}/tcp/OTHER_PORT or stop the other program"
            )
        raise NetError(f"cannot listen on {addr}: {exc}")
