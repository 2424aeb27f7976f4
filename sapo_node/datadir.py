"""A node's data directory as the node holds it: locked against a second node, and the
node's seed kept in ``node.json`` (drawn at first start unless configured)."""

from __future__ import annotations

import fcntl
import json
import os
import random
from pathlib import Path

from sapo_node.atomic import write_text_atomic


class DataDirInUse(RuntimeError):
    """Another process holds this data directory."""


def node_seed(data_dir: Path, configured: int | None) -> int:
    """The configured seed, else the one drawn at first start and kept in node.json."""
    path = data_dir / "node.json"
    try:
        stored = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (OSError, ValueError) as exc:
        from sapo_node.checkpoint import CheckpointError  # torch: only a training node's

        raise CheckpointError(
            f"{path} cannot be read ({exc}); restore it, or delete it to draw a new seed"
        ) from None
    seed = configured if configured is not None else stored.get("seed")
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
    if stored.get("seed") != seed:
        write_text_atomic(path, json.dumps({**stored, "seed": seed}) + "\n")
    return int(seed)


def lock_data_dir(data_dir: Path):
    handle = (data_dir / "lock").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise DataDirInUse(
            f"data directory {data_dir} is in use by another sapo-node; stop it or pass "
            "another --data-dir"
        ) from None
    handle.truncate(0)
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
