"""Per-round metrics: one JSON object per line in ``<data-dir>/metrics.jsonl``.

The file is appended and fsynced once per round. A checkpoint records the file's
length; on resume the file is cut back to it, so the rounds redone after a crash
appear once.

Every key but ``round`` and ``time`` is ``<concern>/<name>``, lower snake_case, units as
a suffix (``_s``, ``_mb``), a label value last (``family_reward/<family>``, as
``sapo_family_reward{family}``); docs/operations.md lists them. Files written before
0.3.0 used other names (``reward_mean``, ``t_round``, ...): :func:`upgrade` renames such a
row's keys (:data:`RENAMED`), and every reader of the file goes through it
(:func:`read_metrics`, history.py), one row at a time, so a file whose old rows a resumed
node continued in the new names reads as new rows throughout.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # history.py reads files here without torch (the swarm's parent)
    import torch

# Old key -> new key, for the rows written before 0.3.0. A key ending in ``*`` is a
# prefix rule: an old key that starts with what comes before the ``*`` (and matches no
# whole key) keeps the rest, put in place of the new key's ``*``.
RENAMED: dict[str, str] = {
    "reward_mean": "reward/mean",
    "cumulative_reward": "reward/cumulative",
    "external_reward_mean": "reward/external_mean",
    "reward/*": "family_reward/*",
    "level/*": "family_level/*",
    "curriculum_moves": "curriculum/moves",
    "answer_tag_rate": "rollout/answer_tag_rate",
    "new_tokens": "rollout/new_tokens",
    "tokens_per_s": "rollout/tokens_per_s",
    "local_groups": "groups/local",
    "external_groups": "groups/external",
    "groups_trained": "groups/trained",
    "local_groups_*": "groups/local_*",
    "external_groups_*": "groups/external_*",
    "external_tokens_taught": "groups/external_tokens_taught",
    "external_age_s": "groups/external_age_s",
    "external_age_s_max": "groups/external_age_s_max",
    "external_age_rounds": "groups/external_age_rounds",
    "external_age_rounds_max": "groups/external_age_rounds_max",
    "t_*": "phase_s/*",
    "peak_rss_mb": "memory/peak_rss_mb",
    "peak_gpu_mb": "memory/peak_gpu_mb",
    "pool_size": "pool/groups",
    "pool_mb": "pool/mb",
    "peers": "net/peers",
    "groups_published": "net/published",
    "groups_received": "net/received",
    "groups_accepted": "net/accepted",
    "groups_rejected": "net/rejected",
    "groups_dropped": "net/dropped",
    "groups_unsent": "net/unsent",
    "bytes_in": "net/bytes_in",
    "bytes_out": "net/bytes_out",
}
_PREFIXES = tuple((old[:-1], new[:-1]) for old, new in RENAMED.items() if old.endswith("*"))


def renamed(key: str) -> str:
    """An old row's key in the new names (itself when it was not renamed).

    >>> renamed("t_round"), renamed("external_groups_signal"), renamed("train/loss")
    ('phase_s/round', 'groups/external_signal', 'train/loss')
    """
    if key in RENAMED:
        return RENAMED[key]
    for old, new in _PREFIXES:
        if key.startswith(old) and len(key) > len(old):
            return new + key[len(old) :]
    return key


def upgrade(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row in the current names: an old one (it has ``reward_mean``, which no
    new row has) with its keys renamed, values and order kept; any other row as it is.

    >>> old = {"round": 3, "time": 1.5, "reward_mean": 0.25, "reward/arith": 0.5,
    ...        "level/arith": 2, "t_round": 9.0, "local_groups_signal": 1, "peers": 2,
    ...        "train/loss": 0.1, "peer_groups/accepted": 4}
    >>> upgrade(old)  # doctest: +NORMALIZE_WHITESPACE
    {'round': 3, 'time': 1.5, 'reward/mean': 0.25, 'family_reward/arith': 0.5,
     'family_level/arith': 2, 'phase_s/round': 9.0, 'groups/local_signal': 1,
     'net/peers': 2, 'train/loss': 0.1, 'peer_groups/accepted': 4}
    >>> new = upgrade(old)
    >>> upgrade(new) == new
    True
    """
    if "reward_mean" not in row:
        return row
    return {renamed(k): v for k, v in row.items()}


def finite_or_null(value: Any) -> Any:
    """``value`` with every non-finite float in it (NaN, infinities), at any depth, as None.

    JSON has no NaN, and a round may carry one: a step skipped for a non-finite gradient
    still records its loss. Such a figure is written as null, as an absent one is.

    >>> finite_or_null({"train/loss": float("nan"), "x": [1.5, float("inf")], "n": 2})
    {'train/loss': None, 'x': [1.5, None], 'n': 2}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


class MetricsLog:
    """Append-only JSON lines, truncatable to a checkpoint's offset."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def offset(self) -> int:
        """Bytes written so far: the position a checkpoint stores."""
        return self.path.stat().st_size if self.path.exists() else 0

    def truncate(self, offset: int) -> None:
        """Forget rounds recorded after ``offset`` (they are about to be redone)."""
        if self.path.exists() and self.path.stat().st_size > offset:
            with self.path.open("r+b") as f:
                f.truncate(offset)

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` as one line; non-finite figures as null (:func:`finite_or_null`)."""
        line = json.dumps(finite_or_null(record), separators=(",", ":"), allow_nan=False) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every round recorded in a metrics file, in the current names (:func:`upgrade`;
    a torn last line is skipped)."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows.append(upgrade(row) if isinstance(row, dict) else row)
    return rows


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def peak_gpu_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated by torch since the last reset, in MiB (0 off CUDA)."""
    if device.type != "cuda":
        return 0.0
    import torch

    return torch.cuda.max_memory_allocated(device) / (1024 * 1024)
