"""Membership certificates and revocations: signing, verification and every rejection."""

from __future__ import annotations

import os
import stat
from datetime import UTC, datetime

import msgpack
import pytest
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.crypto.secp256k1 import create_new_key_pair as secp_key_pair
from libp2p.peer.id import ID

from otela.membership import (
    CLOCK_SKEW_S,
    MAX_MESSAGE_BYTES,
    Certificate,
    MembershipError,
    Revocation,
    authority_id,
    decode_certificate,
    format_authority,
    init_authority,
    inspect_unverified,
    issue_certificate,
    issue_revocation,
    load_authority_key,
    load_authority_public,
    message_kind,
    parse_authority,
    parse_expiry,
    peer_public_key,
    verify_certificate,
    verify_revocation,
)
from otela.registry.certificate import _DOMAIN

NOW = 1_800_000_000.0
DAY = 86400.0


@pytest.fixture
def authority() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.new()


@pytest.fixture
def node() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.new()


def pid(key: Ed25519PrivateKey) -> str:
    return str(ID.from_pubkey(key.get_public_key()).to_base58())


def cert_for(authority: Ed25519PrivateKey, node: Ed25519PrivateKey, **kw: object) -> bytes:
    args: dict[str, object] = {
        "peer_id": pid(node),
        "provider_id": "cscs",
        "expires_at": NOW + 30 * DAY,
        "now": NOW,
    }
    args.update(kw)
    return issue_certificate(authority, **args)  # type: ignore[arg-type]


def envelope(data: bytes) -> dict:
    return msgpack.unpackb(data, raw=False)


def repack(env: dict) -> bytes:
    return msgpack.packb(env, use_bin_type=True)


# --- round trips ------------------------------------------------------------------------------


def test_certificate_round_trip(authority, node):
    data = cert_for(authority, node, serial="00112233445566778899aabbccddeeff")
    cert = verify_certificate(data, authority.get_public_key(), now=NOW + DAY)
    assert cert == Certificate(
        peer_id=pid(node),
        provider_id="cscs",
        serial="00112233445566778899aabbccddeeff",
        issued_at=NOW,
        expires_at=NOW + 30 * DAY,
        authority_id=authority_id(authority.get_public_key()),
    )
    assert len(data) < 400
    assert message_kind(data) == "cert"
    # The certificate names a peer whose key can be recovered from the peer id alone.
    assert peer_public_key(cert.peer_id).to_bytes() == node.get_public_key().to_bytes()


def test_serials_are_random_and_unique(authority, node):
    serials = {
        verify_certificate(cert_for(authority, node), authority.get_public_key(), now=NOW).serial
        for _ in range(50)
    }
    assert len(serials) == 50
    assert all(len(s) == 32 and int(s, 16) >= 0 for s in serials)


def test_revocation_round_trip(authority, node):
    data = issue_revocation(
        authority, serial="abcdef0123456789", peer_id=pid(node), now=NOW, reason="key leaked"
    )
    rev = verify_revocation(data, authority.get_public_key())
    assert rev == Revocation(
        serial="abcdef0123456789",
        peer_id=pid(node),
        revoked_at=NOW,
        reason="key leaked",
        authority_id=authority_id(authority.get_public_key()),
    )
    assert message_kind(data) == "revocation"


def test_authority_string_round_trip(authority):
    public = authority.get_public_key()
    text = format_authority(public)
    assert text.startswith("otela-authority:")
    assert parse_authority(f"  {text}\n").to_bytes() == public.to_bytes()


# --- signature and authority --------------------------------------------------------------------


def test_tampered_body_is_rejected(authority, node):
    env = envelope(cert_for(authority, node))
    body = msgpack.unpackb(env["body"], raw=False)
    body["provider_id"] = "evil-corp"
    env["body"] = msgpack.packb(body, use_bin_type=True)
    with pytest.raises(MembershipError, match="signature is invalid"):
        verify_certificate(repack(env), authority.get_public_key(), now=NOW)


def test_tampered_signature_is_rejected(authority, node):
    env = envelope(cert_for(authority, node))
    env["sig"] = bytes([env["sig"][0] ^ 1]) + env["sig"][1:]
    with pytest.raises(MembershipError, match="signature is invalid"):
        verify_certificate(repack(env), authority.get_public_key(), now=NOW)


def test_every_flipped_bit_is_rejected(authority, node):
    data = cert_for(authority, node)
    for i in range(len(data)):
        for bit in (0, 3, 7):
            mutated = bytearray(data)
            mutated[i] ^= 1 << bit
            with pytest.raises(MembershipError):
                verify_certificate(bytes(mutated), authority.get_public_key(), now=NOW)


def test_other_authority_is_rejected_by_name(authority, node):
    other = Ed25519PrivateKey.new()
    data = cert_for(other, node)
    with pytest.raises(MembershipError, match=r"issued by authority .* not by the expected"):
        verify_certificate(data, authority.get_public_key(), now=NOW)


def test_other_authority_claiming_our_id_fails_signature(authority, node):
    """A forger can copy our authority id into the body, but cannot sign for it."""
    other = Ed25519PrivateKey.new()
    env = envelope(cert_for(other, node))
    body = msgpack.unpackb(env["body"], raw=False)
    body["authority_id"] = authority_id(authority.get_public_key())
    env["body"] = msgpack.packb(body, use_bin_type=True)
    env["sig"] = other.sign(_DOMAIN["cert"] + env["body"])
    with pytest.raises(MembershipError, match="signature is invalid"):
        verify_certificate(repack(env), authority.get_public_key(), now=NOW)


def test_certificate_presented_by_another_peer_is_rejected(authority, node):
    data = cert_for(authority, node)
    thief = pid(Ed25519PrivateKey.new())
    with pytest.raises(MembershipError, match="presented by"):
        verify_certificate(data, authority.get_public_key(), now=NOW, peer_id=thief)
    assert verify_certificate(data, authority.get_public_key(), now=NOW, peer_id=pid(node))


# --- time and revocation --------------------------------------------------------------------------


def test_expired_certificate_is_rejected(authority, node):
    data = cert_for(authority, node, expires_at=NOW + DAY)
    verify_certificate(data, authority.get_public_key(), now=NOW + DAY - 1)
    with pytest.raises(MembershipError, match="expired"):
        verify_certificate(data, authority.get_public_key(), now=NOW + DAY)
    # Signature-only decoding still works, for tools that revoke expired certificates.
    assert decode_certificate(data, authority.get_public_key()).expires_at == NOW + DAY


def test_not_yet_valid_certificate_is_rejected(authority, node):
    data = cert_for(authority, node)
    verify_certificate(data, authority.get_public_key(), now=NOW - CLOCK_SKEW_S)
    with pytest.raises(MembershipError, match="not valid before"):
        verify_certificate(data, authority.get_public_key(), now=NOW - CLOCK_SKEW_S - 1)
    with pytest.raises(MembershipError, match="not valid before"):
        verify_certificate(data, authority.get_public_key(), now=NOW - 1, leeway=0)


def test_revoked_serial_is_rejected(authority, node):
    data = cert_for(authority, node)
    public = authority.get_public_key()
    serial = verify_certificate(data, public, now=NOW).serial
    rev = verify_revocation(
        issue_revocation(authority, serial=serial, peer_id=pid(node), now=NOW), public
    )
    with pytest.raises(MembershipError, match="revoked"):
        verify_certificate(data, public, now=NOW, revoked_serials={rev.serial})
    verify_certificate(data, public, now=NOW, revoked_serials={"deadbeefdeadbeef"})


def test_issuing_rejects_bad_arguments(authority, node):
    with pytest.raises(MembershipError, match="future"):
        cert_for(authority, node, expires_at=NOW)
    with pytest.raises(MembershipError, match="peer id"):
        cert_for(authority, node, peer_id="not-a-peer")
    with pytest.raises(MembershipError, match="provider id"):
        cert_for(authority, node, provider_id="")
    with pytest.raises(MembershipError, match="provider id"):
        cert_for(authority, node, provider_id="has space")
    with pytest.raises(MembershipError, match="provider id"):
        cert_for(authority, node, provider_id="x" * 129)
    with pytest.raises(MembershipError, match="serial"):
        cert_for(authority, node, serial="XYZ")
    with pytest.raises(MembershipError, match="finite"):
        cert_for(authority, node, expires_at=float("inf"))
    with pytest.raises(MembershipError, match="reason"):
        issue_revocation(authority, serial="abcdef01", peer_id=pid(node), now=NOW, reason="x" * 257)


def test_non_ed25519_peer_ids_are_rejected():
    secp = secp_key_pair()
    secp_pid = ID.from_pubkey(secp.public_key).to_base58()
    with pytest.raises(MembershipError, match="Ed25519"):
        peer_public_key(secp_pid)
    with pytest.raises(MembershipError):
        peer_public_key("QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N")  # sha256 multihash


# --- domain separation ----------------------------------------------------------------------------


def test_certificate_signature_cannot_be_replayed_as_revocation(authority, node):
    """Even if a revocation body's bytes were signed in the certificate domain, it fails."""
    rev_env = envelope(
        issue_revocation(authority, serial="abcdef0123456789", peer_id=pid(node), now=NOW)
    )
    rev_env["sig"] = authority.sign(_DOMAIN["cert"] + rev_env["body"])
    with pytest.raises(MembershipError, match="signature is invalid"):
        verify_revocation(repack(rev_env), authority.get_public_key())


def test_certificate_relabelled_as_revocation_is_rejected(authority, node):
    env = envelope(cert_for(authority, node))
    env["kind"] = "revocation"
    with pytest.raises(MembershipError):
        verify_revocation(repack(env), authority.get_public_key())
    with pytest.raises(MembershipError, match="expected a cert, got a revocation"):
        verify_certificate(repack(env), authority.get_public_key(), now=NOW)


def test_raw_body_signature_registry_style_is_rejected(authority, node):
    """A signature over the raw msgpack body (how registry records are signed) is not a cert."""
    env = envelope(cert_for(authority, node))
    env["sig"] = authority.sign(env["body"])
    with pytest.raises(MembershipError, match="signature is invalid"):
        verify_certificate(repack(env), authority.get_public_key(), now=NOW)


def test_signed_messages_are_never_msgpack():
    """The domain prefix starts with 0xc1, which msgpack never uses."""
    for prefix in _DOMAIN.values():
        assert prefix[0] == 0xC1
        with pytest.raises(Exception):  # noqa: B017 - any msgpack error will do
            msgpack.unpackb(prefix + msgpack.packb({"a": 1}))


# --- malformed and oversized input --------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"not msgpack at all",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"v": 1}),
        msgpack.packb({"v": 2, "kind": "cert", "body": b"", "sig": b"\0" * 64}),
        msgpack.packb({"v": True, "kind": "cert", "body": b"", "sig": b"\0" * 64}),
        msgpack.packb({"v": 1, "kind": "token", "body": b"", "sig": b"\0" * 64}),
        msgpack.packb({"v": 1, "kind": "cert", "body": "str", "sig": b"\0" * 64}),
        msgpack.packb({"v": 1, "kind": "cert", "body": b"", "sig": b"\0" * 63}),
        msgpack.packb({"v": 1, "kind": "cert", "body": b"\x93\x01", "sig": b"\0" * 64}),
        msgpack.packb({"v": 1, "kind": "cert", "body": msgpack.packb([1]), "sig": b"\0" * 64}),
        msgpack.packb({"v": 1, "kind": "cert", "body": b"", "sig": b"\0" * 64, "x": 1}),
        msgpack.packb({"v": 1, "kind": "cert", "body": b"", "sig": b"\0" * 64}) + b"\0",
        b"\x81" * 5000,
        b"\xdf\xff\xff\xff\xff",  # a map claiming 4 billion entries
    ],
)
def test_malformed_input_is_a_membership_error(authority, data):
    with pytest.raises(MembershipError):
        verify_certificate(data, authority.get_public_key(), now=NOW)
    with pytest.raises(MembershipError):
        verify_revocation(data, authority.get_public_key())
    with pytest.raises(MembershipError):
        inspect_unverified(data)


def test_oversized_input_is_rejected_before_parsing(authority):
    with pytest.raises(MembershipError, match="limit"):
        verify_certificate(b"\0" * (MAX_MESSAGE_BYTES + 1), authority.get_public_key(), now=NOW)


def _resigned(authority: Ed25519PrivateKey, body: object) -> bytes:
    body_bytes = msgpack.packb(body, use_bin_type=True)
    sig = authority.sign(_DOMAIN["cert"] + body_bytes)
    return repack({"v": 1, "kind": "cert", "body": body_bytes, "sig": sig})


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"extra": 1}, "unexpected"),
        ({"provider_id": None}, "provider_id must be a str"),
        ({"issued_at": "yesterday"}, "finite number"),
        ({"issued_at": float("nan")}, "finite number"),
        ({"issued_at": True}, "finite number"),
        ({"expires_at": NOW - 1}, "expires before"),
        ({"serial": "NOT-HEX"}, "serial"),
        ({"peer_id": "12D3KooWnope"}, "peer id"),
        ({"authority_id": "short"}, "authority id"),
    ],
)
def test_strict_fields_even_when_validly_signed(authority, node, change, match):
    """The authority's own tools could have a bug; a signature does not make junk valid."""
    body = msgpack.unpackb(envelope(cert_for(authority, node))["body"], raw=False)
    body.update(change)
    with pytest.raises(MembershipError, match=match):
        verify_certificate(_resigned(authority, body), authority.get_public_key(), now=NOW)


def test_missing_field_is_rejected(authority, node):
    body = msgpack.unpackb(envelope(cert_for(authority, node))["body"], raw=False)
    del body["serial"]
    with pytest.raises(MembershipError, match="missing fields"):
        verify_certificate(_resigned(authority, body), authority.get_public_key(), now=NOW)


def test_non_canonical_body_is_rejected(authority, node):
    body = msgpack.unpackb(envelope(cert_for(authority, node))["body"], raw=False)
    body_bytes = msgpack.packb(body, use_bin_type=True, use_single_float=False)
    # Re-encode one string as str16 instead of the minimal fixstr: same value, other bytes.
    weird = body_bytes.replace(b"\xa4cscs", b"\xda\x00\x04cscs")
    assert weird != body_bytes and msgpack.unpackb(weird, raw=False) == body
    sig = authority.sign(_DOMAIN["cert"] + weird)
    data = repack({"v": 1, "kind": "cert", "body": weird, "sig": sig})
    with pytest.raises(MembershipError, match="non-canonical"):
        verify_certificate(data, authority.get_public_key(), now=NOW)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "otela-authority:",
        "otela-authority:0OIl",
        "otela-authority:abc",
        "12D3KooWFnusPZi2tv8dnLaGwBmxRRrb9JY937xHFrd136NRoxxi",
        "otela-authority:" + "1" * 44,
    ],
)
def test_junk_authority_strings_are_rejected(text):
    with pytest.raises(MembershipError):
        parse_authority(text)


def test_authority_string_not_on_curve_is_rejected():
    import base58

    bad = b"\x02" + b"\x00" * 31  # y = 2 is not on the curve
    with pytest.raises(MembershipError, match="not a valid Ed25519"):
        parse_authority("otela-authority:" + base58.b58encode(bad).decode())


# --- expiry parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", NOW + 30 * DAY),
        ("12h", NOW + 12 * 3600),
        ("90m", NOW + 90 * 60),
        ("2w", NOW + 14 * DAY),
        (" 1.5d ", NOW + 1.5 * DAY),
        ("2027-01-31", datetime(2027, 1, 31, tzinfo=UTC).timestamp()),
        ("2027-01-31T12:00:00Z", datetime(2027, 1, 31, 12, tzinfo=UTC).timestamp()),
        ("2027-01-31T12:00:00", datetime(2027, 1, 31, 12, tzinfo=UTC).timestamp()),
        ("2027-01-31T14:00:00+02:00", datetime(2027, 1, 31, 12, tzinfo=UTC).timestamp()),
    ],
)
def test_parse_expiry(text, expected):
    now = datetime(2026, 1, 1, tzinfo=UTC).timestamp() if "2027" in text else NOW
    assert parse_expiry(text, now=now) == expected


@pytest.mark.parametrize("text", ["", "soon", "0d", "-1d", "30x", "2020-01-01", "30 days"])
def test_parse_expiry_rejects_junk_and_past(text):
    with pytest.raises(MembershipError):
        parse_expiry(text, now=datetime(2026, 1, 1, tzinfo=UTC).timestamp())


# --- authority key files -----------------------------------------------------------------------


def test_init_authority_writes_private_key_0600_and_printable_public(tmp_path):
    directory = tmp_path / "auth"
    public = init_authority(directory)
    key_file, pub_file = directory / "authority.key", directory / "authority.pub"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert len(key_file.read_bytes()) == 32
    assert parse_authority(pub_file.read_text()).to_bytes() == public.to_bytes()
    assert load_authority_public(directory).to_bytes() == public.to_bytes()
    private = load_authority_key(directory)
    assert private.get_public_key().to_bytes() == public.to_bytes()


def test_init_authority_refuses_to_overwrite(tmp_path):
    public = init_authority(tmp_path)
    with pytest.raises(MembershipError, match="already exists"):
        init_authority(tmp_path)
    assert load_authority_key(tmp_path).get_public_key().to_bytes() == public.to_bytes()
    (tmp_path / "authority.key").unlink()  # a lone authority.pub is also kept
    with pytest.raises(MembershipError, match="already exists"):
        init_authority(tmp_path)


def test_load_authority_key_errors(tmp_path):
    with pytest.raises(MembershipError, match="membership init"):
        load_authority_key(tmp_path)
    init_authority(tmp_path)
    key_file = tmp_path / "authority.key"
    os.chmod(key_file, 0o644)
    with pytest.raises(MembershipError, match="chmod 600"):
        load_authority_key(tmp_path)
    os.chmod(key_file, 0o600)
    key_file.write_bytes(b"short")
    with pytest.raises(MembershipError, match="32-byte"):
        load_authority_key(tmp_path)
    key_file.write_bytes(Ed25519PrivateKey.new().to_bytes())
    with pytest.raises(MembershipError, match="does not match"):
        load_authority_key(tmp_path)
