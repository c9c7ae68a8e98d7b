"""Event streams are relayed whole events at a time (otela.dataplane.sse_events,
sse_usage)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from otela.dataplane.sse_events import MAX_PARTIAL_BYTES, WholeEvents
from otela.dataplane.sse_usage import UsageChunkFilter

STREAM = (b": hello\n\ndata: {\"a\": 1}\n\ndata: {\"choices\": [], \"usage\": "
          b"{\"prompt_tokens\": 1}}\n\r\n\r\ndata: caf\xc3\xa9\n\ndata: [DONE]\n\n")


def cuts(data: bytes) -> st.SearchStrategy[list[bytes]]:
    return st.lists(st.integers(0, len(data)), max_size=12).map(
        lambda points: [data[a:b] for a, b in zip([0, *sorted(points)],
                                                  [*sorted(points), len(data)], strict=True)])


@given(cuts(STREAM))
def test_every_byte_comes_out_in_order_and_only_whole_events_before_the_end(chunks):
    events = WholeEvents()
    out = b""
    for chunk in chunks:
        released = events.feed(chunk)
        out += released
        if released:
            assert out.endswith((b"\n\n", b"\r\n\r\n")) and events.at_boundary
    assert out + events.end() == STREAM


@given(cuts(STREAM))
def test_the_usage_filter_removes_only_the_usage_chunk_however_it_arrives(chunks):
    usage = UsageChunkFilter()
    out = b"".join(usage.feed(chunk) for chunk in chunks) + usage.end()
    assert out == STREAM.replace(b"data: {\"choices\": [], \"usage\": "
                                 b"{\"prompt_tokens\": 1}}\n\r\n\r\n", b"")
    assert usage.removed == 1


def test_a_stream_without_event_ends_is_passed_on_past_the_limit():
    events = WholeEvents()
    assert events.feed(b"x" * 1000) == b""  # may still become an event
    blob = b"y" * MAX_PARTIAL_BYTES
    assert events.feed(blob) == b"x" * 1000 + blob and not events.at_boundary
    assert events.feed(b"data: 1\n\n") == b"data: 1\n\n" and events.at_boundary
