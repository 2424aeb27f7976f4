"""Per-round metrics: one JSON object per line in ``<data-dir>/metrics.jsonl``.

The file is appended and fsynced once per round. A checkpoint records the file's
length; on resume the file is cut back to it, so the rounds redone after a crash
appear once.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

import torch


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
        line = json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every round recorded in a metrics file (a torn last line is skipped)."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def peak_gpu_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated by torch since the last reset, in MiB (0 off CUDA)."""
    if device.type != "cuda":
        return 0.0
    return torch.cuda.max_memory_allocated(device) / (1024 * 1024)
