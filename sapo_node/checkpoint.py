"""Atomic checkpoints in the data directory, verified when loaded.

Layout::

    <data-dir>/checkpoints/round-000010/weights.safetensors   trainable weights
                                        optimizer.pt          optimiser state
                                        state.json            round, seed, curriculum, ...
                                        MANIFEST.json         sha256 of each file (last)
    <data-dir>/checkpoints/LATEST                             "round-000010"
    <data-dir>/runs/20260101T120000Z-embedded/checkpoints/    a run set aside (set_aside)
                                             /metrics.jsonl

A checkpoint is written under a temporary name, fsynced, then renamed; LATEST is
replaced atomically after that. A crash at any point leaves the previous checkpoint
intact; a round saved again keeps its first save aside until the new one is in place,
and LATEST finds it there after a crash between the two renames. Loading checks the
manifest's hashes and the model fingerprint: a corrupt or foreign checkpoint raises
CheckpointError, never a silent restart from scratch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from sapo_node.atomic import fsync_dir as _fsync_dir
from sapo_node.atomic import write_text_atomic

log = structlog.get_logger(__name__)

FORMAT = 1
WEIGHTS = "weights.safetensors"
OPTIMIZER = "optimizer.pt"
STATE = "state.json"
MANIFEST = "MANIFEST.json"


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used; the message says why and what to do."""


@dataclass
class Checkpoint:
    """What a node resumes from."""

    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    state: dict[str, Any]
    path: Path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_hashes(path: Path, remedy: str) -> None:
    """Check each file of checkpoint ``path`` against its manifest's hash: CheckpointError
    names the first that differs, then ``remedy``. An unreadable manifest raises what
    reading it raised (OSError, ValueError, KeyError, TypeError)."""
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    for name, digest in manifest["files"].items():
        if _sha256(path / name) != digest:
            raise CheckpointError(
                f"checkpoint {path} is corrupt: {name} does not match its hash; {remedy}"
            )


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def made_for(path: Path) -> Any:
    """The fingerprint checkpoint ``path`` records (unverified), or None if it has none
    that can be read: ``CheckpointStore.load`` says why when the node resumes."""
    try:
        return json.loads((path / STATE).read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None


def set_aside(data_dir: Path, label: str) -> Path:
    """Move the run of ``data_dir`` (its checkpoints and the metrics they index) into
    ``runs/<UTC time>-<label>`` there, a data directory of its own (``--data-dir`` reads
    it); the directory is left to start a new run. Metrics go first: a crash between the
    two moves leaves the checkpoints to a second set-aside, and loses nothing."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._")[-60:] or "run"
    runs = data_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    where = runs / f"{stamp}-{slug}"
    n = 1
    while where.exists():
        n += 1
        where = runs / f"{stamp}-{slug}-{n}"
    where.mkdir()
    for name in ("metrics.jsonl", "checkpoints"):
        if (data_dir / name).exists():
            os.replace(data_dir / name, where / name)
    _fsync_dir(where)
    _fsync_dir(data_dir)
    return where


class CheckpointStore:
    """Writes, finds, verifies and prunes the checkpoints of one data directory."""

    def __init__(self, data_dir: Path, keep: int = 2) -> None:
        self.root = data_dir / "checkpoints"
        self.keep = keep

    def save(
        self,
        round_: int,
        weights: dict[str, torch.Tensor],
        optimizer: dict[str, Any],
        state: dict[str, Any],
    ) -> Path:
        """Write a checkpoint of ``round_`` atomically and point LATEST at it."""
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"round-{round_:06d}"
        final = self.root / name
        tmp = self.root / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            try:
                save_file(weights, str(tmp / WEIGHTS), metadata={"format": str(FORMAT)})
                torch.save(optimizer, tmp / OPTIMIZER)
            except (RuntimeError, SafetensorError) as exc:
                # A write that failed (a full disk) comes back from torch and safetensors
                # as their own errors, not OSError: the caller's handling is for OSError.
                raise OSError(f"cannot write the checkpoint in {self.root}: {exc}") from exc
            (tmp / STATE).write_text(
                json.dumps({"format": FORMAT, **state}, indent=1), encoding="utf-8"
            )
            files = {f: _sha256(tmp / f) for f in (WEIGHTS, OPTIMIZER, STATE)}
            (tmp / MANIFEST).write_text(json.dumps({"files": files}), encoding="utf-8")
            for f in (*files, MANIFEST):
                _fsync_file(tmp / f)
            aside = None
            if final.exists():  # the same round again: the old stays whole until replaced
                aside = self.root / f".{name}.old-{os.getpid()}"
                shutil.rmtree(aside, ignore_errors=True)
                os.replace(final, aside)
            os.replace(tmp, final)
            _fsync_dir(self.root)
            write_text_atomic(self.root / "LATEST", name + "\n")
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._prune(keep_name=name)
        return final

    def _prune(self, keep_name: str) -> None:
        done = sorted(p for p in self.root.glob("round-*") if p.is_dir())
        for old in done[: max(0, len(done) - self.keep)]:
            if old.name != keep_name:
                shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob(".round-*.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        for aside in self.root.glob(".round-*.old-*"):  # kept only while its round is missing
            if (self.root / aside.name[1:].split(".old-")[0]).is_dir():
                shutil.rmtree(aside, ignore_errors=True)

    def latest(self) -> Path | None:
        """The checkpoint LATEST names, or None for a data dir without checkpoints."""
        pointer = self.root / "LATEST"
        if not pointer.exists():
            if any(self.root.glob("round-*")):
                raise CheckpointError(
                    f"{self.root} holds checkpoints but no LATEST file; restore it "
                    "(e.g. echo round-000010 > LATEST) or move the directory away"
                )
            return None
        name = pointer.read_text(encoding="utf-8").strip()
        path = self.root / name
        if name.startswith("round-") and "/" not in name and not path.is_dir():
            # a save of the same round stopped between moving the old one aside and
            # putting the new one in place: the old one is whole, and LATEST's again
            for aside in sorted(self.root.glob(f".{name}.old-*")):
                os.replace(aside, path)
                log.warning("checkpoint restored from a save cut short", path=str(path))
                break
        if not name.startswith("round-") or "/" in name or not path.is_dir():
            raise CheckpointError(f"{pointer} names {name!r}, which is not a checkpoint here")
        return path

    def load(self, path: Path, fingerprint: dict[str, Any]) -> Checkpoint:
        """Verify and read a checkpoint made for a node with ``fingerprint``."""
        try:
            verify_hashes(path, "remove this checkpoint directory and point LATEST at an older one")
            state = json.loads((path / STATE).read_text(encoding="utf-8"))
            weights = load_file(str(path / WEIGHTS))
            optimizer = torch.load(path / OPTIMIZER, map_location="cpu", weights_only=True)
        except CheckpointError:
            raise
        except (OSError, KeyError, ValueError, TypeError, SafetensorError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint {path} cannot be read: {exc}") from None
        if state.get("format") != FORMAT:
            raise CheckpointError(
                f"checkpoint {path} has format {state.get('format')!r}, expected {FORMAT}"
            )
        theirs = state.get("fingerprint", {})
        if theirs != fingerprint:
            raise CheckpointError(
                f"checkpoint {path} was made for {theirs}, this node runs {fingerprint}; "
                "use the same --model (and LoRA setting) or another --data-dir"
            )
        return Checkpoint(weights, optimizer, state, path)
