"""A node's whole run as chart series, read from its own ``metrics.jsonl``.

The live page (status.py, ``/history``) and the swarm view (local_swarm.py) draw the same
curves as ``sapo-node plot``, from the same file, so a restarted node shows its whole run.
:class:`History` reads the file incrementally (only the bytes appended since the last
call; from the start again when the file no longer ends with the bytes last read, as when
a resumed node cuts it back to its checkpoint), keeps one number per round for a fixed set
of keys, and answers with at most ``points`` rows:

- every round while the run has no more rounds than that;
- beyond, evenly spaced rounds, the first and the last always among them. The moving
  average is computed over every round *before* thinning, so it is the true one.

Held-out evaluations are few (one every ``eval.every`` rounds) and are kept apart, every
one of them up to the same bound. A round recorded twice (a crash between a round and the
checkpoint that covers it) counts once, its last record winning.

Rows in the names used before 0.3.0 are read in the current ones (metrics.upgrade, row by
row: a resumed node continues an old file in the new names). Nothing here imports torch:
the swarm's parent process reads its children's files too.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

from sapo_node.metrics import upgrade

# Per-round numbers the page draws (a missing key in a record is None, drawn as a gap).
KEYS = (
    "time",
    "reward/mean",
    "reward/cumulative",
    "reward/external_mean",
    "rollout/answer_tag_rate",
    "rollout/tokens_per_s",
    "memory/peak_rss_mb",
    "memory/peak_gpu_mb",
    "pool/groups",
    "groups/external_age_s",
    "groups/external_age_rounds",
    "net/peers",
    "groups/local",
    "groups/external",
    "groups/trained",
    "net/published",
    "net/received",
    "net/accepted",
    "net/rejected",
    "net/bytes_in",
    "net/bytes_out",
    "train/loss",
)
# Families of keys, by prefix: phase times, per-family reward and curriculum level.
PREFIXES = ("phase_s/", "family_level/", "family_reward/")
EVAL_KEYS = ("eval/pass1", "eval/greedy", "eval/answer_tag_rate")
MAX_POINTS = 2000
MA_WINDOW = 10
MARK_BYTES = 256
MAX_SERIES = 64  # families of a hostile or odd file cannot grow the answer without bound


def moving_average(values: list[float | None], window: int) -> list[float | None]:
    """Trailing mean over up to ``window`` known values (None where none is known yet).

    >>> moving_average([0, 2, None, 4, 6], 2)
    [0.0, 1.0, 1.0, 3.0, 5.0]
    """
    out: list[float | None] = []
    recent: list[float] = []
    for v in values:
        if v is not None:
            recent.append(v)
            if len(recent) > window:
                recent.pop(0)
        out.append(sum(recent) / len(recent) if recent else None)
    return out


def thin(n: int, points: int) -> list[int]:
    """Indices of at most ``points`` evenly spaced rows of ``n``, first and last included.

    >>> thin(5, 10), thin(10, 4), thin(0, 3)
    ([0, 1, 2, 3, 4], [0, 3, 6, 9], [])
    """
    if n <= points:
        return list(range(n))
    if points <= 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (points - 1)) for i in range(points)})


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


class History:
    """The rounds of one metrics file, kept up to date by :meth:`series`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._offset = 0
        self._rows: dict[int, dict[str, float | None]] = {}  # round -> numbers
        self._evals: dict[int, dict[str, float | None]] = {}
        self._tail = b""
        self._mark = b""  # the last bytes read: a file rewritten since does not end so

    def _same_start(self, f: Any) -> bool:
        """Whether the file still holds what was read, judged by its last bytes."""
        if not self._mark:
            return True
        f.seek(self._offset - len(self._mark))
        return f.read(len(self._mark)) == self._mark

    def _read(self) -> None:
        try:
            with self.path.open("rb") as f:
                size = f.seek(0, 2)
                if size < self._offset or not self._same_start(f):
                    # Cut back on resume (and maybe written past the old end since): again.
                    self._offset, self._rows, self._evals, self._tail = 0, {}, {}, b""
                    self._mark = b""
                if size == self._offset:
                    return
                f.seek(self._offset)
                chunk = f.read(size - self._offset)
        except OSError:  # no file yet
            return
        self._offset += len(chunk)
        self._mark = (self._mark + chunk)[-MARK_BYTES:]
        lines = (self._tail + chunk).split(b"\n")
        self._tail = lines.pop()  # a line being written: finished at the next read
        for raw in lines:
            self._add(raw)

    def _add(self, raw: bytes) -> None:
        try:
            record = json.loads(raw)
        except ValueError:  # a torn line, bad UTF-8
            return
        if not isinstance(record, dict) or type(record.get("round")) is not int:
            return
        record = upgrade(record)
        r = record["round"]
        row = {k: _number(record.get(k)) for k in KEYS}
        for k, v in record.items():
            if k.startswith(PREFIXES) and (n := _number(v)) is not None:
                row[k] = n
        self._rows[r] = row
        if any(k in record for k in EVAL_KEYS):
            self._evals[r] = {k: _number(record.get(k)) for k in EVAL_KEYS}

    def series(self, points: int = MAX_POINTS, window: int = MA_WINDOW) -> dict[str, Any]:
        """The run as columns: ``round`` and one list per key, at most ``points`` long.

        ``rounds`` is how many rounds the file holds; ``shown`` how many rows are given."""
        points = max(2, min(points, MAX_POINTS))
        with self._lock:
            self._read()
            rounds = sorted(self._rows)
            rows = [self._rows[r] for r in rounds]
            evals = sorted(self._evals.items())
        keys = list(KEYS)
        extra = sorted({k for row in rows for k in row if k not in KEYS})[:MAX_SERIES]
        columns = {k: [row.get(k) for row in rows] for k in keys + extra}
        columns["reward_ma"] = moving_average(columns["reward/mean"], window)
        keep = thin(len(rounds), points)
        out_eval = [evals[i] for i in thin(len(evals), points)]
        return {
            "rounds": len(rounds),
            "shown": len(keep),
            "window": window,
            "round": [rounds[i] for i in keep],
            "series": {k: [v[i] for i in keep] for k, v in columns.items()},
            "eval": {
                "round": [r for r, _ in out_eval],
                **{k.removeprefix("eval/"): [e[k] for _, e in out_eval] for k in EVAL_KEYS},
            },
        }
