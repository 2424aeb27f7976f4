"""The node's identity key: the peer ID read without py-libp2p is the library's, and the
node's own process does not load the library (net/identity.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from sapo_node.net import NetError, identity

REPO = Path(__file__).resolve().parents[2]


def _write(data_dir: Path, data: bytes) -> None:
    data_dir.mkdir(parents=True)
    (data_dir / identity.KEY_FILE).write_bytes(data)
    (data_dir / identity.KEY_FILE).chmod(0o600)


def test_the_peer_id_of_a_librarys_key_is_the_librarys(tmp_path: Path) -> None:
    for i in range(20):
        pair = create_new_key_pair()
        _write(tmp_path / str(i), pair.private_key.serialize())
        want = ID.from_pubkey(pair.public_key)
        got = identity.peer_id_of(tmp_path / str(i))
        assert got == want.to_base58()
        assert identity.id_bytes(got) == want.to_bytes()
        assert identity.peer_id(identity.load(tmp_path / str(i) / identity.KEY_FILE)) == got


def test_a_key_made_here_is_one_the_library_reads_as_the_same_peer(tmp_path: Path) -> None:
    peer = identity.peer_id_of(tmp_path / "a")
    assert (tmp_path / "a" / identity.KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert identity.peer_id(identity.load_or_create(tmp_path / "a")) == peer
    assert identity.peer_id_of(tmp_path / "a") == peer  # reused, not made again
    assert identity.peer_id(identity.load_or_create(tmp_path / "b")) == identity.peer_id_of(
        tmp_path / "b"
    )
    assert peer.startswith("12D3KooW")


def test_a_bad_key_file_is_refused_as_before(tmp_path: Path) -> None:
    _write(tmp_path / "junk", b"not a key")
    with pytest.raises(NetError, match="is not a libp2p private key"):
        identity.peer_id_of(tmp_path / "junk")
    pair = create_new_key_pair()
    _write(tmp_path / "open", pair.private_key.serialize())
    (tmp_path / "open" / identity.KEY_FILE).chmod(0o644)
    with pytest.raises(NetError, match="readable by others"):
        identity.peer_id_of(tmp_path / "open")


def test_the_id_bytes_of_leading_ones_and_bad_text() -> None:
    assert identity.id_bytes("1") == b"\x00"
    assert identity.id_bytes("11" + "2") == b"\x00\x00\x01"
    with pytest.raises(ValueError, match="not a base58 peer ID"):
        identity.id_bytes("0OIl")


def test_the_nodes_own_process_does_not_load_libp2p(tmp_path: Path) -> None:
    """The network process loads it; the node's process (its transport) needs only the
    peer ID, and loading the library made every start slower."""
    code = (
        "import sys; from pathlib import Path; import sapo_node.net.process, sapo_node.node; "
        "from sapo_node.net import identity; "
        f"print(identity.peer_id_of(Path({str(tmp_path / 'n')!r}))); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'libp2p'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    peer, loaded = done.stdout.splitlines()
    assert loaded == "[]"
    assert identity.peer_id(identity.load_or_create(tmp_path / "n")) == peer


def test_a_relay_and_share_do_not_load_torch(tmp_path: Path) -> None:
    """``start --no-train`` and ``sapo-node share`` lock a data directory, serve status
    and run a transport, and write no weights: importing torch for the data directory's
    atomic writes (it came with checkpoint.py) made each start slower and bigger. Nor do
    the network process and the intake's defences (``sapo-node pool`` reads them)."""
    code = (
        "import sys; from pathlib import Path; "
        "import sapo_node.cli, sapo_node.ops.status, sapo_node.share, sapo_node.net.process; "
        "import sapo_node.net.host, sapo_node.intake.defence; "
        "from sapo_node.ops import lifecycle; "
        f"lifecycle.hold_data_dir(Path({str(tmp_path / 'relay')!r})).close(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "relay" / "lock").exists()
