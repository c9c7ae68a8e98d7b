"""Am I reachable from the internet? A dial-back check over a fresh TCP connection.

py-libp2p's AutoNAT v1 server "dials back" with ``host.connect``, which returns the
connection the question arrived on, so a firewalled public node is told PUBLIC (measured,
docs/nat.md). otela asks peers to open a *new* TCP connection instead:

1. the client opens ``/otela/dialback/1`` and sends the TCP ports it listens on;
2. the server probes only the IP it observes the client at (no amplification: it can't be
   told to connect anywhere else), at most ``MAX_PORTS`` ports, each with a 2 s timeout;
3. a probe succeeds when a multistream-select greeting comes back, i.e. a libp2p listener
   answered on that address;
4. the server replies with the observed IP and the addresses that answered.

A node is public if any peer on another host reached it, private if every such peer that
answered could not. Answers from peers on this host (they observed us at a loopback
address) say nothing about other hosts: a node they alone reached was reported public
while advertising only 127.0.0.1, so they decide nothing (``only_local``).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

from otela.mesh.addresses import is_loopback
from otela.mesh.connections import is_relayed
from otela.mesh.quota import SMALL_STREAMS, set_capped_handler
from otela.registry.records import PRIVATE_RELAYED, PUBLIC, UNKNOWN, UNREACHABLE

log = logging.getLogger("otela.nat")

DIALBACK_PROTOCOL = TProtocol("/otela/dialback/1")
PROBE_TIMEOUT_S = 2.0
ASK_TIMEOUT_S = 8.0
MAX_PORTS = 4
MAX_MESSAGE = 4096
MAX_CONCURRENT_PROBES = 8
_GREETING = b"/multistream/1.0.0\n"


class DialBackError(ValueError):
    """A dial-back exchange failed or the peer answered nonsense."""


@dataclass(frozen=True)
class DialBackAnswer:
    """What one peer saw: our IP as it observed it, and which of our ports answered."""

    peer_id: str
    observed_ip: str | None
    reachable: tuple[str, ...]
    error: str | None = None
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {
            "peer_id": self.peer_id,
            "observed_ip": self.observed_ip,
            "reachable": list(self.reachable),
            "error": self.error,
            "at": self.at,
        }


def _from_elsewhere(answer: DialBackAnswer) -> bool:
    """An answer from a peer on another host (it saw us at a non-loopback address)."""
    return answer.error is None and answer.observed_ip is not None \
        and not is_loopback(answer.observed_ip)


def verdict(answers: list[DialBackAnswer]) -> bool | None:
    """True: public (a peer on another host reached us); False: every such peer says no;
    None: no answer from another host."""
    remote = [a for a in answers if _from_elsewhere(a)]
    if any(a.reachable for a in remote):
        return True
    return False if remote else None


def only_local(answers: list[DialBackAnswer]) -> bool:
    """Peers answered, all of them on this host: nothing more to learn until one from
    another host connects (so the check settles instead of retrying every few seconds)."""
    valid = [a for a in answers if a.error is None]
    return bool(valid) and not any(_from_elsewhere(a) for a in valid)


def reachability(public: bool | None, reservations: int) -> str:
    """The state a node reports: public / private-relayed / unreachable / unknown."""
    if public is None:
        return UNKNOWN
    if public:
        return PUBLIC
    return PRIVATE_RELAYED if reservations else UNREACHABLE


async def probe(ip: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """A fresh TCP connection to ``ip:port`` that a libp2p listener answers."""
    with trio.move_on_after(timeout):
        try:
            sock = await trio.open_tcp_stream(ip, port)
        except OSError:
            return False
        try:
            await sock.send_all(encode_varint_prefixed(_GREETING))
            data = await sock.receive_some(64)
            return _GREETING.strip() in data
        except (OSError, trio.BrokenResourceError):
            return False
        finally:
            await sock.aclose()
    return False


class DialBackServer:
    """Answers dial-back questions; bounded so peers cannot make us a port scanner."""

    def __init__(self) -> None:
        self._limit = trio.Semaphore(MAX_CONCURRENT_PROBES)

    def install(self, host: Any) -> None:
        set_capped_handler(host, DIALBACK_PROTOCOL, self.handle, SMALL_STREAMS)

    async def handle(self, stream: Any) -> None:
        try:
            with trio.fail_after(ASK_TIMEOUT_S):
                request = json.loads(await read_varint_prefixed_bytes_limited(stream, MAX_MESSAGE))
                ports = parse_ports(request)
                remote = stream.get_remote_address()
                observed = remote[0] if remote else None
                reachable: list[str] = []
                if observed is not None and not is_relayed(getattr(stream, "muxed_conn", None)):
                    async with self._limit:
                        for port in ports:
                            if await probe(observed, port):
                                reachable.append(f"/ip4/{observed}/tcp/{port}")
                reply = {"observed": observed, "reachable": reachable}
                await stream.write(encode_varint_prefixed(json.dumps(reply).encode()))
        except Exception as exc:  # a bad question must never hurt the daemon
            log.debug("dial-back request failed: %s", exc)
            await stream.reset()
            return
        await stream.close()


def parse_ports(request: Any) -> list[int]:
    if not isinstance(request, dict) or not isinstance(request.get("ports"), list):
        raise DialBackError("expected {'ports': [int, ...]}")
    ports = [
        p for p in request["ports"]
        if isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536
    ]
    return sorted(set(ports))[:MAX_PORTS]


async def ask(host: Any, peer_id: ID, ports: list[int]) -> DialBackAnswer:
    """Ask ``peer_id`` to dial us back at ``ports``; errors become an answer with ``error``."""
    name = peer_id.to_base58()
    try:
        with trio.fail_after(ASK_TIMEOUT_S):
            stream = await host.new_stream(peer_id, [DIALBACK_PROTOCOL])
            try:
                await stream.write(encode_varint_prefixed(json.dumps({"ports": ports}).encode()))
                raw = await read_varint_prefixed_bytes_limited(stream, MAX_MESSAGE)
            finally:
                await stream.close()
        reply = json.loads(raw)
        observed = reply.get("observed")
        reachable = tuple(str(a) for a in reply.get("reachable", ()))
        return DialBackAnswer(name, None if observed is None else str(observed), reachable)
    except trio.TooSlowError:
        return DialBackAnswer(name, None, (), error=f"no answer in {ASK_TIMEOUT_S:.0f}s")
    except Exception as exc:
        return DialBackAnswer(name, None, (), error=f"{type(exc).__name__}: {exc}")


def listen_ports(host: Any) -> list[int]:
    """The TCP ports this host listens on (what a peer should dial back)."""
    ports: set[int] = set()
    for addr in host.get_addrs():
        try:
            ports.add(int(addr.value_for_protocol("tcp")))
        except Exception:
            continue
    return sorted(ports)
