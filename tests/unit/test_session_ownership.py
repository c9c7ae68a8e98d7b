"""Only the peer that created a session can write its registry entry (hijack, forced LEFT).

The attacker in these tests is a full member: its own key, its own valid certificate, a
correct signature. What it must not be able to do is write a record for a session it did
not create, whatever state and version it claims.
"""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.crypto.ed25519 import Ed25519PrivateKey

from otela.registry.certificate import issue_certificate
from otela.registry.crdt import GMap, NotOwner, tiebreak_of
from otela.registry.records import Lifecycle
from otela.registry.session import epoch_of, new_session_id, owns, session_id_for
from otela.registry.wire import (
    FORGED,
    ForgedRecord,
    Trust,
    WireError,
    gossip_refusal,
    sign_eviction,
    sign_record,
    verify,
)

from .registry_helpers import entry, new_node, record

NOW = 1_800_000_000.0
OPEN = Trust()


def test_a_session_id_names_its_creator_and_nobody_else():
    alice, bob = new_node(), new_node()
    session = new_session_id(alice.peer_id, 1)
    assert owns(alice.peer_id, session)
    assert not owns(bob.peer_id, session)
    assert new_session_id(alice.peer_id, 1) != session  # a new one per start and rejoin
    assert epoch_of(new_session_id(alice.peer_id, 12345)) == 12345
    for junk in ("", "s1", session[:-1], session.upper(), "zz" + session[2:]):
        assert not owns(alice.peer_id, junk)
    with pytest.raises(ValueError):
        session_id_for(alice.peer_id, "not-hex-at-all!")


def hijack(victim_record, attacker, *, state=Lifecycle.SERVING, cert=None):
    """What the attacker of the security review published: the victim's session id, a
    higher version, and the attacker's own peer id, provider and URL, signed correctly."""
    forged = dataclasses.replace(
        victim_record, peer_id=attacker.peer_id, provider_id="attacker",
        http_url="http://attacker:9999", state=state, version=victim_record.version + 100,
    )
    return sign_record(forged, attacker.keys.private_key, cert)


@pytest.mark.parametrize("state", [Lifecycle.SERVING, Lifecycle.LEFT])
def test_a_member_cannot_sign_a_record_for_another_nodes_session(state):
    victim, attacker = new_node(), new_node()
    mine = record("v", 3, Lifecycle.SERVING, peer_id=victim.peer_id, updated_at=NOW)
    with pytest.raises(ForgedRecord) as err:
        verify(hijack(mine, attacker, state=state), OPEN, NOW)
    assert err.value.signer == attacker.peer_id


def test_a_valid_certificate_does_not_make_a_forgery_acceptable():
    authority = Ed25519PrivateKey.new()
    victim, attacker = new_node(), new_node()
    cert = issue_certificate(authority, peer_id=attacker.peer_id, provider_id="attacker",
                             expires_at=NOW + 3600, now=NOW - 60)
    mine = record("v", 3, Lifecycle.SERVING, peer_id=victim.peer_id, updated_at=NOW)
    with pytest.raises(ForgedRecord):
        verify(hijack(mine, attacker, cert=cert), Trust(authority.get_public_key()), NOW)


def test_gossip_validators_drop_forgeries_before_forwarding_them():
    victim, attacker = new_node(), new_node()
    mine = record("v", 3, Lifecycle.SERVING, peer_id=victim.peer_id, updated_at=NOW)
    forged = hijack(mine, attacker)
    assert gossip_refusal(forged, attacker.peer_id) == FORGED
    honest = sign_record(mine, victim.keys.private_key)
    assert gossip_refusal(honest, victim.peer_id) is None
    assert gossip_refusal(honest, attacker.peer_id) == "not published by its signer"


def test_an_eviction_cannot_smuggle_a_forged_record_in():
    victim, attacker = new_node(), new_node()
    mine = record("v", 3, Lifecycle.SERVING, peer_id=victim.peer_id, updated_at=NOW)
    forged_entry = dataclasses.replace(
        entry("v", 103, Lifecycle.SERVING, updated_at=NOW, peer_id=victim.peer_id),
        proof=hijack(mine, attacker),
    )
    eviction = sign_eviction(forged_entry, evictor_key=attacker.keys.private_key,
                             evictor_peer_id=attacker.peer_id, reason="x", now=NOW)
    with pytest.raises(WireError):
        verify(eviction, OPEN, NOW)


def test_the_map_refuses_an_entry_whose_record_is_not_the_sessions_owner():
    """Checked again at merge, whatever path the entry took (defence in depth)."""
    victim, attacker = new_node(), new_node()
    gmap = GMap()
    own = entry("v", 3, Lifecycle.SERVING, updated_at=NOW, peer_id=victim.peer_id)
    gmap.merge(own, NOW)
    forged_record = dataclasses.replace(own.record, peer_id=attacker.peer_id,
                                        state=Lifecycle.LEFT, version=99)
    forged = dataclasses.replace(own, record=forged_record, state=Lifecycle.LEFT, version=99,
                                 tiebreak=tiebreak_of(b"forged"))
    with pytest.raises(NotOwner):
        gmap.merge(forged, NOW)
    assert gmap.get(own.key) is own
    other_session = dataclasses.replace(own, key=new_session_id(victim.peer_id, 7))
    with pytest.raises(NotOwner):  # the record must be of the session it is stored under
        gmap.merge(other_session, NOW)


forgery_states = st.sampled_from(list(Lifecycle))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), forgery_states, st.integers(0, 200)), max_size=20))
def test_whatever_forgeries_arrive_the_owners_latest_record_is_what_replicas_hold(updates):
    victim, attacker = new_node(), new_node()
    gmap = GMap()
    latest = None
    for by_owner, state, version in updates:
        e = entry("v", version, state, updated_at=NOW, peer_id=victim.peer_id,
                  salt=str(by_owner))
        if by_owner:
            gmap.merge(e, NOW)
            latest = e if latest is None or e.rank() > latest.rank() else latest
        else:
            forged = dataclasses.replace(
                e, record=dataclasses.replace(e.record, peer_id=attacker.peer_id))
            with pytest.raises(NotOwner):
                gmap.merge(forged, NOW)
    assert gmap.get(entry("v", peer_id=victim.peer_id).key) is latest
