import msgpack
import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.wire import (
    MAX_RECORD_BYTES,
    WireError,
    decode,
    decode_records,
    encode,
    encode_records,
    sign_record,
    verify_record,
)


def owned_record(key_pair, **changes):
    fields = dict(
        session_id="s1", peer_id=ID.from_pubkey(key_pair.public_key).to_base58(),
        provider_id="p", state=Lifecycle.SERVING, version=1, http_url="http://x",
    )
    fields.update(changes)
    return NodeRecord(**fields)


def test_signed_record_verifies_from_the_peer_id_alone():
    kp = create_new_key_pair()
    r = owned_record(kp)
    assert verify_record(sign_record(r, kp.private_key)) == r


def test_tampered_body_is_rejected():
    kp = create_new_key_pair()
    env = sign_record(owned_record(kp), kp.private_key)
    body = msgpack.unpackb(env["body"])
    body["state"] = "LEFT"
    with pytest.raises(WireError, match="bad signature"):
        verify_record({**env, "body": msgpack.packb(body)})


def test_a_node_cannot_sign_a_record_for_another_peer():
    victim, attacker = create_new_key_pair(), create_new_key_pair()
    forged = sign_record(owned_record(victim), attacker.private_key)
    with pytest.raises(WireError):
        verify_record(forged)


def test_batch_drops_bad_envelopes_and_keeps_good_ones():
    kp = create_new_key_pair()
    good = sign_record(owned_record(kp), kp.private_key)
    data = encode_records("snapshot", [good, {**good, "sig": b"\0" * 64}, {"v": 9}, "junk"])
    records, dropped = decode_records(data, "snapshot")
    assert [r for r, _ in records] == [verify_record(good)]
    assert dropped == 3


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"v": 2, "kind": "snapshot"})],
)
def test_malformed_messages_raise_wire_error(data):
    with pytest.raises(WireError):
        decode(data)


def test_oversized_messages_are_refused_before_parsing():
    with pytest.raises(WireError, match="exceeds"):
        decode(b"\0" * 100, limit=10)
    kp = create_new_key_pair()
    huge = owned_record(kp, provider_id="x" * (MAX_RECORD_BYTES + 1))
    with pytest.raises(WireError, match="exceeds"):
        sign_record(huge, kp.private_key)


def test_wrong_kind_is_rejected():
    with pytest.raises(WireError):
        decode_records(encode({"kind": "gossip", "records": []}), "snapshot")
