"""The node's process from start to stop, once ``sapo-node start`` has its config.

``run`` logs the resolved config (and a warning when its tasks are not its swarm file's),
turns SIGINT and SIGTERM into a stop event (a second signal aborts without saving), then
runs a relay or a node:

- a node: its data directory locked and its ports checked (before anything heavy is
  imported, so a second node on the directory or a busy port is refused at once), the
  status endpoint bound, the libp2p transport started in a thread while the ``Node`` is
  built (``TransportInBackground``: the node is in the swarm, and keeps what peers send,
  while its model loads), then rounds until the stop event or the configured total; endpoint,
  node and transport are closed in ``finally``;
- a relay (``--no-train`` alone): the data directory locked, the transport started, and
  a line of its traffic logged every 10 s until stopped.

A failure the user can act on raises ``NodeFailed`` (one line; ``cli`` exits 1), an
unusable listen address ``ConfigError`` (``cli`` exits 2). The data directory's lock
itself is ``datadir.lock_data_dir``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import structlog

from sapo_node import __version__
from sapo_node.config import DEFAULT_STATUS_LISTEN, Config, ConfigError
from sapo_node.swarmfile import ignored_warning, scoring_warning, tasks_warning

log = structlog.get_logger(__name__)


class NodeFailed(RuntimeError):
    """The node cannot start, or stopped on a failure; the message says why in one line."""


def run(cfg: Config, *, relay: bool = False) -> None:
    """Run a node of ``cfg`` (``relay``: a relay, no model) until it is stopped."""
    log.info("config", **json.loads(cfg.model_dump_json()))
    if cfg.net.enabled:
        for line in (ignored_warning(cfg), scoring_warning(cfg), tasks_warning(cfg)):
            if line:
                log.warning(line)
    stop = threading.Event()
    on_signals(stop)
    if relay:
        run_relay(cfg, stop)
    else:
        run_node(cfg, stop)


def on_signals(stop: threading.Event) -> None:
    """SIGINT and SIGTERM set ``stop``; a second one exits at once (128 + its number)."""

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():  # a second signal: abort without saving
            raise SystemExit(128 + signum)
        stop.set()
        log.warning(
            "stopping: finishing cleanly (signal again to abort)",
            signal=signal.Signals(signum).name,
        )

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


MMAP_THRESHOLD = 128 << 10  # glibc's initial value, kept


def fix_mmap_threshold() -> bool:
    """For this whole process (every node in it): glibc allocations of 128 KiB and more
    get their own mapping, given back on free.

    By default glibc raises this threshold (up to 32 MiB) each time such a block is freed,
    after which tensors of up to 32 MiB come from the heap. A round allocates and frees
    tensors of changing sizes among long-lived ones (gradients, the optimiser's state,
    oneDNN's kernels); in the heap their freed space is kept but rarely fits the next
    round's tensors, and the resident size rose round after round (even with a 1 MiB
    threshold the free heap kept growing over training steps; docs/benchmarks.md).
    Fixing the threshold at its initial value stops the adjustment. glibc's own
    ``MALLOC_MMAP_THRESHOLD_`` variable, if set, wins. Elsewhere (musl, macOS) nothing is
    done. It is a setting of the process, not of a node, so the programs that run nodes
    call it (``run_node``; the experiment runner and the scripts, once for all their
    nodes) and it says so in the log. True if it was set.
    """
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        log.info(
            "allocator: glibc mmap threshold left to the environment",
            MALLOC_MMAP_THRESHOLD_=os.environ["MALLOC_MMAP_THRESHOLD_"],
        )
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3  # malloc.h
    if mallopt(m_mmap_threshold, MMAP_THRESHOLD) != 1:
        log.debug("mallopt refused", threshold=MMAP_THRESHOLD)
        return False
    log.info("allocator: glibc mmap threshold fixed for this process", bytes=MMAP_THRESHOLD)
    return True


# oneDNN, which runs torch's bfloat16 matrix products on CPUs, keeps a compiled primitive
# per shape, up to 1024 by default, and ideep (torch's layer over it) keeps its own
# computation per shape, also up to 1024. A node's shapes change every round (lengths,
# rows dropped at EOS), so its memory rose round after round; 16 of each keep a step's
# shapes (docs/benchmarks.md, "CPU paths").
KERNEL_CACHE_CAPS = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16", "LRU_CACHE_CAPACITY": "16"}


def cap_kernel_caches() -> dict[str, str]:
    """For this whole process: oneDNN's and ideep's per-shape caches capped
    (``KERNEL_CACHE_CAPS``), each only where the environment does not set it; logged.
    Returns the values that hold.

    Both libraries read their variable once, at their first product in the process (set
    after ``import torch`` but before any product, the cap holds; set after one, it does
    not: docs/benchmarks.md has the measurement and its torch version), so the programs
    that run nodes call this first, before a model computes (``run_node``; the
    experiment runner and the scripts, once for all their nodes). Importing
    ``sapo_node`` changes nothing.
    """
    ours = {k: v for k, v in KERNEL_CACHE_CAPS.items() if k not in os.environ}
    os.environ.update(ours)
    held = {k: os.environ[k] for k in KERNEL_CACHE_CAPS}
    log.info(
        "kernel caches: oneDNN and ideep per-shape caches capped for this process",
        set_here=sorted(ours),
        from_environment=sorted(set(held) - set(ours)),
        **held,
    )
    return held


def run_node(cfg: Config, stop: threading.Event) -> None:
    """A training or generating node: rounds until ``stop`` or ``node.rounds``."""
    data_dir = cfg.node.resolved_data_dir()
    # Before anything heavy is imported or loaded: a second node on the data directory,
    # or a busy port, is refused at once.
    lock = hold_data_dir(data_dir)
    try:
        if cfg.net.enabled:
            check_ports(cfg)
        endpoint = status_endpoint(cfg)
    except BaseException:
        lock.close()
        raise
    cap_kernel_caches()  # before the model computes: read at the first product
    fix_mmap_threshold()
    # The network process starts while the model loads: the node joins the swarm and
    # takes in peers' groups meanwhile (its inbox keeps them for the first round).
    opening = TransportInBackground(cfg, data_dir) if cfg.net.enabled else None
    node = None
    try:
        node = _build(cfg, stop, lock)
        if opening is not None:
            node.transport = opening.transport()
    except BaseException:
        if endpoint is not None:  # bound before the build; nobody else would close it
            endpoint.close()
        if opening is not None:
            opening.close()
        if node is not None:
            node.close()
        raise
    from sapo_node.checkpoint import CheckpointError
    from sapo_node.ops.status import Status
    from sapo_node.tasks import RG_VERSION

    log.info(
        "node ready",
        model=cfg.model.name,
        device=str(node.policy.device),
        dtype=str(node.policy.dtype).removeprefix("torch."),
        lora=cfg.model.lora.enabled,
        trains=node.trains,
        data_dir=str(node.data_dir),
        seed=node.seed,
        version=__version__,
        reasoning_gym=RG_VERSION,
    )
    try:
        if endpoint is not None:
            endpoint.serve(Status(cfg, node=node))
        done = node.run()
    except CheckpointError as exc:
        raise NodeFailed(str(exc)) from None
    finally:
        if endpoint is not None:
            endpoint.close()
        node.close()
        if node.transport is not None:
            node.transport.close()
    log.info("stopped", rounds_this_run=done, round=node.round)
    if node.failure:
        raise NodeFailed(node.failure)


def _build(cfg: Config, stop: threading.Event, lock: Any) -> Any:
    """``build_node`` with the data directory's ``lock`` (the node owns it from here on),
    its failures the user can act on as NodeFailed."""
    from sapo_node.build import build_node
    from sapo_node.checkpoint import CheckpointError
    from sapo_node.datadir import DataDirInUse
    from sapo_node.intake.pool import PoolError
    from sapo_node.train.policy import ModelLoadError

    try:
        return build_node(cfg, stop=stop, lock=lock)
    except (ModelLoadError, DataDirInUse, CheckpointError, PoolError) as exc:
        raise NodeFailed(str(exc)) from None


class TransportInBackground:
    """``open_transport`` in a thread, begun now: ``transport()`` waits for it and
    returns it, or raises what it raised; ``close()`` closes it once it is up, whatever
    became of it (a node whose model failed to load leaves no network process behind)."""

    def __init__(self, cfg: Config, data_dir: Path) -> None:
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._open, args=(cfg, data_dir), name="join")
        self._thread.daemon = True
        self._thread.start()

    def _open(self, cfg: Config, data_dir: Path) -> None:
        try:
            self._result = open_transport(cfg, data_dir)
        except BaseException as exc:  # handed to the caller by transport()
            self._error = exc

    def transport(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result

    def close(self) -> None:
        self._thread.join()
        if self._result is not None:
            self._result.close()


def run_relay(cfg: Config, stop: threading.Event) -> None:
    """``start --no-train``: relay and bootstrap the swarm, with no model loaded."""
    data_dir = cfg.node.resolved_data_dir()
    lock = hold_data_dir(data_dir)
    endpoint = transport = None
    try:
        check_ports(cfg)
        endpoint = status_endpoint(cfg)
        transport = open_transport(cfg, data_dir)
        if endpoint is not None:
            from sapo_node.ops.status import Status

            endpoint.serve(Status(cfg, transport=transport))
        while not stop.wait(10.0):
            transport.received()  # a relay forwards; it keeps nothing
            s = transport.stats()
            log.info(
                "relay",
                peers=s.peers,
                received=s.received,
                rejected=s.rejected,
                bytes_in=s.bytes_in,
                bytes_out=s.bytes_out,
                restarts=s.restarts,
            )
    finally:
        if endpoint is not None:
            endpoint.close()
        if transport is not None:
            transport.close()
        lock.close()
    log.info("stopped")


def hold_data_dir(data_dir: Path):
    """``data_dir``, created if need be, locked against a second process; returns the
    lock (close it to release)."""
    from sapo_node.datadir import DataDirInUse, lock_data_dir

    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        return lock_data_dir(data_dir)
    except DataDirInUse as exc:
        raise NodeFailed(str(exc)) from None


def check_ports(cfg: Config) -> None:
    """Every TCP port of ``net.listen`` can be listened on (``net.ports``)."""
    import multiaddr

    from sapo_node.net import NetError
    from sapo_node.net.ports import check_ports_free

    try:
        check_ports_free([multiaddr.Multiaddr(a) for a in cfg.net.listen])
    except NetError as exc:
        raise NodeFailed(str(exc)) from None
    except ValueError as exc:
        raise ConfigError(f"net.listen: {exc}") from None


def status_endpoint(cfg: Config):
    """The status endpoint, its address bound now (None when it is off)."""
    if not cfg.status.enabled:
        return None
    from sapo_node.ops.status import StatusError, StatusServer

    try:
        return StatusServer(
            cfg.status.listen,
            or_free_port=cfg.status.listen == DEFAULT_STATUS_LISTEN,
            allowed_hosts=cfg.status.allowed_hosts,
        )
    except StatusError as exc:
        raise NodeFailed(str(exc)) from None


def open_transport(cfg: Config, data_dir: Path):
    """The libp2p transport, started."""
    from sapo_node.net import NetError
    from sapo_node.net.process import Libp2pTransport

    try:
        transport = Libp2pTransport(cfg.net, cfg.pool, data_dir, json_logs=cfg.node.json_logs)
    except NetError as exc:
        raise NodeFailed(str(exc)) from None
    log.info(
        "swarm joined",
        swarm=cfg.net.swarm,
        peer_id=transport.peer_id,
        addrs=transport.addrs,
        bootstrap=len(cfg.net.bootstrap),
    )
    return transport


def join_swarm(cfg: Config, data_dir: Path, wait_peers: int, wait_s: float) -> Any:
    """A transport that only publishes (``sapo-node share``), once ``wait_peers`` peers
    are in its mesh; NodeFailed after ``wait_s`` seconds without them."""
    check_ports(cfg)
    transport = open_transport(cfg, data_dir)
    deadline = time.monotonic() + wait_s
    while int(transport.child_stats.get("mesh", 0)) < wait_peers:
        if time.monotonic() > deadline:
            transport.close()
            raise NodeFailed(
                f"{int(transport.child_stats.get('mesh', 0))} of {wait_peers} peers of swarm "
                f"{cfg.net.swarm!r} joined within {wait_s:.0f} s; nothing was sent "
                "(pass --bootstrap, or check that a node runs)"
            )
        time.sleep(0.2)
    return transport
