"""The node's libp2p identity: an ed25519 key in the data directory (mode 0600),
created on first start and reused after, so the peer ID survives restarts."""

from __future__ import annotations

import os
from pathlib import Path

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.serialization import deserialize_private_key
from libp2p.peer.id import ID

from sapo_node.net import NetError

KEY_FILE = "identity.key"


def load_or_create(data_dir: Path) -> KeyPair:
    """The key pair in ``data_dir``, created (atomically, 0600) if there is none."""
    path = data_dir / KEY_FILE
    if path.exists():
        return load(path)
    key_pair = create_new_key_pair()
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(key_pair.private_key.serialize())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise NetError(f"cannot write the identity key {path}: {exc}") from None
    return key_pair


def load(path: Path) -> KeyPair:
    """Read a key file; refuses one that others can read, or that is not a key."""
    try:
        mode = path.stat().st_mode & 0o777
        data = path.read_bytes()
    except OSError as exc:
        raise NetError(f"cannot read the identity key {path}: {exc}") from None
    if mode & 0o077:
        raise NetError(
            f"identity key {path} is readable by others (mode {mode:o}); run chmod 600 on it"
        )
    try:
        private = deserialize_private_key(data)
    except Exception as exc:  # protobuf or key-type errors of any kind
        raise NetError(
            f"identity key {path} is not a libp2p private key ({exc}); restore it, or move "
            "it away to start with a new peer ID"
        ) from None
    if private.get_type().name != "Ed25519":
        raise NetError(f"identity key {path} is not ed25519")
    return KeyPair(private, private.get_public_key())


def peer_id(key_pair: KeyPair) -> str:
    return ID.from_pubkey(key_pair.public_key).to_base58()


def id_bytes(peer: str) -> bytes:
    """The bytes of the peer ID whose base58 text is ``peer`` (what wire.shards_of takes)."""
    return ID.from_base58(peer).to_bytes()
