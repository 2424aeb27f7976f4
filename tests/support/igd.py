"""A minimal but real UPnP Internet Gateway Device (IGD v1), for the namespace tests: run in
a home router's network namespace, it answers SSDP searches on the LAN, serves its
description, and maps ports with nftables DNAT rules, so that a node's miniupnpc (the C
library ``sapo_node/net/upnp.py`` calls) finds, asks and is forwarded to, for real.

    python -m tests.support.igd --lan-ip 198.19.1.1 --wan-ip 198.18.1.2

Why not miniupnpd: Debian's (2.3.1) maps nothing for a router whose WAN address is
reserved, 198.18.0.0/15 included, and has no option to allow one; the namespace tests
may use only 198.18.0.0/15 as their internet.

What it does, as a home router's IGD does:

- SSDP: joins 239.255.255.250 on the LAN interface (UDP 1900) and answers each M-SEARCH
  for the IGD, its WANIPConnection service, ``upnp:rootdevice`` or ``ssdp:all`` with a
  unicast reply whose LOCATION is its description;
- HTTP (on the LAN address): the root description (InternetGatewayDevice:1 > WANDevice:1
  with WANCommonInterfaceConfig:1 > WANConnectionDevice:1 with WANIPConnection:1), and
  the SOAP actions miniupnpc calls: GetStatusInfo (Connected) and GetExternalIPAddress
  (while it selects the IGD), AddPortMapping, DeletePortMapping,
  GetSpecificPortMappingEntry, GetCommonLinkProperties;
- each mapping is an nftables rule ``iifname WAN tcp dport P dnat to CLIENT:Q`` in the
  router's ``ip nat pre`` chain (``tests/support/nat_swarm.nat`` makes it), with its
  lease: deleted when the lease ends, on DeletePortMapping, or when this process ends.
  As a home router's secure mode does, a client may map only to itself (error 606; 718
  for a port another client holds).

miniupnpc's IGD selection calls an IGD whose external address is reserved (198.18/15)
"connected, with a reserved IP" and selects it all the same: the node judges the
address itself (``addresses.is_lan``).

It prints ``ready <description URL>`` once it listens; it ends by itself after
``--max-s``, on SIGTERM/SIGINT, or (``--die-with-parent``) when its parent does.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from xml.etree import ElementTree
from xml.sax.saxutils import escape

SSDP_GROUP = "239.255.255.250"
SSDP_PORT = 1900
UUID = "5a905a90-0000-4000-8000-000000000030"
IGD = "urn:schemas-upnp-org:device:InternetGatewayDevice:1"
WAN_DEVICE = "urn:schemas-upnp-org:device:WANDevice:1"
WAN_CONN_DEVICE = "urn:schemas-upnp-org:device:WANConnectionDevice:1"
CIF = "urn:schemas-upnp-org:service:WANCommonInterfaceConfig:1"
IPCONN = "urn:schemas-upnp-org:service:WANIPConnection:1"
SERVER = "Linux UPnP/1.1 sapo-test-igd/1"
SEARCHED = {IGD, WAN_DEVICE, WAN_CONN_DEVICE, IPCONN, CIF, "upnp:rootdevice"}
NFT_CHAIN = ("ip", "nat", "pre")


def description() -> str:
    def service(kind: str, name: str) -> str:
        return (
            f"<service><serviceType>{kind}</serviceType>"
            f"<serviceId>urn:upnp-org:serviceId:{name}</serviceId>"
            f"<SCPDURL>/{name}.xml</SCPDURL><controlURL>/ctl/{name}</controlURL>"
            f"<eventSubURL>/evt/{name}</eventSubURL></service>"
        )

    def device(kind: str, n: int, services: str, inner: str = "") -> str:
        sub = f"<deviceList>{inner}</deviceList>" if inner else ""
        return (
            f"<device><deviceType>{kind}</deviceType><friendlyName>sapo test IGD</friendlyName>"
            "<manufacturer>sapo-node tests</manufacturer><modelName>igd.py</modelName>"
            f"<UDN>uuid:{UUID[:-1]}{n}</UDN><serviceList>{services}</serviceList>{sub}</device>"
        )

    conn = device(WAN_CONN_DEVICE, 2, service(IPCONN, "WANIPConn1"))
    wan = device(WAN_DEVICE, 1, service(CIF, "WANCommonIFC1"), conn)
    root = device(IGD, 0, "", wan)
    return (
        '<?xml version="1.0"?>\r\n<root xmlns="urn:schemas-upnp-org:device-1-0">'
        f"<specVersion><major>1</major><minor>0</minor></specVersion>{root}</root>\r\n"
    )


class UpnpError(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code, self.text = code, text


class Mappings:
    """The port mappings, each an nftables DNAT rule, with their leases."""

    def __init__(self, wan_if: str, log) -> None:
        self.wan_if = wan_if
        self.log = log
        self.lock = threading.Lock()
        # (protocol, external port) -> [client, internal port, description, expiry or 0]
        self.table: dict[tuple[str, int], list] = {}

    def _comment(self, proto: str, port: int) -> str:
        return f"upnp {proto} {port}"

    def _nft(self, *args: str) -> str:
        proc = subprocess.run(["nft", *args], capture_output=True, text=True, timeout=10)
        if proc.returncode != 0:
            raise RuntimeError(f"nft {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def _add_rule(self, proto: str, port: int, client: str, internal: int) -> None:
        rule = (
            f'iifname "{self.wan_if}" {proto} dport {port} dnat to {client}:{internal} '
            f'comment "{self._comment(proto, port)}"'
        )
        self._nft("add", "rule", *NFT_CHAIN, rule)

    def _delete_rule(self, proto: str, port: int) -> None:
        listing = self._nft("-a", "list", "chain", *NFT_CHAIN)
        tag = f'comment "{self._comment(proto, port)}"'
        for line in listing.splitlines():
            if tag in line and "# handle " in line:
                handle = line.rsplit("# handle ", 1)[1].strip()
                self._nft("delete", "rule", *NFT_CHAIN, "handle", handle)

    def add(self, proto: str, port: int, client: str, internal: int, desc: str, lease: int):
        expiry = time.monotonic() + lease if lease > 0 else 0.0
        with self.lock:
            held = self.table.get((proto, port))
            if held is not None and held[0] != client:
                raise UpnpError(718, "ConflictInMappingEntry")
            if held is not None and held[1] != internal:
                self._delete_rule(proto, port)
                held = None
            if held is None:
                self._add_rule(proto, port, client, internal)
            self.table[(proto, port)] = [client, internal, desc, expiry]
        self.log(f"mapped {proto} {port} -> {client}:{internal} lease {lease} s")

    def delete(self, proto: str, port: int, client: str | None) -> None:
        with self.lock:
            held = self.table.get((proto, port))
            if held is None:
                raise UpnpError(714, "NoSuchEntryInArray")
            if client is not None and held[0] != client:
                raise UpnpError(606, "Action not authorized")
            self._delete_rule(proto, port)
            del self.table[(proto, port)]
        self.log(f"deleted {proto} {port}")

    def get(self, proto: str, port: int) -> list:
        with self.lock:
            held = self.table.get((proto, port))
        if held is None:
            raise UpnpError(714, "NoSuchEntryInArray")
        return held

    def expire(self) -> None:
        now = time.monotonic()
        with self.lock:
            ended = [k for k, v in self.table.items() if v[3] and v[3] <= now]
        for proto, port in ended:
            with contextlib.suppress(UpnpError, RuntimeError):
                self.delete(proto, port, None)
                self.log(f"lease ended: {proto} {port}")

    def clear(self) -> None:
        for proto, port in list(self.table):
            with contextlib.suppress(UpnpError, RuntimeError):
                self.delete(proto, port, None)


def soap_args(body: bytes) -> tuple[str, dict[str, str]]:
    """The action's name and its arguments, from a SOAP request body."""
    root = ElementTree.fromstring(body)
    for element in root.iter():
        if element.tag.endswith("}Body"):
            action = element[0]
            name = action.tag.rsplit("}", 1)[-1]
            return name, {child.tag.rsplit("}", 1)[-1]: (child.text or "") for child in action}
    raise ValueError("no SOAP Body")


def soap_reply(service: str, action: str, values: dict[str, object]) -> bytes:
    out = "".join(f"<{k}>{escape(str(v))}</{k}>" for k, v in values.items())
    return (
        '<?xml version="1.0"?>\r\n'
        '<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/" '
        's:encodingStyle="http://schemas.xmlsoap.org/soap/encoding/"><s:Body>'
        f'<u:{action}Response xmlns:u="{service}">{out}</u:{action}Response>'
        "</s:Body></s:Envelope>\r\n"
    ).encode()


def soap_fault(error: UpnpError) -> bytes:
    return (
        '<?xml version="1.0"?>\r\n'
        '<s:Envelope xmlns:s="http://schemas.xmlsoap.org/soap/envelope/" '
        's:encodingStyle="http://schemas.xmlsoap.org/soap/encoding/"><s:Body><s:Fault>'
        "<faultcode>s:Client</faultcode><faultstring>UPnPError</faultstring><detail>"
        '<UPnPError xmlns="urn:schemas-upnp-org:control-1-0">'
        f"<errorCode>{error.code}</errorCode><errorDescription>{escape(error.text)}"
        "</errorDescription></UPnPError></detail></s:Fault></s:Body></s:Envelope>\r\n"
    ).encode()


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        """Without HTTPServer's reverse lookup of its own address (``getfqdn``: a DNS query
        that waits out its timeouts where no resolver can be reached)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class Igd:
    def __init__(self, lan_ip: str, wan_ip: str, wan_if: str, http_port: int) -> None:
        self.lan_ip, self.wan_ip = lan_ip, wan_ip
        self.started = time.monotonic()
        self.mappings = Mappings(wan_if, self.log)
        self.stop = threading.Event()
        self.http = HttpServer((lan_ip, http_port), self._handler())
        self.location = f"http://{lan_ip}:{self.http.server_address[1]}/rootDesc.xml"
        self.ssdp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        self.ssdp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ssdp.bind(("", SSDP_PORT))
        group = struct.pack("4s4s", socket.inet_aton(SSDP_GROUP), socket.inet_aton(lan_ip))
        self.ssdp.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, group)
        self.ssdp.settimeout(0.5)

    @staticmethod
    def log(line: str) -> None:
        print(line, flush=True)

    # SSDP ---------------------------------------------------------------------------

    def serve_ssdp(self) -> None:
        while not self.stop.is_set():
            try:
                data, peer = self.ssdp.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            lines = data.decode("latin-1").split("\r\n")
            if not lines[0].upper().startswith("M-SEARCH"):
                continue
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            st = headers.get("st", "")
            if st == "ssdp:all":
                targets = sorted(SEARCHED)
            elif st in SEARCHED:
                targets = [st]
            else:
                continue
            for target in targets:
                usn = f"uuid:{UUID}::{target}"
                reply = (
                    "HTTP/1.1 200 OK\r\nCACHE-CONTROL: max-age=120\r\nEXT:\r\n"
                    f"LOCATION: {self.location}\r\nSERVER: {SERVER}\r\nST: {target}\r\n"
                    f"USN: {usn}\r\n\r\n"
                )
                self.ssdp.sendto(reply.encode(), peer)
            self.log(f"ssdp {peer[0]}:{peer[1]} {st}")

    # HTTP and SOAP --------------------------------------------------------------------

    def control(self, client: str, action: str, args: dict[str, str]) -> dict[str, object]:
        """One WANIPConnection / WANCommonInterfaceConfig action: its output arguments."""
        if action == "GetStatusInfo":
            uptime = int(time.monotonic() - self.started)
            return {
                "NewConnectionStatus": "Connected",
                "NewLastConnectionError": "ERROR_NONE",
                "NewUptime": uptime,
            }
        if action == "GetExternalIPAddress":
            return {"NewExternalIPAddress": self.wan_ip}
        if action == "GetCommonLinkProperties":
            return {
                "NewWANAccessType": "Ethernet",
                "NewLayer1UpstreamMaxBitRate": 1000000000,
                "NewLayer1DownstreamMaxBitRate": 1000000000,
                "NewPhysicalLinkStatus": "Up",
            }
        if action == "GetConnectionTypeInfo":
            return {"NewConnectionType": "IP_Routed", "NewPossibleConnectionTypes": "IP_Routed"}
        if action in ("AddPortMapping", "DeletePortMapping", "GetSpecificPortMappingEntry"):
            proto = args.get("NewProtocol", "").lower()
            try:
                port = int(args.get("NewExternalPort", ""))
            except ValueError:
                raise UpnpError(402, "Invalid Args") from None
            if proto not in ("tcp", "udp") or not 0 < port < 65536:
                raise UpnpError(402, "Invalid Args")
            if args.get("NewRemoteHost"):
                raise UpnpError(726, "RemoteHostOnlySupportsWildcard")
            if action == "DeletePortMapping":
                self.mappings.delete(proto, port, client)
                return {}
            if action == "GetSpecificPortMappingEntry":
                held_client, internal, desc, expiry = self.mappings.get(proto, port)
                left = max(0, int(expiry - time.monotonic())) if expiry else 0
                return {
                    "NewInternalPort": internal,
                    "NewInternalClient": held_client,
                    "NewEnabled": 1,
                    "NewPortMappingDescription": desc,
                    "NewLeaseDuration": left,
                }
            inner = args.get("NewInternalClient", "")
            if inner != client:
                raise UpnpError(606, "Action not authorized")
            try:
                internal = int(args.get("NewInternalPort", ""))
                lease = int(args.get("NewLeaseDuration", "0") or 0)
            except ValueError:
                raise UpnpError(402, "Invalid Args") from None
            if not 0 < internal < 65536 or lease < 0:
                raise UpnpError(402, "Invalid Args")
            desc = args.get("NewPortMappingDescription", "")
            self.mappings.add(proto, port, inner, internal, desc, lease)
            return {}
        raise UpnpError(401, "Invalid Action")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        igd = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            server_version = SERVER
            sys_version = ""

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

            def send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", 'text/xml; charset="utf-8"')
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            def do_GET(self) -> None:
                if self.path == "/rootDesc.xml":
                    self.send(200, description().encode())
                else:
                    self.send(404, b"")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                soap_action = self.headers.get("SOAPAction", "").strip('"')
                service = soap_action.split("#", 1)[0]
                try:
                    action, args = soap_args(body)
                except (ElementTree.ParseError, ValueError, IndexError):
                    self.send(400, b"")
                    return
                client = self.client_address[0]
                try:
                    out = igd.control(client, action, args)
                except UpnpError as exc:
                    igd.log(f"soap {client} {action} -> error {exc}")
                    self.send(500, soap_fault(exc))
                    return
                except RuntimeError as exc:  # nft failed
                    igd.log(f"soap {client} {action} -> {exc}")
                    self.send(500, soap_fault(UpnpError(501, "ActionFailed")))
                    return
                igd.log(f"soap {client} {action} {args or ''}")
                self.send(200, soap_reply(service or IPCONN, action, out))

        return Handler

    def run(self, max_s: float) -> None:
        threading.Thread(target=self.serve_ssdp, name="ssdp", daemon=True).start()
        threading.Thread(target=self.http.serve_forever, name="http", daemon=True).start()
        self.log(f"ready {self.location}")
        deadline = time.monotonic() + max_s
        try:
            while not self.stop.wait(0.5):
                self.mappings.expire()
                if time.monotonic() > deadline:
                    self.log(f"ending after {max_s:g} s")
                    break
        finally:
            self.stop.set()
            self.http.shutdown()
            self.http.server_close()
            self.ssdp.close()
            self.mappings.clear()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lan-ip", required=True, help="the router's LAN address (SSDP, HTTP)")
    parser.add_argument("--wan-ip", required=True, help="the external address it reports")
    parser.add_argument("--wan-if", default="wan0", help="the interface mappings DNAT on")
    parser.add_argument("--http-port", type=int, default=0)
    parser.add_argument("--max-s", type=float, default=300.0, help="end after this long")
    parser.add_argument("--die-with-parent", action="store_true")
    opts = parser.parse_args()
    if opts.die_with_parent:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    igd = Igd(opts.lan_ip, opts.wan_ip, opts.wan_if, opts.http_port)

    def stop(signum: int, frame: object) -> None:
        igd.stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    igd.run(opts.max_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
