"""Writing an upstream's ``Reply`` to our client, as it arrives.

A reply whose body is already complete (most non-streaming answers: the engine wrote head
and body at once) leaves in one write with its ``Content-Length``. Otherwise the head goes
out at once and every chunk as it comes (an SSE stream event by event, backpressure from
the client included): with the upstream's ``Content-Length`` when it gave one, chunked
otherwise. Bodies are relayed as the bytes received, never re-encoded. A client that goes
away mid-stream ends the relay, and the reply is closed, which closes its connection.

An upstream that breaks off an event stream (its node or engine died) ends the client's
stream with an OpenAI-style error event (``data: {"error": {..., "code":
"upstream_failed"}}``) and a proper end: SSE clients, the official ones included, then
raise an API error at once, where a connection cut short reads, to many of them, like a
stream that simply stopped (or a hang until their own timeout). Anything else that breaks
off is cut short, so its client sees a truncated body, never a complete-looking one.

A broken chat or completions stream may instead be *continued* on another node
(``resume``, the ingress's request migration: ``otela.dataplane.migration``): the client
then sees one uninterrupted stream. Only when no node can continue it does the error
event end it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from otela.dataplane import headers as header_rules
from otela.dataplane.errors import RequestError, UpstreamFailed, clip, error_json
from otela.dataplane.exchange import UsageTap
from otela.dataplane.headers import Headers
from otela.dataplane.http import Response
from otela.dataplane.migration import Splice
from otela.dataplane.sse_events import WholeEvents, error_event, is_event_stream
from otela.dataplane.sse_usage import UsageChunkFilter
from otela.dataplane.upstream import Reply


@dataclass
class Continuation:
    """A broken stream's continuation: another node's reply, and how its events are
    spliced into the client's stream."""

    reply: Reply
    splice: Splice
    watched: AbstractContextManager[Any] | None = None  # as ``relay``'s


# Given the events the client has had, another node's continuation of them, or None.
Resume = Callable[[bytes], Awaitable[Continuation | None]]


async def relay(reply: Reply, response: Response, extra: Headers,
                tap: UsageTap | None = None, hide_usage: UsageChunkFilter | None = None,
                *, end_client_streams: bool = True, resume: Resume | None = None,
                watched: AbstractContextManager[Any] | None = None) -> int:
    """Send ``reply`` to the client with ``extra`` headers; the body bytes relayed. ``tap``
    sees every chunk as it goes (timing, usage), without changing it; ``hide_usage``
    removes the usage chunk the ingress asked a stream for (``sse_usage``).
    ``end_client_streams``: a broken event stream ends with an error event (what an end
    client should see); an engine hop passes False and cuts it short instead, as over
    libp2p, so the ingress learns that it broke and ends its client's stream itself.
    ``resume``: how a broken event stream may be continued on another node (module
    docstring); ``watched``: held while the body is read (the ingress's watch on the
    node, which aborts the reply if the node is suspected meanwhile: a node that froze
    mid-stream then breaks it off, and the stream is continued)."""
    out = header_rules.relayed(reply.headers, extra)
    rewrite = hide_usage is not None and reply.status == 200
    try:
        if reply.complete:
            body = reply.take_buffered()
            if tap is not None and body:
                tap.chunk(body)
            if rewrite and hide_usage is not None:
                body = hide_usage.feed(body) + hide_usage.end()
            await response.send(reply.status, out, body)
            return len(body)
        length = reply.content_length
        if length is not None and not rewrite:
            out.append((b"content-length", b"%d" % length))
        # An event stream we frame ourselves is relayed event by event, so that a break
        # can be ended with an error event (module docstring).
        events: WholeEvents | None = hide_usage if rewrite else \
            WholeEvents() if length is None and end_client_streams and \
            _is_event_stream(reply) else None
        await response.start(reply.status, out)
        sent = 0
        # what the client has had, kept (by reference) only where it may be continued
        relayed: list[bytes] | None = [] if resume is not None and events is not None \
            else None
        buffered = reply.take_buffered()
        if buffered:
            sent += await _forward(buffered, response, tap, events, relayed)
        try:
            with watched or nullcontext():
                async for chunk in reply.chunks():
                    sent += await _forward(chunk, response, tap, events, relayed)
        except UpstreamFailed as failure:
            if events is not None:
                if resume is not None and relayed is not None:
                    ended, added = await _continued(resume, relayed, response, tap, events)
                    sent += added
                    if ended:
                        await response.end()
                        return sent
                await response.write(_stream_error(str(failure), events))
                await response.end()
            else:
                response.abort()  # the client must see the body cut short
            return sent
        if events is not None:
            rest = events.end()
            if rest:
                await response.write(rest)
                sent += len(rest)
        await response.end()
        return sent
    finally:
        if tap is not None:
            tap.finish()
        await reply.aclose()


def _is_event_stream(reply: Reply) -> bool:
    return is_event_stream(header_rules.value(reply.headers, b"content-type"))


def _stream_error(reason: str, events: WholeEvents) -> bytes:
    """The event that ends a broken stream (named, in a stream of named events)."""
    message = f"the serving node broke off the stream: {clip(reason)}"
    return error_event(error_json(502, message, "upstream_failed"), events.at_boundary,
                       events.named is True)


async def _forward(chunk: bytes, response: Response, tap: UsageTap | None,
                   events: WholeEvents | None, relayed: list[bytes] | None = None) -> int:
    if tap is not None:
        tap.chunk(chunk)
    if events is not None:
        chunk = events.feed(chunk)
        if not chunk:
            return 0
        if relayed is not None:
            relayed.append(chunk)
    await response.write(chunk)
    return len(chunk)


async def _continued(resume: Resume, relayed: list[bytes], response: Response,
                     tap: UsageTap | None, events: WholeEvents) -> tuple[bool, int]:
    """Relay continuations of the stream until one ends it: whether one did, and the
    bytes they added (when none did, the caller ends the stream with an error event).
    Each continuation that breaks too is continued in turn, as ``resume`` allows."""
    events.drop_partial()  # an event the first node did not finish never reached the client
    if tap is not None:
        tap.drop_partial()
    added = 0
    while True:
        continuation = await resume(b"".join(relayed))
        if continuation is None:
            return False, added
        reply, splice = continuation.reply, continuation.splice
        try:
            buffered = reply.take_buffered()
            chunks = [buffered] if buffered else []
            try:
                for chunk in chunks:
                    added += await _spliced(chunk, splice, response, tap, events, relayed)
                with continuation.watched or nullcontext():
                    async for chunk in reply.chunks():
                        added += await _spliced(chunk, splice, response, tap, events,
                                                relayed)
            except UpstreamFailed:
                events.drop_partial()
                continue
            rest = events.end()
            if rest:
                await response.write(rest)
                added += len(rest)
            return True, added
        finally:
            await reply.aclose()


async def _spliced(chunk: bytes, splice: Splice, response: Response, tap: UsageTap | None,
                   events: WholeEvents, relayed: list[bytes]) -> int:
    whole = splice.feed(chunk)
    if not whole:
        return 0
    if tap is not None:
        tap.chunk(whole)
    relayed.append(whole)
    out = events.released(whole)  # the usage chunk filter, if any, still applies
    if out:
        await response.write(out)
    return len(out)


async def send_error(response: Response, error: RequestError,
                     extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """An OpenAI-style error; after a response has started, all we can do is end it."""
    if response.started:
        response.abort()
        return
    headers = [header_rules.JSON, *extra, *((k.encode(), v.encode()) for k, v in
                                      error.headers.items())]
    await response.send(error.status, headers,
                        error_json(error.status, error.message, error.code, error.param))
