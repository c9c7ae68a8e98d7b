"""A microsecond mock OpenAI engine: answers completions instantly, for replay benchmarks.

It speaks just enough HTTP/1.1 (keep-alive, Content-Length bodies) and OpenAI streaming to
measure the replayer itself: each request is answered at once with `max_tokens` tokens
(capped by --max-tokens-cap), streamed as SSE events plus a usage chunk, or as one JSON
answer. No model, no queue: whatever latency a replay measures against it is the
replayer's and the kernel's. Optionally fails every N-th request (--fail-every) with a 503.

Run: ``python -m traces.replay.mock_engine --port 8011``.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal

import httptools
import trio

_MAX_TOKENS = re.compile(rb'"max_tokens"\s*:\s*(\d+)')
_STREAM = re.compile(rb'"stream"\s*:\s*true')
_PROMPT_IDS = re.compile(rb'"prompt"\s*:\s*\[([^\]]*)\]')


class _Request:
    __slots__ = ("body", "complete", "keep_alive", "parser", "url")

    def __init__(self) -> None:
        self.body = bytearray()
        self.complete = False
        self.keep_alive = True
        self.url = b""
        self.parser = httptools.HttpRequestParser(self)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, data: bytes) -> None:
        self.body += data

    def on_message_complete(self) -> None:
        self.complete = True


def _token_event(i: int) -> bytes:
    return (
        b'data: {"id":"cmpl-mock","object":"text_completion",'
        b'"choices":[{"index":0,"text":" t%d"}]}\n\n' % i
    )


def answer(body: bytes, cap: int, fail: bool) -> bytes:
    """The whole HTTP response for one request body."""
    if fail:
        payload = b'{"error":{"message":"mock engine: injected failure","type":"overloaded"}}'
        return (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
        )
    m = _MAX_TOKENS.search(body)
    n = max(1, min(int(m.group(1)) if m else 16, cap))
    p = _PROMPT_IDS.search(body)
    prompt = p.group(1).count(b",") + 1 if p and p.group(1).strip() else 1
    usage = b'"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
        prompt,
        n,
        prompt + n,
    )
    if _STREAM.search(body):
        parts = [_token_event(i) for i in range(n)]
        parts.append(
            b'data: {"id":"cmpl-mock","object":"text_completion","choices":[],%s}\n\n' % usage
        )
        parts.append(b"data: [DONE]\n\n")
        payload = b"".join(parts)
        ctype = b"text/event-stream"
    else:
        text = b"".join(b" t%d" % i for i in range(n))
        payload = (
            b'{"id":"cmpl-mock","object":"text_completion","choices":[{"index":0,"text":"%s",'
            b'"finish_reason":"length"}],%s}' % (text, usage)
        )
        ctype = b"application/json"
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        ctype,
        len(payload),
        payload,
    )


class MockEngine:
    def __init__(self, cap: int, fail_every: int) -> None:
        self.cap = cap
        self.fail_every = fail_every
        self.count = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            req = _Request()
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                try:
                    req.parser.feed_data(data)
                except httptools.HttpParserError:
                    return
                if not req.complete:
                    continue
                self.count += 1
                fail = bool(self.fail_every) and self.count % self.fail_every == 0
                if req.url.endswith(b"/v1/models"):
                    out = b'{"object":"list","data":[{"id":"mock","object":"model"}]}'
                    await stream.send_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(out), out)
                    )
                else:
                    await stream.send_all(answer(bytes(req.body), self.cap, fail))
                if not req.keep_alive:
                    return
                req = _Request()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m traces.replay.mock_engine", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--max-tokens-cap", type=int, default=64)
    ap.add_argument("--fail-every", type=int, default=0)
    args = ap.parse_args(argv)
    engine = MockEngine(args.max_tokens_cap, args.fail_every)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: trio.serve_tcp(engine.handle, args.port, host=args.host, backlog=1024)
            )
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

    trio.run(run)


if __name__ == "__main__":
    main()
