"""Where server-sent events end: the one splitter every reader of an event stream uses. Pure.

An event ends at a blank line, written ``\\n\\n`` by most engines and ``\\r\\n\\r\\n`` by
some (the SSE specification allows both, and ``\\r`` alone, which no engine sends). The
relay (``sse_events.WholeEvents``), the usage filter (``sse_usage``), the ingress's usage
tap (``exchange.UsageTap``) and trace replay (``traces.replay.sse``) all cut streams here,
so an engine writing CRLF is read alike by every one of them.
"""

from __future__ import annotations

LF_END = b"\n\n"
CRLF_END = b"\r\n\r\n"


def ends_with_event(data: bytes) -> bool:
    """Whether ``data`` ends exactly at the end of an event (how engines mostly write)."""
    return data.endswith(LF_END) or data.endswith(CRLF_END)


def last_event_end(data: bytes) -> int:
    """The index just past the last complete event in ``data``; 0 if there is none."""
    lf, crlf = data.rfind(LF_END), data.rfind(CRLF_END)
    if lf < 0 and crlf < 0:
        return 0
    # "\r\n\r\n" contains no "\n\n", so the later of the two is the last event's end.
    return crlf + 4 if crlf >= 0 and crlf + 2 > lf else lf + 2


def split_events(data: bytes) -> list[bytes]:
    """``data`` cut into events, each with its blank-line terminator; an unterminated
    remainder, if any, last."""
    out, start = [], 0
    while start < len(data):
        lf, crlf = data.find(LF_END, start), data.find(CRLF_END, start)
        if lf < 0 and crlf < 0:
            out.append(data[start:])
            break
        end = crlf + 4 if crlf >= 0 and (lf < 0 or crlf <= lf) else lf + 2
        out.append(data[start:end])
        start = end
    return out


MAX_PARTIAL_BYTES = 1024 * 1024  # an "event" longer than this is not one we wait for


class EventSplitter:
    """Feed a stream's chunks in order; ``feed`` returns the events they complete (each
    with its terminator), holding back the incomplete one at the end, up to
    ``MAX_PARTIAL_BYTES``: beyond that, what is held is given up as it is (a stream that
    is not made of events must not grow a reader's memory without end)."""

    def __init__(self) -> None:
        self.partial = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        if not self.partial and ends_with_event(chunk):
            return split_events(chunk)
        data = self.partial + chunk if self.partial else chunk
        end = last_event_end(data)
        self.partial = data[end:]
        if len(self.partial) > MAX_PARTIAL_BYTES:
            self.partial, data, end = b"", data, len(data)
            return [data]
        return split_events(data[:end]) if end else []

    def rest(self) -> bytes:
        """What is held when the stream ends (its last, unterminated event)."""
        rest, self.partial = self.partial, b""
        return rest
