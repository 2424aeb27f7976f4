"""The options of a node's life among peers: the pool of their groups, the poisoning
defences, the network (swarm, discovery, reachability) and the status endpoint."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from sapo_node.addresses import ip_of, is_mapped_addr, judged
from sapo_node.dialaddr import parse as parse_bootstrap
from sapo_node.dialaddr import parse_nameserver
from sapo_node.options.base import DEFAULT_STATUS_LISTEN, SWARM_NAME, _Section, parse_host_port

# a DNS name as a Host header gives it, lower case, without port or final dot
HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*")


class PoolSection(_Section):
    """Where peers' groups wait, checked and scored, until a round takes them."""

    sampling: Literal["paper", "uniform", "balanced", "teaching"] = Field(
        "paper",
        description="paper: drop groups whose completions all scored the same, then uniform; "
        "uniform: any group; balanced: groups with signal, spread across authors and "
        "families, mixed rewards favoured; teaching: groups with signal, spread across "
        "authors, weighted by reward variance times this node's own recent failure rate "
        "on the family (sapo_node/intake/sampling.py; measured against paper: no gain, "
        "docs/results/teaching-cpu/).",
    )
    max_groups: int = Field(4096, ge=1, le=10_000_000, description="Most groups held.")
    max_mb: int = Field(256, ge=1, le=1_000_000, description="Most MiB of messages held.")
    max_per_author: int = Field(
        512, ge=1, le=10_000_000, description="Most groups held from one peer (its oldest go)."
    )
    rate_per_author: float = Field(
        2.0, gt=0.0, le=1e6, description="Groups per second a peer may send, sustained."
    )
    burst_per_author: int = Field(
        64, ge=1, le=1_000_000, description="Groups a peer may send at once before the rate."
    )
    max_age_s: float = Field(
        300.0,
        gt=0.0,
        le=30 * 86400.0,
        description="Groups older than this (from their creation) are refused and expire: "
        "rounds train on what peers made lately, not on what their policies were long ago.",
    )
    max_clock_skew_s: float = Field(
        300.0, ge=0.0, le=86400.0, description="How far in the future a group's time may be."
    )
    accept_unregenerable: bool = Field(
        False,
        description="Score groups of custom families that this node cannot regenerate "
        "against the answer the sender attached (trusts the sender's answer).",
    )


class DefenceSection(_Section):
    """Checks of peers' completions against poisoning (sapo_node/intake/defence.py): right answers
    that carry extra text. Only completions with a positive advantage are checked."""

    enabled: bool = Field(True, description="Run the checks below (false: none of them).")
    max_outside_answer_chars: int = Field(
        64,
        ge=0,
        le=1_000_000,
        description="Most characters (spaces aside) outside the answer tags; for prompts "
        "that ask for a direct answer, as the default one does (0: no bound).",
    )
    outside_answer_scale: float = Field(
        1.5,
        ge=1.0,
        le=1000.0,
        description="The bound is raised to this times the 95% quantile of this node's own "
        "recent right answers' text outside the answer, when that is more.",
    )
    cut_after_answer: bool = Field(
        True,
        description="Train (and score) a peer's completion only up to the end of its last "
        "answer: for prompts that ask for a direct answer, as the default one does.",
    )
    answer_only: bool = Field(
        True,
        description="Train a peer's completion only on its last answer, the answer's tags and "
        "its end of turn; its other text is never taught, whatever it says: for prompts that "
        "ask for a direct answer, as the default one does.",
    )
    teach_first_choices: bool = Field(
        True,
        description="With answer_only, also teach each token of a checked peer completion's "
        "other text that is this node's own first choice there, given the text before it "
        "(rank 0 under its policy, float32 logits): "
        "a peer's reasoning, as far as this node would write it itself (measured: "
        "docs/results/families-confirm-cpu/). Nothing to widen with answer_only off.",
    )
    context_rank: int = Field(
        3,
        ge=0,
        le=1_000_000,
        description="With answer_only, a peer's right completion teaches only if every token "
        "of its text before the answer is among this node's context_rank + 1 first choices "
        "there (text it could write itself), and its group's wrong ones only as far as its "
        "right ones teach: no peer can push this node only away from what it writes "
        "(docs/security.md, shaped groups).",
    )
    rank_check: bool = Field(
        True, description="Refuse completions holding text this node's own policy would not write."
    )
    rank_window: int = Field(4, ge=1, le=4096, description="Tokens per window.")
    max_rank_bits: float = Field(
        6.0,
        ge=0.0,
        le=64.0,
        description="Highest mean log2(1 + rank) of a window's tokens under this node's policy "
        "(6: tokens about 63rd likeliest, geometric mean).",
    )
    reference_size: int = Field(
        512,
        ge=8,
        le=1_000_000,
        description="Own right answers whose text outside the answer is kept.",
    )
    max_author_share: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Most of a round's external groups from one peer (at least one group).",
    )
    reputation_window: int = Field(
        256, ge=1, le=1_000_000, description="A peer's last checked completions kept."
    )
    reputation_min_checked: int = Field(
        64, ge=1, le=1_000_000, description="Checked completions before a peer is judged."
    )
    reputation_max_refused: float = Field(
        0.25, ge=0.0, le=1.0, description="Share refused above which a peer is distrusted."
    )
    distrust_s: float = Field(
        3600.0, ge=0.0, le=30 * 86400.0, description="Seconds a distrusted peer is ignored."
    )

    @model_validator(mode="after")
    def _first_choices(self) -> DefenceSection:
        # Said only when set by hand: by default it widens answer_only, and with
        # answer_only off (every token teaches) there is nothing left to widen.
        set_here = "teach_first_choices" in self.model_fields_set
        if self.teach_first_choices and not self.answer_only and set_here:
            raise ValueError(
                "defence.teach_first_choices widens what answer_only teaches, and "
                "defence.answer_only is off (every token of a peer's completion teaches): "
                "turn answer_only on, or teach_first_choices off"
            )
        return self


class NetSection(_Section):
    """The swarm: libp2p host, GossipSub topic, discovery. See README "Swarm"."""

    enabled: bool = Field(
        True, description="Join a swarm; false trains alone (no network process at all)."
    )
    swarm: str = Field(
        "sapo-public",
        pattern=SWARM_NAME,
        description="Swarm name; its topic is sapo/<swarm>/rollouts/v2 (protocol/SPEC.md).",
    )
    swarm_file: Path | None = Field(
        None,
        description="A swarm file (TOML) its organiser publishes: the swarm's name, "
        "bootstrap addresses (joined before these ones), tasks and recommended config, laid "
        "under this config; a relative path is relative to the working directory.",
    )
    allow_swarm_code: bool = Field(
        False,
        description="Let the swarm file's [tasks] name custom families (module:attr), which "
        "this node imports and runs as Python code: only for a file whose source you trust "
        "(--allow-swarm-code; a swarm file cannot set it). false: such a file is refused.",
    )
    allow_swarm_scoring: bool = Field(
        False,
        description="Let the swarm file's [tasks] set how this node is asked and what it "
        "counts as right (system_prompt, one_shot, reward, correct_threshold), which its "
        "poisoning defences rely on (--allow-swarm-scoring; a swarm file cannot set it). "
        "false: the file gives only the task families; these four are this node's own.",
    )
    listen: list[str] = Field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/4141"],
        description="Multiaddrs to listen on (TCP); port 0 picks a free port.",
    )
    announce: list[str] = Field(
        default_factory=list,
        description="Multiaddrs to give peers instead of the listen ones (e.g. a public "
        "address behind NAT); empty: the listen addresses, 0.0.0.0 replaced by this "
        "machine's interface addresses.",
    )
    bootstrap: list[str] = Field(
        default_factory=list,
        description="Peers to dial at start and re-dial while disconnected, as "
        "/ip4/A.B.C.D/tcp/PORT/p2p/PEER_ID, /dns4/NAME/tcp/PORT/p2p/PEER_ID, or "
        "/dnsaddr/NAME: the TXT records of _dnsaddr.NAME, as IPFS resolves them.",
    )
    nameservers: list[str] = Field(
        default_factory=list,
        description="DNS servers (IP or IP:PORT) that resolve bootstrap names; empty: the "
        "system's (/etc/resolv.conf).",
    )
    mdns: bool = Field(True, description="Find peers on the local network with mDNS.")
    dht: bool = Field(
        True, description="Kademlia DHT: announce this node and find the swarm's other nodes."
    )
    reachability: Literal["auto", "public", "private"] = Field(
        "auto",
        description="Whether peers elsewhere can dial this node. auto: public with "
        "announce addresses or an address outside the LAN ranges, private behind NAT (DHT "
        "client, announces nothing, shows no LAN address to peers outside the LAN).",
    )
    lan_ranges: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Address ranges (CIDR, e.g. 198.19.0.0/16) counted as LAN besides the "
        "built-in ones (RFC 1918, 100.64/10, link-local, loopback and their IPv6 kin): for a "
        "network numbered out of other space that no router forwards. A node whose "
        "addresses are all LAN ones is private (auto), and LAN addresses are never handed "
        "to peers elsewhere.",
    )
    autonat: bool = Field(
        True,
        description="AutoNAT: a public node dials back peers that ask whether they are "
        "reachable; a node public by its address or a UPnP mapping asks peers to dial it "
        "back and turns private when a majority of the networks asked (a /24, a /48 each), "
        "at least two, cannot, or the only one cannot and no peer dials in for 2 minutes; "
        "private so, it asks again every 10 minutes; one given announce addresses only "
        "logs it. Off: neither.",
    )
    upnp: bool = Field(
        True,
        description="A node that would be private asks its home router (UPnP IGD) to map "
        "its TCP listen port, for at most 2 s at start; given a mapping, it announces the "
        "router's external address and is public (reason upnp). Off: it never asks.",
    )
    relay_reservations: int = Field(
        128,
        ge=0,
        le=100_000,
        description="A public node serves circuit relay v2 to this many private peers at "
        "once (0: it relays for nobody); private nodes reserve on 2 such relays and are "
        "dialled through them.",
    )
    relay_circuits: int = Field(
        16, ge=1, le=10_000, description="Relayed connections a public node carries at once."
    )
    relay_circuit_mb: int = Field(
        128,
        ge=1,
        le=1_000_000,
        description="MiB one relayed connection may carry (then it "
        "is closed and dialled again); each lasts at most an hour.",
    )
    publish: Literal["all", "signal", "none"] = Field(
        "all",
        description="Groups to share each round: all, only those whose rewards differ "
        "(signal), or none (receive only).",
    )
    redial_s: float = Field(
        10.0, ge=0.2, le=3600.0, description="Seconds between discovery and re-dial passes."
    )
    max_peers: int = Field(
        32, ge=1, le=1000, description="Stop dialling discovered peers above this many."
    )
    max_connections: int = Field(
        300,
        ge=2,
        le=100_000,
        description="Connections held at once, dialled and accepted (py-libp2p's default); "
        "those accepted take at most max_connections - max_peers of them, so that the "
        "node can always dial its peers (docs/libp2p.md#connection-limits). At least "
        "max_peers + the larger of max_peers (as many peers may dial in as it dials) and "
        "relay_reservations (each private peer it relays for holds a connection).",
    )
    max_inbound_per_ip: int = Field(
        32,
        ge=1,
        le=100_000,
        description="Connections dialled to this node from one IP address, held at once "
        "(an IPv6 address that embeds an IPv4 one counts as that IPv4 address): one host "
        "with many identities takes no more of the inbound slots; past it, the host's "
        "next connection is refused. Peers on one machine share its address (a local "
        "swarm on loopback: 127.0.0.1), so raise it for a local swarm larger than this.",
    )
    max_inbound_per_net: int = Field(
        64,
        ge=1,
        le=100_000,
        description="Connections dialled to this node from one /24 (IPv4) or /48 (IPv6) "
        "network, held at once: one operator's block of addresses takes no more of the "
        "inbound slots. When every slot is taken, a newcomer from another network takes "
        "the slot of a peer that gives nothing (in none of this node's meshes, no message "
        "delivered first) and has been connected a minute.",
    )
    mesh_degree: int = Field(6, ge=1, le=50, description="GossipSub mesh degree D.")
    shards: int = Field(
        1,
        ge=1,
        le=4096,
        description="S: the swarm's shard topics, which bound each node's load in a large "
        "swarm (docs/scale.md); a swarm setting, from its swarm file ([swarm] shards). 1: "
        "the single topic sapo/<swarm>/rollouts/v2, as before shards.",
    )
    shards_before: int = Field(
        0,
        ge=0,
        le=4096,
        description="A swarm changing its shard count: S before the change (0: none; from "
        "the swarm file's [swarm] shards_before). The node also joins its shards of the old "
        "count and publishes each group on one of them as well, so that nodes still on the "
        "old file and nodes on the new one exchange groups until all have restarted.",
    )
    shards_joined: int = Field(
        2,
        ge=1,
        le=64,
        description="k: shard topics this node joins (all of them if S is less), chosen "
        "from its peer ID; it receives about k/S of the swarm's groups and publishes on its "
        "shards in turn.",
    )
    inbox_per_peer: int = Field(
        64, ge=1, le=100_000, description="Received groups held per peer between rounds."
    )
    inbox_total: int = Field(
        4096, ge=1, le=1_000_000, description="Received groups held between rounds."
    )

    @field_validator("nameservers")
    @classmethod
    def _nameservers(cls, value: list[str]) -> list[str]:
        for text in value:
            parse_nameserver(text)
        return value

    @field_validator("lan_ranges")
    @classmethod
    def _lan_ranges(cls, value: list[str]) -> list[str]:
        for text in value:
            try:
                ipaddress.ip_network(text)
            except ValueError as exc:
                raise ValueError(
                    f"net.lan_ranges: {text!r} is not a network such as 198.19.0.0/16 ({exc})"
                ) from None
        return value

    @model_validator(mode="after")
    def _addresses(self) -> NetSection:
        for field_name in ("listen", "announce", "bootstrap"):
            for addr in getattr(self, field_name):
                if not addr.startswith("/"):
                    raise ValueError(f"net.{field_name}: {addr!r} is not a multiaddr")
        for addr in self.announce:
            if is_mapped_addr(addr):
                raise ValueError(
                    f"net.announce: {addr!r} is an IPv4-mapped IPv6 address, which a peer "
                    f"dials as IPv4 on its own network: give it as /ip4/{judged(ip_of(addr))}/..."
                )
        for addr in self.bootstrap:  # the grammar of a swarm file's bootstrap too
            try:
                parse_bootstrap(addr)
            except ValueError as exc:
                hint = " (sapo-node identity prints a node's)" if "lacks /p2p/" in str(exc) else ""
                raise ValueError(f"net.bootstrap: {exc}{hint}") from None
        if self.enabled and not self.listen:
            raise ValueError("net.listen is empty; give at least one address or disable net")
        if self.shards_before == self.shards:
            raise ValueError(f"net.shards_before is net.shards ({self.shards}): set it to 0")
        if self.max_inbound_per_net < self.max_inbound_per_ip:
            raise ValueError(
                f"net.max_inbound_per_net ({self.max_inbound_per_net}) is less than "
                f"net.max_inbound_per_ip ({self.max_inbound_per_ip}): an IP lies in its "
                "network, so the network's share bounds it too; raise max_inbound_per_net"
            )
        least = self.max_peers + max(self.max_peers, self.relay_reservations)
        if self.max_connections < least:
            raise ValueError(
                f"net.max_connections ({self.max_connections}) is less than net.max_peers + "
                f"the larger of net.max_peers and net.relay_reservations ({least}): room for "
                "the peers it dials, as many dialling in and the private peers it relays "
                "for; raise it, or lower net.relay_reservations (0 relays for nobody)"
            )
        return self


class StatusSection(_Section):
    """The status endpoint: /metrics (Prometheus), /status (JSON), /healthz. See README
    "Status endpoint"."""

    enabled: bool = Field(True, description="Serve the status endpoint.")
    listen: str = Field(
        DEFAULT_STATUS_LISTEN,
        description="HOST:PORT to serve on, never the swarm port; port 0 picks a free one "
        "(sapo-node status finds it), and so does the default when another node holds it; "
        "0.0.0.0 serves every interface.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Host names, besides localhost and IP addresses, whose requests the "
        "endpoint answers (a Prometheus that scrapes it by a container's name, say), "
        "whatever address it listens on; any other Host header is refused (403), so that "
        "a web page cannot read the endpoint through a DNS name rebound to it.",
    )
    stall_factor: float = Field(
        10.0,
        ge=1.0,
        le=1000.0,
        description="/healthz fails when no phase of the round loop has finished for this "
        "many times the median of the last 10 rounds' durations...",
    )
    stall_min_s: float = Field(
        600.0,
        gt=0.0,
        le=30 * 86400.0,
        description="... and never sooner than this many seconds (also the allowance for "
        "the first round).",
    )
    net_stall_s: float = Field(
        30.0,
        gt=0.0,
        le=86400.0,
        description="/healthz fails when the network process (it reports every second) "
        "has been silent this long: dead and not restarted, or stuck.",
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        parse_host_port(value)
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _allowed_hosts(cls, value: list[str]) -> list[str]:
        names = [name.strip().lower().rstrip(".") for name in value]
        for name, given in zip(names, value, strict=True):
            if not HOST_NAME.fullmatch(name):
                raise ValueError(
                    f"{given!r} is not a host name (letters, digits, '-' and '.'; no port, "
                    "no scheme, no wildcard)"
                )
        return names
