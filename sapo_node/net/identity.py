"""The node's libp2p identity: an ed25519 key in the data directory (mode 0600),
created on first start and reused after, so the peer ID survives restarts.

The node's own process needs only its peer ID (:func:`peer_id_of`), which this module
reads from the key file without loading py-libp2p: the library is imported by the
network process, and loading it in the node's process too made every start slower. The
file is libp2p's serialized private key (a protobuf: key type Ed25519, the 32-byte
seed); the peer ID is the identity multihash of the serialized public key, in base58
(docs/libp2p.md#peer-ids). A file in any other form is read by the library
(:func:`load`), which refuses it with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sapo_node.net import NetError

if TYPE_CHECKING:
    from libp2p.crypto.keys import KeyPair

KEY_FILE = "identity.key"
# libp2p's protobuf framing: field 1 (key type) = 1 (Ed25519), field 2 (data) of 32 bytes
_ED25519 = b"\x08\x01\x12\x20"
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def _create(data_dir: Path) -> None:
    """Write a new key file (atomically, 0600)."""
    from nacl.signing import SigningKey

    path = data_dir / KEY_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_ED25519 + bytes(SigningKey.generate()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise NetError(f"cannot write the identity key {path}: {exc}") from None


def _read(path: Path) -> bytes:
    """A key file's bytes; refuses one that others can read."""
    try:
        mode = path.stat().st_mode & 0o777
        data = path.read_bytes()
    except OSError as exc:
        raise NetError(f"cannot read the identity key {path}: {exc}") from None
    if mode & 0o077:
        raise NetError(
            f"identity key {path} is readable by others (mode {mode:o}); run chmod 600 on it"
        )
    return data


def peer_id_of(data_dir: Path) -> str:
    """The peer ID of the key in ``data_dir``, created if there is none, without loading
    py-libp2p for a key in the library's usual form (the module's docstring)."""
    path = data_dir / KEY_FILE
    if not path.exists():
        _create(data_dir)
    data = _read(path)
    if len(data) != 36 or not data.startswith(_ED25519):
        return peer_id(load(path))  # the library reads it, or says what is wrong
    from nacl.signing import SigningKey

    public = bytes(SigningKey(data[4:]).verify_key)
    return _b58encode(b"\x00\x24" + _ED25519 + public)  # identity multihash, 36 bytes


def load_or_create(data_dir: Path) -> KeyPair:
    """The key pair in ``data_dir``, created (atomically, 0600) if there is none."""
    path = data_dir / KEY_FILE
    if not path.exists():
        _create(data_dir)
    return load(path)


def load(path: Path) -> KeyPair:
    """Read a key file; refuses one that others can read, or that is not a key."""
    from libp2p.crypto.keys import KeyPair
    from libp2p.crypto.serialization import deserialize_private_key

    data = _read(path)
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
    from libp2p.peer.id import ID

    return ID.from_pubkey(key_pair.public_key).to_base58()


def id_bytes(peer: str) -> bytes:
    """The bytes of the peer ID whose base58 text is ``peer`` (what wire.shards_of takes)."""
    try:
        number = 0
        for char in peer:
            number = number * 58 + _B58.index(char)
    except ValueError:
        raise ValueError(f"not a base58 peer ID: {peer!r}") from None
    body = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return b"\x00" * (len(peer) - len(peer.lstrip("1"))) + body


def _b58encode(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    out = ""
    while number:
        number, digit = divmod(number, 58)
        out = _B58[digit] + out
    return "1" * (len(data) - len(data.lstrip(b"\x00"))) + out
