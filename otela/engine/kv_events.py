"""Following the engine's KV-cache events (``otela.kvcache``) over ZMQ, for cache-aware
routing: where the engine publishes them, and a task that feeds them to the node's
``CacheIndex`` while the node runs.

vLLM publishes on a ZMQ PUB socket it binds (``--kv-events-config``'s ``endpoint``,
``tcp://*:5557`` by default); the node connects a SUB socket to it. ZMQ connects before
the publisher binds and reconnects after it restarts, so the task starts with the engine
and needs no retry loop of its own. The socket is read without blocking, woken by trio
when its file descriptor becomes readable (ZMQ's descriptor is edge-triggered, so every
wake-up drains all queued messages, and a one-second timeout re-checks in any case).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

import trio

from otela.engine.command import option_value
from otela.kvcache.events import decode
from otela.kvcache.index import CacheIndex

log = logging.getLogger("otela.engine")

VLLM_DEFAULT_ENDPOINT = "tcp://*:5557"
RECHECK_S = 1.0


def events_endpoint(argv: Sequence[str], setting: str) -> tuple[str, str] | None:
    """(endpoint to connect to, topic) for the engine command ``argv`` under the
    ``kv_events`` setting, or ``None`` when there are no events to follow."""
    if setting == "off":
        return None
    if setting != "auto":
        return setting, ""
    raw = option_value(list(argv), ("--kv-events-config",))
    if raw is None:
        return None
    try:
        config = json.loads(raw)
    except ValueError:
        log.warning("--kv-events-config is not JSON; no cache-aware summaries")
        return None
    if not isinstance(config, dict) or not config.get("enable_kv_cache_events") or \
            config.get("publisher", "zmq") != "zmq":
        return None
    endpoint = str(config.get("endpoint") or VLLM_DEFAULT_ENDPOINT)
    for wildcard in ("*", "0.0.0.0"):
        endpoint = endpoint.replace(f"//{wildcard}:", "//127.0.0.1:")
    return endpoint, str(config.get("topic") or "")


async def follow_events(endpoint: str, topic: str, index: CacheIndex,
                        on_batch: Callable[[], None] = lambda: None) -> None:
    """Feed the engine's events at ``endpoint`` into ``index`` until cancelled."""
    try:
        import zmq
    except ImportError:
        log.warning("the engine publishes KV events but pyzmq is not installed "
                    "(pip install 'otela[cache]'): no cache-aware summaries")
        return
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    socket = context.socket(zmq.SUB)
    try:
        socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        socket.setsockopt(zmq.RCVHWM, 100_000)
        try:
            socket.connect(endpoint)
        except zmq.ZMQError as exc:  # e.g. a host name that does not resolve
            log.error("cannot follow the engine's KV events at %s: %s (no cache-aware "
                      "summaries from this node)", endpoint, exc)
            return
        log.info("following the engine's KV events at %s", endpoint)
        descriptor = int(socket.getsockopt(zmq.FD))
        while True:
            while int(socket.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                batch = decode(frames)
                if batch is None:
                    continue
                try:
                    index.apply(batch)
                except Exception:  # an engine's odd event must not stop the node
                    log.exception("KV event batch %d could not be indexed; starting "
                                  "the index over", batch.seq)
                    index.reset()
                on_batch()
            with trio.move_on_after(RECHECK_S):
                await trio.lowlevel.wait_readable(descriptor)
    finally:
        socket.close(linger=0)
