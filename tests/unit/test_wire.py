"""Signed registry envelopes: what a replica accepts, and everything it must refuse."""

import dataclasses

import msgpack
import pytest
from libp2p.crypto.ed25519 import Ed25519PrivateKey

from otela.registry import evidence
from otela.registry.certificate import issue_certificate, issue_revocation
from otela.registry.crdt import Entry
from otela.registry.records import Lifecycle
from otela.registry.session import epoch_of
from otela.registry.wire import (
    MAX_RECORD_BYTES,
    Trust,
    UnjustifiedEviction,
    WireError,
    decode,
    encode,
    revocation_envelope,
    sign_eviction,
    sign_record,
    signer_of,
    verify,
    verify_record,
)

from .registry_helpers import new_node, record, sid

NOW = 1_800_000_000.0
OPEN = Trust()


def signed(node, session="s1", state=Lifecycle.SERVING, provider="lab", cert=None, **kw):
    rec = record(session, 3, state, peer_id=node.peer_id, provider=provider, updated_at=NOW, **kw)
    return sign_record(rec, node.keys.private_key, cert)


@pytest.fixture
def authority():
    return Ed25519PrivateKey.new()


def certify(authority, node, provider="lab", expires_at=NOW + 3600, serial=None):
    return issue_certificate(authority, peer_id=node.peer_id, provider_id=provider,
                             expires_at=expires_at, now=NOW - 60, serial=serial)


def test_a_record_verifies_from_its_peer_id_alone():
    node = new_node()
    entry = verify(signed(node), OPEN, NOW)
    assert isinstance(entry, Entry)
    assert (entry.key, entry.state, entry.version) == (
        sid("s1", node.peer_id), Lifecycle.SERVING, 3)
    assert signer_of(entry.proof) == node.peer_id


def test_tampered_and_forged_records_are_refused():
    victim, attacker = new_node(), new_node()
    env = signed(victim)
    body = msgpack.unpackb(env["body"])
    body["provider_id"] = "evil"
    with pytest.raises(WireError, match="bad signature"):
        verify({**env, "body": msgpack.packb(body)}, OPEN, NOW)
    forged = sign_record(record("s1", 9, Lifecycle.LEFT, peer_id=victim.peer_id,
                                updated_at=NOW), attacker.keys.private_key)
    with pytest.raises(WireError, match="bad signature"):
        verify(forged, OPEN, NOW)


def test_an_eviction_signature_cannot_be_replayed_as_a_record():
    member, target = new_node(), new_node()
    target_entry = verify(signed(target), OPEN, NOW)
    eviction = sign_eviction(target_entry, evictor_key=member.keys.private_key,
                             evictor_peer_id=member.peer_id, reason="dead", now=NOW)
    with pytest.raises(WireError):
        verify({**eviction, "t": "rec"}, OPEN, NOW)


@pytest.mark.parametrize("junk", [None, [], {"v": 2}, {"v": 1, "t": "nope"},
                                  {"v": 1, "t": "rec", "body": "str", "sig": b""},
                                  {"v": 1, "t": "rec", "body": b"\xc1", "sig": b"x"}])
def test_malformed_envelopes_are_refused(junk):
    with pytest.raises(WireError):
        verify(junk, OPEN, NOW)


def test_oversized_records_and_messages_are_refused():
    node = new_node()
    with pytest.raises(WireError, match="exceeds"):
        signed(node, provider="x" * (MAX_RECORD_BYTES + 1))
    with pytest.raises(WireError, match="exceeds"):
        decode(b"\0" * 100, limit=10)
    for data in (b"", b"\xc1", msgpack.packb([1]), encode({})[:-1] + b"\x02"):
        with pytest.raises(WireError):
            decode(data)


def test_with_an_authority_records_need_a_valid_certificate(authority):
    node = new_node()
    trust = Trust(authority=authority.get_public_key())
    with pytest.raises(WireError, match="no membership certificate"):
        verify(signed(node), trust, NOW)
    entry = verify(signed(node, cert=certify(authority, node)), trust, NOW)
    assert entry.cert_expires_at == NOW + 3600 and entry.cert_serial


def test_certificates_must_match_peer_and_provider_and_be_current(authority):
    node, other = new_node(), new_node()
    trust = Trust(authority=authority.get_public_key())
    cases = {
        "other peer": signed(node, cert=certify(authority, other)),
        "other provider": signed(node, provider="lab", cert=certify(authority, node, "rival")),
        "expired": signed(node, cert=certify(authority, node, expires_at=NOW - 1)),
        "other authority": signed(node, cert=certify(Ed25519PrivateKey.new(), node)),
    }
    for name, env in cases.items():
        with pytest.raises(WireError):
            verify(env, trust, NOW)
        assert name


def test_revoked_certificates_are_refused(authority):
    node = new_node()
    cert = certify(authority, node, serial="ab" * 8)
    trust = Trust(authority=authority.get_public_key(), revoked_serials={"ab" * 8})
    with pytest.raises(WireError, match="revoked"):
        verify(signed(node, cert=cert), trust, NOW)


def test_revocations_verify_only_against_the_authority(authority):
    data = issue_revocation(authority, serial="cd" * 8, peer_id=new_node().peer_id, now=NOW)
    revocation, _ = verify(revocation_envelope(data), Trust(authority.get_public_key()), NOW)
    assert revocation.serial == "cd" * 8
    with pytest.raises(WireError):
        verify(revocation_envelope(data), Trust(Ed25519PrivateKey.new().get_public_key()), NOW)
    with pytest.raises(WireError, match="no membership authority"):
        verify(revocation_envelope(data), OPEN, NOW)


def suspects(node, target_entry, at=NOW, incarnation=0, session=None):
    """``node``'s signed statement that it suspects ``target_entry``'s session."""
    return evidence.sign(node.keys.private_key.sign, node.peer_id, target_entry.record.peer_id,
                         session or target_entry.key, incarnation, at)


def test_a_member_eviction_is_a_left_tombstone_describing_the_session():
    member, target = new_node(), new_node()
    target_entry = verify(signed(target, models=("m",)), OPEN, NOW)
    witness = new_node()
    env = sign_eviction(target_entry, evictor_key=member.keys.private_key,
                        evictor_peer_id=member.peer_id, reason="unreachable", now=NOW + 5,
                        evidence=[suspects(member, target_entry),
                                  suspects(witness, target_entry)])
    entry = verify(env, Trust(is_member=lambda p: p in (member.peer_id, witness.peer_id)),
                   NOW + 5)
    assert entry.state is Lifecycle.LEFT and entry.evicted_by == member.peer_id
    assert entry.record.provider_id == "lab" and entry.version == target_entry.version
    assert signer_of(env) == member.peer_id


def test_evictions_by_non_members_and_forged_evictions_are_refused(authority):
    member, target, outsider = new_node(), new_node(), new_node()
    target_entry = verify(signed(target), OPEN, NOW)
    by_outsider = sign_eviction(target_entry, evictor_key=outsider.keys.private_key,
                                evictor_peer_id=outsider.peer_id, reason="x", now=NOW)
    with pytest.raises(WireError, match="not a member"):
        verify(by_outsider, Trust(is_member=lambda p: p == member.peer_id), NOW)
    with pytest.raises(WireError, match="certificate"):  # authority mode: evictor needs one
        verify(by_outsider, Trust(authority=authority.get_public_key()), NOW)
    claims_member = sign_eviction(target_entry, evictor_key=outsider.keys.private_key,
                                  evictor_peer_id=member.peer_id, reason="x", now=NOW)
    with pytest.raises(WireError, match="bad signature"):
        verify(claims_member, OPEN, NOW)
    self_eviction = sign_eviction(target_entry, evictor_key=target.keys.private_key,
                                  evictor_peer_id=target.peer_id, reason="x", now=NOW)
    with pytest.raises(WireError, match="itself"):
        verify(self_eviction, OPEN, NOW)


def test_eviction_needs_the_targets_own_signed_record():
    member = new_node()
    with pytest.raises(WireError, match="own signed record"):
        sign_eviction(Entry("s", Lifecycle.SERVING, 1, NOW, b"t", record("s")),
                      evictor_key=member.keys.private_key, evictor_peer_id=member.peer_id,
                      reason="x", now=NOW)


def test_record_signature_check_can_skip_membership_for_embedded_history(authority):
    node = new_node()
    env = signed(node)  # no certificate: fine only when membership is not checked
    trust = Trust(authority=authority.get_public_key())
    assert verify_record(env, trust, NOW, check_membership=False).key == sid("s1", node.peer_id)


def test_open_mode_accepts_evictions_from_known_nodes_even_if_they_were_evicted():
    """After a partition each side has evicted the other's evictors; rejecting their
    evictions would keep the halves apart forever."""
    from otela.membership.admission import Admission
    from otela.registry.store import Registry

    member, target, stranger, witness = new_node(), new_node(), new_node(), new_node()
    registry = Registry()
    member_entry = verify(signed(member, session="m"), OPEN, NOW)
    registry.apply(member_entry, NOW)
    registry.apply(verify(signed(witness, session="w"), OPEN, NOW), NOW)
    evicted_member = sign_eviction(member_entry, evictor_key=target.keys.private_key,
                                   evictor_peer_id=target.peer_id, reason="partition", now=NOW,
                                   evidence=[suspects(target, member_entry),
                                             suspects(witness, member_entry)])
    registry.apply(verify(evicted_member, OPEN, NOW), NOW)  # the member is LEFT here
    trust = Admission(None, None).trust(registry)
    target_entry = verify(signed(target, session="t"), OPEN, NOW)
    by_member = sign_eviction(target_entry, evictor_key=member.keys.private_key,
                              evictor_peer_id=member.peer_id, reason="partition", now=NOW,
                              evidence=[suspects(member, target_entry),
                                        suspects(witness, target_entry)])
    assert verify(by_member, trust, NOW).state is Lifecycle.LEFT
    by_stranger = sign_eviction(target_entry, evictor_key=stranger.keys.private_key,
                                evictor_peer_id=stranger.peer_id, reason="x", now=NOW)
    with pytest.raises(WireError, match="not a member"):
        verify(by_stranger, trust, NOW)


def test_an_eviction_needs_signed_suspicions_of_distinct_members():
    """One member's word is not enough where two others could testify: a member that
    evicts a rival's every session alone is refused everywhere, and named."""
    evictor, witness, target, outsider = new_node(), new_node(), new_node(), new_node()
    target_entry = verify(signed(target), OPEN, NOW)
    members = {evictor.peer_id, witness.peer_id, target.peer_id}
    trust = Trust(is_member=members.__contains__)

    def eviction(*statements):
        return sign_eviction(target_entry, evictor_key=evictor.keys.private_key,
                             evictor_peer_id=evictor.peer_id, reason="x", now=NOW,
                             evidence=list(statements))

    refused = [
        eviction(),
        eviction(suspects(evictor, target_entry)),  # its own word only
        eviction(suspects(evictor, target_entry), suspects(evictor, target_entry, NOW - 1)),
        eviction(suspects(evictor, target_entry), suspects(target, target_entry)),  # evictee
        eviction(suspects(evictor, target_entry), suspects(outsider, target_entry)),
        eviction(suspects(evictor, target_entry),
                 suspects(witness, target_entry, session=sid("older", target.peer_id))),
        eviction(suspects(evictor, target_entry),
                 suspects(witness, target_entry, at=NOW - evidence.MAX_AGE_S - 1)),
    ]
    forged = suspects(evictor, target_entry)
    refused.append(eviction(suspects(evictor, target_entry),
                            dataclasses.replace(forged, by=witness.peer_id)))
    for envelope in refused:
        with pytest.raises(UnjustifiedEviction) as caught:
            verify(envelope, trust, NOW)
        assert caught.value.evictor == evictor.peer_id
    both = eviction(suspects(evictor, target_entry), suspects(witness, target_entry, NOW - 30))
    assert verify(both, trust, NOW).state is Lifecycle.LEFT
    # The witness's statement is what counts, whoever signs the eviction (a backup).
    backup = sign_eviction(target_entry, evictor_key=outsider.keys.private_key,
                           evictor_peer_id=outsider.peer_id, reason="x", now=NOW,
                           evidence=[suspects(evictor, target_entry),
                                     suspects(witness, target_entry)])
    assert verify(backup, OPEN, NOW).evicted_by == outsider.peer_id
    early = sign_eviction(target_entry, evictor_key=evictor.keys.private_key,
                          evictor_peer_id=evictor.peer_id, reason="x",
                          now=epoch_of(target_entry.key) / 1000 - 1,
                          evidence=[suspects(evictor, target_entry),
                                    suspects(witness, target_entry)])
    with pytest.raises(UnjustifiedEviction, match="before the session began"):
        verify(early, trust, NOW)


def signed_body(node, changes, kind="rec", domain=None):
    """An envelope whose body is a member's own record with ``changes``, correctly signed:
    what a misbehaving member can send (a valid signature over junk)."""
    from otela.registry.wire import RECORD_DOMAIN

    body = msgpack.unpackb(signed(node)["body"])
    body.update(changes)
    data = msgpack.packb(body, use_bin_type=True)
    return {"v": 1, "t": kind, "body": data,
            "sig": node.keys.private_key.sign((domain or RECORD_DOMAIN) + data), "cert": None}


@pytest.mark.parametrize("changes", [
    {"version": float("inf")}, {"version": float("nan")}, {"version": -1},
    {"version": 2**63}, {"version": 2**64 - 1}, {"version": 1e300},
    {"updated_at": float("nan")}, {"updated_at": float("inf")},
    {"hardware": {"cpus": float("inf")}}, {"hardware": {"memory_bytes": 2**64 - 1}},
    {"hardware": [1, 2]}, {"models": [{"id": "m", "max_context": float("nan")}]},
    {"models": {"id": "m"}}, {"models": [[1, 2]]}, {"slurm": {"job_id": "1", "cpus": 1e400}},
    {"slurm": {"job_id": "1", "end_time": float("inf")}}, {"addrs": 7},
])
def test_signed_records_with_out_of_range_numbers_or_wrong_types_are_wire_errors(changes):
    """inf/nan or integers past 2**63 in a member's own signed record raised OverflowError
    (or were stored, and then broke every anti-entropy exchange that re-encoded them)."""
    with pytest.raises(WireError):
        verify(signed_body(new_node(), changes), OPEN, NOW)


@pytest.mark.parametrize("last", [[1, 2], "record", 7, None, b"bytes"])
def test_an_eviction_whose_record_is_not_a_map_is_a_wire_error(last):
    """It crashed the replica with AttributeError (``last.get``)."""
    from otela.registry.wire import EVICTION_DOMAIN

    member = new_node()
    body = msgpack.packb({"session_id": sid("s1"), "evictor": member.peer_id, "reason": "x",
                          "at": NOW, "last": last}, use_bin_type=True)
    env = {"v": 1, "t": "evict", "body": body,
           "sig": member.keys.private_key.sign(EVICTION_DOMAIN + body), "cert": None}
    with pytest.raises(WireError):
        verify(env, OPEN, NOW)
    nan_time = msgpack.packb({"session_id": sid("s1"), "evictor": member.peer_id,
                              "reason": "x", "at": float("nan"), "last": {}},
                             use_bin_type=True)
    with pytest.raises(WireError, match="finite"):
        verify({**env, "body": nan_time,
                "sig": member.keys.private_key.sign(EVICTION_DOMAIN + nan_time)}, OPEN, NOW)
