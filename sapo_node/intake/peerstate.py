"""What this node has learned about its peers, kept in its data directory across restarts.

Two files, each written by one owner in the node's own process:

- ``peers-net.json`` (``net/process.py``, for the network process): bans, with when each
  ends, and the invalid-message penalties of peers' scores, with when they were taken
  (they decay as the score's own counters do);
- ``peers-defence.json`` (``defence.py``): the poisoning defences' reputation of each
  peer (its last checked completions, passed or refused) and the peers distrusted, with
  when the distrust ends.

Every time in them is wall-clock seconds (``time.time``), so an entry ends when it would
have had the node run on: a restart neither lifts a ban nor stretches it. Each file is
bounded (its owner keeps at most a fixed number of entries, the nearest ends first to
go) and replaced whole, atomically (written to a temporary name, synced, renamed): a
crash mid-write leaves the previous file, losing at most the last change.

A file that cannot be read as this node's state (not JSON, another ``kind``, another
``version``, wrong types) is refused with one warning line that says the node starts
without that state; it is moved aside (``NAME.unusable-<ns>``) for whoever wants to look.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

VERSION = 1
_SAVING = threading.Lock()  # the round loop and the network's reader thread both save
NET_FILE = "peers-net.json"
DEFENCE_FILE = "peers-defence.json"
MAX_BANNED = 10_000  # bans kept, by the network process and in NET_FILE


class StateError(ValueError):
    """A state file's content is not this node's state."""


def load(path: Path, kind: str) -> dict[str, Any]:
    """The state saved at ``path`` (empty if there is none, or if it is unusable: then
    logged in one line and moved aside)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        _refuse(path, kind, f"cannot read it: {exc}")
        return {}
    try:
        return parse(text, kind)
    except StateError as exc:
        _refuse(path, kind, str(exc))
        return {}


def parse(text: str, kind: str) -> dict[str, Any]:
    """The state in ``text``; StateError if it is not a ``kind`` state of this version."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StateError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise StateError("not a JSON object")
    if data.get("kind") != kind:
        raise StateError(f"kind {data.get('kind')!r}, expected {kind!r}")
    if data.get("version") != VERSION:
        raise StateError(f"version {data.get('version')!r}, this node writes {VERSION}")
    state = data.get("state")
    if not isinstance(state, dict):
        raise StateError("no state object")
    return state


def save(path: Path, kind: str, state: dict[str, Any]) -> bool:
    """Replace ``path`` with ``state``, atomically; False (logged) if it cannot be written
    (a full disk, a read-only mount: the node goes on with its state in memory)."""
    text = json.dumps({"kind": kind, "version": VERSION, "saved": time.time(), "state": state})
    tmp: Path | None = None
    try:
        with _SAVING:  # one at a time, each through a temporary file of its own
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
            tmp = Path(name)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        log.warning("peer state not saved", path=str(path), error=str(exc))
        return False
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    return True


def _refuse(path: Path, kind: str, why: str) -> None:
    aside = path.with_name(f"{path.name}.unusable-{time.time_ns()}")
    try:
        path.rename(aside)
        kept = str(aside)
    except OSError:
        kept = None
    log.warning(
        f"peer state file refused: starting with no saved {kind} state",
        path=str(path),
        reason=why,
        kept=kept,
    )


def deadlines(raw: Any, now: float, limit: int) -> dict[str, float]:
    """``{peer: wall-clock end}`` entries of ``raw`` that have not ended, valid ones only,
    at most ``limit`` (the latest ends kept), nearest end first.

    >>> deadlines({"a": 30.0, "b": 10.0, "c": 5.0, "d": "x", "e": 20.0}, 8.0, 2)
    {'e': 20.0, 'a': 30.0}
    """
    if not isinstance(raw, dict):
        return {}
    good = {
        p: float(t)
        for p, t in raw.items()
        if isinstance(p, str) and isinstance(t, int | float) and not isinstance(t, bool) and t > now
    }
    kept = sorted(good.items(), key=lambda kv: kv[1])[-limit:] if limit > 0 else []
    return dict(kept)


def time_left(ends: dict[str, float], now: float) -> dict[str, float]:
    """Seconds left of each deadline that has not passed, rounded, longest first.

    >>> time_left({"a": 100.0, "b": 50.0, "c": 10.0}, 20.0)
    {'a': 80.0, 'b': 30.0}
    """
    left = {p: round(t - now, 1) for p, t in ends.items() if t > now}
    return dict(sorted(left.items(), key=lambda kv: -kv[1]))


def summary(data_dir: Path, now: float | None = None) -> dict[str, Any]:
    """The peers banned by the network and distrusted by the defences, with seconds left,
    as the files of ``data_dir`` hold them (read only; a running node writes them)."""
    now = time.time() if now is None else now
    out: dict[str, Any] = {"banned": {}, "distrusted": {}}
    for name, kind, key in (
        (NET_FILE, "net", "banned"),
        (DEFENCE_FILE, "defence", "distrusted"),
    ):
        path = data_dir / name
        try:
            state = parse(path.read_text(encoding="utf-8"), kind)
        except FileNotFoundError:
            continue
        except (OSError, StateError) as exc:
            out[f"{key}_unreadable"] = f"{path}: {exc}"
            continue
        ends = deadlines(state.get(key), now, 1 << 30)
        out[key] = {p: {"left_s": s} for p, s in time_left(ends, now).items()}
    return out


class Penalties:
    """Peers' score penalties that outlive their connections and the network process:
    ``peer -> (invalid messages, behaviour penalty, when taken)``, as GossipSub's scorer
    counts them (``net/pubsub.py``). Each decays by ``decay`` a second, as the scorer's own
    counters do each 1 s heartbeat; one decayed below ``floor`` is forgotten; at most
    ``limit`` are kept (the least recently taken go first).

    >>> p = Penalties({"a": [4.0, 0.0, 100.0], "b": "junk"}, now=100.0, decay=0.5)
    >>> p.get("a", 101.0), p.get("b", 101.0)
    ((2.0, 0.0), (0.0, 0.0))
    >>> p.put("a", 2.0, 0.0, 101.0)  # the same penalty, decayed: no change
    False
    >>> p.put("a", 5.0, 0.0, 101.0), p.state(104.0)
    (True, {'a': [5.0, 0.0, 101.0]})
    >>> p.state(110.0)  # 5 / 2**9 < floor
    {}
    """

    def __init__(
        self,
        raw: Any,
        now: float,
        *,
        decay: float = 0.999,
        floor: float = 0.1,
        limit: int = 10_000,
    ) -> None:
        self.decay, self.floor, self.limit = decay, floor, limit
        self._held: dict[str, tuple[float, float, float]] = {}
        self.version = 0  # grows with each change a caller would want to save
        entries = []
        for peer, entry in raw.items() if isinstance(raw, dict) else ():
            try:
                invalid, behaviour, at = (float(x) for x in entry)
            except (TypeError, ValueError):
                continue
            if isinstance(peer, str) and at <= now:
                entries.append((at, peer, invalid, behaviour))
        for at, peer, invalid, behaviour in sorted(entries)[-limit:]:
            if max(self._decayed(invalid, behaviour, at, now)) >= floor:
                self._held[peer] = (invalid, behaviour, at)

    def _decayed(self, invalid: float, behaviour: float, at: float, now: float):
        f = self.decay ** max(0.0, now - at)
        return invalid * f, behaviour * f

    def get(self, peer: str, now: float) -> tuple[float, float]:
        """The penalties of ``peer`` now (0, 0 if none is held)."""
        held = self._held.get(peer)
        return (0.0, 0.0) if held is None else self._decayed(*held, now)

    def put(self, peer: str, invalid: float, behaviour: float, now: float) -> bool:
        """Hold ``peer``'s penalties as its score has them now; True if that is news
        (not the held ones, decayed)."""
        old = self.get(peer, now)
        if all(
            abs(n - o) <= 0.05 + 0.01 * o for n, o in zip((invalid, behaviour), old, strict=True)
        ):
            return False
        self._held.pop(peer, None)
        if max(invalid, behaviour) >= self.floor:
            self._held[peer] = (invalid, behaviour, now)
            while len(self._held) > self.limit:
                del self._held[next(iter(self._held))]
        self.version += 1
        return True

    def drop(self, peer: str) -> None:
        if self._held.pop(peer, None) is not None:
            self.version += 1

    def state(self, now: float) -> dict[str, list[float]]:
        """What is held, decayed ones below the floor forgotten first."""
        for peer, held in list(self._held.items()):
            if max(self._decayed(*held, now)) < self.floor:
                del self._held[peer]
        return {p: [round(i, 3), round(b, 3), at] for p, (i, b, at) in self._held.items()}
