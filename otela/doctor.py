"""Plain-language connectivity verdicts, from the facts ``GET /v1/network`` reports.

Pure functions over the report's JSON, so the daemon (which embeds the verdicts in
``/v1/network``) and ``otela doctor`` (which may talk to an older node) say the same thing,
and every cause can be tested without a network. Each verdict names the cause first and
then what to do about it.
"""

from __future__ import annotations

import ipaddress
import time
from typing import Any


def _when(at: float | None) -> str:
    if not at:
        return "an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _ports(report: dict[str, Any]) -> str:
    ports = report.get("nat", {}).get("dial_back", {}).get("listen_ports") or []
    return "/".join(str(p) for p in ports) or "(the p2p port)"


def bootstrap_verdict(report: dict[str, Any]) -> str | None:
    """A verdict when no configured bootstrap peer is connected and dials to them fail."""
    entries = report.get("bootstrap", [])
    if not entries or any(b.get("connected") for b in entries):
        return None
    failing = [b for b in entries if b.get("failures")]
    if not failing:
        return None
    worst = failing[0]
    return (
        f"bootstrap unreachable: {len(failing)} of {len(entries)} bootstrap peer(s) could not be "
        f"reached ({worst['addr']}: {worst.get('failures')} failed attempt(s), last error: "
        f"{worst.get('last_error')}). The node keeps retrying with backoff. Check that the "
        f"address and peer id are right, that the bootstrap node is running, and that outbound "
        f"TCP to it is allowed."
    )


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _advertised_ips(report: dict[str, Any]) -> list[str]:
    """The IPs of our own direct (non-circuit) advertised multiaddrs."""
    out = []
    for addr in report.get("self", {}).get("addrs", []):
        parts = str(addr).split("/")
        if "p2p-circuit" not in parts and len(parts) > 2 and parts[1] in ("ip4", "ip6"):
            out.append(parts[2])
    return out


def address_verdict(report: dict[str, Any]) -> str | None:
    """A warning when we advertise only addresses that connected peers elsewhere cannot
    dial: loopback while peers on other hosts are connected, or private addresses while
    peers at public addresses are (they are outside our network)."""
    ours = [ip for ip in map(_ip, _advertised_ips(report)) if ip is not None]
    nat = report.get("nat", {})
    seen = [a.get("observed_ip") for a in nat.get("dial_back", {}).get("answers", [])]
    peers = [ip for ip in map(_ip, [*nat.get("peer_ips", []), *filter(None, seen)])
             if ip is not None and not ip.is_loopback]
    if not ours or not peers:
        return None
    listed = ", ".join(str(ip) for ip in ours)
    if all(ip.is_loopback for ip in ours):
        return (
            f"advertising only loopback ({listed}) while peers on other hosts are connected "
            f"(e.g. {peers[0]}): they cannot dial this node or send it requests. Listen on "
            f"a reachable address (--host 0.0.0.0 advertises every interface) or set "
            f"--public-host to an address they reach."
        )
    public_peers = [ip for ip in peers if ip.is_global]
    if public_peers and all(ip.is_private or ip.is_loopback for ip in ours):
        return (
            f"advertising only private addresses ({listed}) while peers at public addresses "
            f"are connected (e.g. {public_peers[0]}): outside this network they cannot dial "
            f"this node directly. Set --public-host to its public address (with TCP port "
            f"{_ports(report)} forwarded), or let it be reached through a relay."
        )
    return None


def self_verdict(report: dict[str, Any]) -> str:
    """What is wrong (or right) with this node's own connectivity."""
    problems = []
    boot = bootstrap_verdict(report)
    if boot:
        problems.append(boot)
    addresses = address_verdict(report)
    if addresses:
        problems.append(addresses)
    nat = report.get("nat", {})
    state = nat.get("reachability", "unknown")
    answers = nat.get("dial_back", {}).get("answers", [])
    observed = sorted({a["observed_ip"] for a in answers if a.get("observed_ip")})
    if state == "public":  # only peers elsewhere decide (otela.mesh.reachability)
        observed = [ip for ip in observed if not ((i := _ip(ip)) and i.is_loopback)] or observed
    where = f"{'/'.join(observed) or 'our address'}:{_ports(report)}"
    if state == "unreachable":
        relays = nat.get("known_relays", [])
        errors = nat.get("reservation_errors", {})
        if not relays:
            why = "no node in the registry offers relaying"
        else:
            why = "; ".join(f"relay {k}: {v}" for k, v in errors.items()) or (
                f"{len(relays)} relay(s) known, reserving")
        problems.append(
            f"behind NAT, no relay reservation: {len(answers)} peer(s) could not open a TCP "
            f"connection to {where}, and {why}. Start a relay with `otela start --relay` on a "
            f"host with a public address, or open/forward TCP port {_ports(report)} to this host."
        )
    elif state == "private-relayed":
        relays = [r["relay_peer_id"] for r in nat.get("reservations", [])]
        problems.append(
            f"behind NAT, reachable through relay(s) {', '.join(relays)}; peers send requests "
            f"over libp2p (hole punching upgrades to direct where both NATs allow)."
        )
    elif state == "public":
        problems.append(f"publicly reachable (peers dialed back {where}).")
    elif nat.get("local_only"):
        problems.append(
            "reachability not known: only peers on this host answered the dial-back check "
            "(they reached a loopback address, which says nothing about other hosts); a "
            "peer on another host decides once it connects."
        )
    else:
        problems.append(
            f"reachability not known yet: no connected peer has answered a dial-back check "
            f"({report.get('connected_peers', 0)} connected)."
        )
    return " ".join(problems)


def peer_verdict(peer: dict[str, Any]) -> str:
    """Why a peer is (not) reachable, from its entry in the report's ``peers``."""
    pid = peer.get("peer_id", "?")
    record = peer.get("record")
    log = peer.get("log") or {}
    errors = log.get("dial_errors") or []
    last_error = f" Last dial error: {errors[-1]['error']}" if errors else ""
    if record is None and not log:
        return (
            f"peer {pid} never appeared: no registry record and no connection or dial attempt. "
            f"It may not have started, may use another bootstrap (federation), or cannot reach "
            f"any peer of ours; run `otela doctor` on it."
        )
    if record is not None:
        state = record.get("state")
        if state == "LEFT":
            at = _when(peer.get("left_at"))
            if peer.get("evicted_by"):
                return (
                    f"peer left at {at}: evicted by {peer['evicted_by']} after it stopped "
                    f"answering probes (crash, kill or network loss), not a clean shutdown."
                )
            return f"peer left at {at}: it announced LEFT (a clean shutdown)."
        if peer.get("suspected"):
            return f"peer {pid} is suspected: recent probes failed; it has a few seconds to refute."
        if state == "DOWN":
            return f"peer {pid} is DOWN: its engine failed or it is draining."
        if record.get("reachability") == "unreachable":
            return (
                f"peer {pid} is behind NAT with no relay reservation, so nobody can dial it: "
                f"start a relay with `otela start --relay` on a public host, or open its port."
                + last_error
            )
    connection = log.get("connection")
    if connection:
        punch = log.get("hole_punch") or {}
        extra = ""
        if punch.get("upgraded_to_direct"):
            extra = f" (hole punching upgraded it after {punch.get('upgrade_after_s')}s)"
        elif connection == "relayed":
            extra = " (through a relay; no hole-punched direct connection yet)"
        return f"peer {pid} is connected, {connection}{extra}."
    if errors:
        return f"peer {pid} is known but not connected.{last_error}"
    return (f"peer {pid} is known and not connected right now (last contact "
            f"{_when(log.get('last_contact'))}); it is reached on demand.")


def render(report: dict[str, Any], peer_id: str | None = None) -> str:
    """The text ``otela doctor`` prints."""
    me = report.get("self", {})
    nat = report.get("nat", {})
    lines = [
        f"node      {me.get('peer_id')}",
        f"addresses {', '.join(me.get('addrs', [])) or '-'}",
        f"reach     {nat.get('reachability')}"
        + (" (offers relay reservations)" if nat.get("offers_relay") else ""),
    ]
    for r in nat.get("reservations", []):
        lines.append(f"relay     {r['relay_peer_id']} -> {', '.join(r['circuit_addrs'])}")
    for b in report.get("bootstrap", []):
        state = "connected" if b.get("connected") else f"{b.get('failures', 0)} failed dial(s)"
        lines.append(f"bootstrap {b['addr']}: {state}")
    liveness = report.get("liveness") or {}
    if liveness.get("cut_off"):
        lines.append(
            "liveness  cut off: most members picked at random do not answer a connect, so "
            "this node evicts no one (the smaller side of a partition, or its own network "
            "is down); it drops what it suspected once most members answer again")
    if liveness.get("eviction_brake"):
        lines.append(
            f"liveness  eviction brake on: {len(liveness.get('suspected', {}))} of "
            f"{liveness.get('members')} peers suspected at once, so evictions go one at a "
            f"time (an overloaded federation, a partition, or trouble on this node)")
    lines.append(f"verdict   {report.get('verdict')}")
    if peer_id is not None:
        peer = report.get("peer") or {"peer_id": peer_id}
        lines.append("")
        lines.append(f"peer      {peer_id}")
        record = peer.get("record") or {}
        if record:
            lifecycle = record.get("state")
            shown = record.get("display_state") or lifecycle
            lines.append(f"state     {shown if shown == lifecycle else f'{shown} ({lifecycle})'}, "
                         f"reachability {record.get('reachability')}")
            lines.append(f"addresses {', '.join(record.get('addrs', [])) or '-'}")
            if record.get("circuit_addrs"):
                lines.append(f"circuits  {', '.join(record['circuit_addrs'])}")
        log = peer.get("log") or {}
        if log.get("last_contact"):
            lines.append(f"contact   {_when(log['last_contact'])}")
        for err in log.get("dial_errors", []):
            lines.append(f"dial err  {_when(err['at'])} {err['addr']}: {err['error']}")
        for event in peer.get("liveness_events", [])[-5:]:
            lines.append(f"liveness  {_when(event['at'])} {event['event']}: {event['detail']}")
        lines.append(f"verdict   {peer.get('verdict') or peer_verdict(peer)}")
    return "\n".join(lines)
