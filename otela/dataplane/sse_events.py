"""Server-sent event streams relayed whole events at a time.

``WholeEvents`` holds back the incomplete event at the end of what has arrived until its
end comes. Then a stream the serving node breaks off can be ended with an error event
that parses (``relay``), instead of one glued to half an event. At most
``MAX_PARTIAL_BYTES`` are held; a stream that has not ended an event by then is passed
on as it comes. Subclasses may change complete events on their way out
(``sse_usage.UsageChunkFilter``).

The error event fits the stream. Chat and completions streams are unnamed ``data:`` events,
and their clients raise on a data object with an ``error``. The Responses and Messages APIs
name every event (``event: response.created``, ``event: message_start``), and Anthropic's
clients skip unnamed events altogether: a broken Messages stream ended with an unnamed error
would look to them like an answer that simply stopped. So in a named stream the error is
``event: error`` with ``{"type": "error", "error": {...}}``, Anthropic's shape, which the
``openai`` client also raises on (it has an ``error`` object).
"""

from __future__ import annotations

from otela.dataplane.sse import LF_END, MAX_PARTIAL_BYTES, ends_with_event, last_event_end

EVENT_END = LF_END


def is_event_stream(content_type: bytes | None) -> bool:
    return (content_type or b"").split(b";", 1)[0].strip().lower() == b"text/event-stream"


def error_event(error_json: bytes, at_boundary: bool, named: bool = False) -> bytes:
    """An event carrying an OpenAI-style error body (``{"error": {...}}``); in a stream of
    ``named`` events, an ``event: error`` whose body also says ``"type": "error"`` (module
    docstring). After a partial event (only when the stream was not made of events we could
    find), a blank line first, so that it parses."""
    if named:
        event = b'event: error\ndata: {"type":"error",' + error_json[1:] + EVENT_END
    else:
        event = b"data: " + error_json + EVENT_END
    return event if at_boundary else EVENT_END + event


class WholeEvents:
    """Feed an event stream's chunks in order; relay what ``feed`` and ``end`` return:
    the same bytes, each event's released once it is complete."""

    def __init__(self) -> None:
        self._partial = b""
        self.at_boundary = True  # what was released so far ends between two events
        # Whether the stream names its events (``event:`` before the first ``data:``);
        # None until its first data line has been seen.
        self.named: bool | None = None

    def feed(self, chunk: bytes) -> bytes:
        if self.named is None:
            self._find_names(chunk)
        if not self._partial and ends_with_event(chunk):
            return self.released(chunk)  # whole events, as engines mostly write them
        data = self._partial + chunk
        end = last_event_end(data)
        if not end:
            if len(data) > MAX_PARTIAL_BYTES:  # not events as we know them: pass it on
                self._partial = b""
                self.at_boundary = False
                return data
            self._partial = data
            return b""
        whole, self._partial = data[:end], data[end:]
        return self.released(whole)

    def _find_names(self, chunk: bytes) -> None:
        lines = b"\n" + chunk  # only until the first data line: the stream's first bytes
        data_at, event_at = lines.find(b"\ndata:"), lines.find(b"\nevent:")
        if event_at >= 0 and (data_at < 0 or event_at < data_at):
            self.named = True
        elif data_at >= 0:
            self.named = False

    def released(self, whole: bytes) -> bytes:
        """Complete events on their way out (a subclass may change them)."""
        self.at_boundary = True
        return whole

    def drop_partial(self) -> None:
        """Forget an unfinished event: its stream broke off before it was complete, so
        the client never had it (a continuation starts at an event boundary)."""
        self._partial = b""
        self.at_boundary = True

    def end(self) -> bytes:
        """What is held when the stream ends properly (its last, unterminated event)."""
        rest, self._partial = self._partial, b""
        return rest
