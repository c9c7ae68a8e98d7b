"""The membership authority's key on disk.

``authority.key`` holds the raw 32-byte Ed25519 seed (the same format as a node's
``identity.key``), mode 0600; ``authority.pub`` holds the printable authority string that nodes
are configured with. Whoever can read ``authority.key`` can admit any node to the federation,
so the key is never overwritten and never read when other users can read it too (like ssh).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.keys import PrivateKey, PublicKey

from otela.paths import config_dir
from otela.registry.certificate import MembershipError, format_authority, parse_authority

KEY_FILE: Final = "authority.key"
PUB_FILE: Final = "authority.pub"


def default_authority_dir() -> Path:
    """``$XDG_CONFIG_HOME/otela/authority``."""
    return config_dir() / "authority"


def init_authority(directory: Path) -> PublicKey:
    """Create a new authority key in ``directory`` (made 0700 if new) and return its public key.

    Refuses to touch an existing authority: replacing the key would silently orphan every
    certificate it issued.
    """
    directory = Path(directory)
    key_path, pub_path = directory / KEY_FILE, directory / PUB_FILE
    for path in (key_path, pub_path):
        if path.exists() or path.is_symlink():
            raise MembershipError(
                f"{path} already exists; refusing to overwrite an authority "
                "(move the directory away to start a new federation)"
            )
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        private = Ed25519PrivateKey.new()
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private.to_bytes())
        public = private.get_public_key()
        tmp = pub_path.with_name(PUB_FILE + ".tmp")
        tmp.write_text(format_authority(public) + "\n")
        tmp.replace(pub_path)
    except FileExistsError:
        raise MembershipError(f"{key_path} already exists; refusing to overwrite it") from None
    except OSError as exc:
        raise MembershipError(f"cannot create authority in {directory}: {exc.strerror}") from None
    return public


def load_authority_key(directory: Path) -> PrivateKey:
    """Load the authority's private key, checking its size, permissions and that it matches
    ``authority.pub`` when that file exists (catches mixed-up directories)."""
    key_path = Path(directory) / KEY_FILE
    try:
        st = key_path.stat()
        seed = key_path.read_bytes()
    except FileNotFoundError:
        raise MembershipError(
            f"no authority key at {key_path}; create one with `otela membership init`"
        ) from None
    except OSError as exc:
        raise MembershipError(f"cannot read {key_path}: {exc.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise MembershipError(
            f"{key_path} is accessible by other users (mode {stat.S_IMODE(st.st_mode):o}); "
            f"run `chmod 600 {key_path}`"
        )
    if len(seed) != 32:
        raise MembershipError(f"{key_path} is not a 32-byte Ed25519 seed")
    private = Ed25519PrivateKey.from_bytes(seed)
    pub_path = Path(directory) / PUB_FILE
    if pub_path.exists():
        try:
            recorded = parse_authority(pub_path.read_text())
        except (MembershipError, OSError, UnicodeDecodeError) as exc:
            raise MembershipError(f"{pub_path} is unreadable: {exc}") from None
        if recorded.to_bytes() != private.get_public_key().to_bytes():
            raise MembershipError(f"{pub_path} does not match {key_path}")
    return private


def load_authority_public(directory: Path) -> PublicKey:
    """The authority's public key from ``authority.pub`` (no private key needed)."""
    pub_path = Path(directory) / PUB_FILE
    try:
        text = pub_path.read_text()
    except FileNotFoundError:
        raise MembershipError(f"no authority at {pub_path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MembershipError(f"cannot read {pub_path}: {exc}") from None
    return parse_authority(text)
