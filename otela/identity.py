"""The node's persistent libp2p identity: an Ed25519 key kept under the node's home.

The key outlives sessions (peers and allowlists refer to it); the session id does not.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

KEY_FILE = "identity.key"


@dataclass(frozen=True)
class Identity:
    key_pair: KeyPair
    peer_id: ID

    @property
    def default_provider_id(self) -> str:
        """A stable, short provider id for nodes whose operator did not name one."""
        digest = hashlib.sha256(self.key_pair.public_key.to_bytes()).hexdigest()
        return f"provider-{digest[:10]}"


def load_or_create(home: Path) -> Identity:
    """Load the key from ``home``, creating it (mode 0600) on first start."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / KEY_FILE
    if path.exists():
        seed = path.read_bytes()
        if len(seed) != 32:
            raise ValueError(
                f"{path} is not a 32-byte Ed25519 seed; move it away to create a new identity"
            )
        private = Ed25519PrivateKey.from_bytes(seed)
    else:
        private = Ed25519PrivateKey.new()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private.to_bytes())
    key_pair = KeyPair(private, private.get_public_key())
    return Identity(key_pair=key_pair, peer_id=ID.from_pubkey(key_pair.public_key))
