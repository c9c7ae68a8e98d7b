"""Which addresses a node advertises, and the verdicts that depend on them (no network)."""

from __future__ import annotations

import socket
import struct
from typing import Any

from otela.doctor import address_verdict, self_verdict
from otela.mesh.addresses import (
    MAX_ADVERTISED,
    advertised_hosts,
    expand,
    interface_ipv4,
    parse_ifconf,
    select_hosts,
)
from otela.mesh.reachability import DialBackAnswer, only_local, verdict


def test_routable_first_loopback_last() -> None:
    hosts = select_hosts(["127.0.0.1", "172.17.0.1", "10.0.0.5", "8.8.4.4"], "10.0.0.5")
    assert hosts == ["10.0.0.5", "8.8.4.4", "172.17.0.1", "127.0.0.1"]


def test_without_a_default_route_public_before_private_before_link_local() -> None:
    hosts = select_hosts(["127.0.0.1", "169.254.1.1", "10.1.1.1", "1.2.3.4"], None)
    assert hosts == ["1.2.3.4", "10.1.1.1", "169.254.1.1", "127.0.0.1"]


def test_loopback_only_when_nothing_else_exists() -> None:
    assert select_hosts(["127.0.0.1"], None) == ["127.0.0.1"]
    assert select_hosts([], None) == ["127.0.0.1"]
    assert select_hosts(["0.0.0.0", "::1", "fe80::1", "not-an-ip", "224.0.0.1"]) == \
        ["127.0.0.1"]


def test_duplicates_dropped_and_count_bounded() -> None:
    many = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(100)]
    hosts = select_hosts(["10.0.0.1", *many], "10.0.0.1")
    assert len(hosts) == MAX_ADVERTISED and hosts[0] == "10.0.0.1"
    assert len(set(hosts)) == len(hosts)


def test_a_preferred_address_that_is_not_ours_is_ignored() -> None:
    assert select_hosts(["10.0.0.5"], "192.0.2.9") == ["10.0.0.5"]


def test_public_host_overrides_and_a_specific_listen_host_is_kept() -> None:
    assert advertised_hosts("0.0.0.0", "203.0.113.7") == ["203.0.113.7"]
    assert advertised_hosts("10.0.0.5", "203.0.113.7") == ["203.0.113.7"]
    assert advertised_hosts("10.0.0.5", None) == ["10.0.0.5"]
    wildcard = advertised_hosts("0.0.0.0", None)
    assert wildcard and "0.0.0.0" not in wildcard


def test_expand_replaces_the_listen_ip_once_per_host_in_order() -> None:
    listen = ["/ip4/0.0.0.0/tcp/4001/p2p/Me"]
    assert expand(listen, "0.0.0.0", ["10.0.0.5", "127.0.0.1"]) == [
        "/ip4/10.0.0.5/tcp/4001/p2p/Me", "/ip4/127.0.0.1/tcp/4001/p2p/Me"]
    assert expand(["/ip4/10.0.0.5/tcp/1/p2p/Me"], "10.0.0.5", ["203.0.113.7"]) == \
        ["/ip4/203.0.113.7/tcp/1/p2p/Me"]
    assert expand(["/ip4/10.0.0.5/tcp/1"], "10.0.0.5", ["10.0.0.5"]) == ["/ip4/10.0.0.5/tcp/1"]


def ifreq(name: bytes, family: int, ip: str) -> bytes:
    union = struct.pack("H", family) + b"\0\0" + socket.inet_aton(ip) + b"\0" * 16
    return name.ljust(16, b"\0") + union


def test_parse_ifconf_reads_ipv4_entries() -> None:
    raw = ifreq(b"lo", socket.AF_INET, "127.0.0.1") + ifreq(b"eth0", socket.AF_INET,
                                                             "10.0.0.5")
    raw += ifreq(b"x", socket.AF_INET6, "1.1.1.1")
    assert parse_ifconf(raw) == ["127.0.0.1", "10.0.0.5"]


def test_this_machine_lists_its_loopback() -> None:
    found = interface_ipv4()
    assert not found or "127.0.0.1" in found


def answer(observed: str | None, reachable: bool, error: str | None = None) -> DialBackAnswer:
    addrs = (f"/ip4/{observed}/tcp/1",) if reachable and observed else ()
    return DialBackAnswer("p", observed, addrs, error=error)


def test_loopback_dial_backs_never_make_a_node_public() -> None:
    local = answer("127.0.0.1", True)
    assert verdict([local]) is None and only_local([local])
    assert verdict([local, answer("10.0.0.9", False)]) is False
    assert verdict([local, answer("10.0.0.9", True)]) is True
    assert not only_local([local, answer("10.0.0.9", False)])
    assert not only_local([answer(None, False, error="timeout")])


def report(addrs: list[str], peer_ips: list[str], **nat: Any) -> dict[str, Any]:
    return {"self": {"peer_id": "me", "addrs": addrs},
            "nat": {"reachability": "unknown", "peer_ips": peer_ips, **nat}}


def test_doctor_warns_about_loopback_only_addresses_with_remote_peers() -> None:
    loop = ["/ip4/127.0.0.1/tcp/4001/p2p/me"]
    text = address_verdict(report(loop, ["127.0.0.1", "10.0.0.9"])) or ""
    assert "only loopback" in text and "10.0.0.9" in text and "--public-host" in text
    assert address_verdict(report(loop, ["127.0.0.1"])) is None
    assert "only loopback" in self_verdict(report(loop, ["10.0.0.9"]))


def test_doctor_warns_about_private_addresses_with_public_peers() -> None:
    private = ["/ip4/10.0.0.5/tcp/4001/p2p/me", "/ip4/127.0.0.1/tcp/4001/p2p/me"]
    text = address_verdict(report(private, ["8.8.8.8"])) or ""
    assert "only private" in text and "8.8.8.8" in text
    assert address_verdict(report(private, ["10.0.0.9"])) is None
    public = ["/ip4/8.8.4.4/tcp/4001/p2p/me"]
    assert address_verdict(report(public, ["8.8.8.8"])) is None


def test_doctor_says_why_reachability_is_unknown_with_only_local_peers() -> None:
    text = self_verdict(report(["/ip4/127.0.0.1/tcp/1/p2p/me"], ["127.0.0.1"],
                               local_only=True))
    assert "only peers on this host" in text and "publicly" not in text


def test_a_public_verdict_names_the_address_peers_elsewhere_reached() -> None:
    answers = [{"observed_ip": "127.0.0.1", "reachable": ["/ip4/127.0.0.1/tcp/1"]},
               {"observed_ip": "10.0.0.5", "reachable": ["/ip4/10.0.0.5/tcp/1"]}]
    text = self_verdict(report(["/ip4/10.0.0.5/tcp/1/p2p/me"], ["10.0.0.9"],
                               reachability="public", dial_back={"answers": answers}))
    assert "dialed back 10.0.0.5:" in text and "127.0.0.1" not in text
