"""Membership admission: an authority key signs certificates that bind a node's peer id to a
provider, and revocations that withdraw them. See docs/membership.md.

The certificate format is the registry's (``otela.registry.certificate``: pure, bytes in,
verdict out; the registry checks every record against it); here ``authority`` manages the
key files, ``admission`` decides who is a member from the replica, and ``cli`` is the
``otela membership`` command group.
"""

from otela.membership.authority import (
    default_authority_dir,
    init_authority,
    load_authority_key,
    load_authority_public,
)
from otela.registry.certificate import (
    CLOCK_SKEW_S,
    MAX_MESSAGE_BYTES,
    Certificate,
    MembershipError,
    Revocation,
    authority_id,
    decode_certificate,
    format_authority,
    inspect_unverified,
    issue_certificate,
    issue_revocation,
    message_kind,
    parse_authority,
    parse_expiry,
    peer_public_key,
    verify_certificate,
    verify_revocation,
)

__all__ = [
    "CLOCK_SKEW_S",
    "MAX_MESSAGE_BYTES",
    "Certificate",
    "MembershipError",
    "Revocation",
    "authority_id",
    "decode_certificate",
    "default_authority_dir",
    "format_authority",
    "init_authority",
    "inspect_unverified",
    "issue_certificate",
    "issue_revocation",
    "load_authority_key",
    "load_authority_public",
    "message_kind",
    "parse_authority",
    "parse_expiry",
    "peer_public_key",
    "verify_certificate",
    "verify_revocation",
]
