"""The one SSE splitter (otela.dataplane.sse) and the readers built on it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otela.dataplane.exchange import UsageTap
from otela.dataplane.sse import (
    MAX_PARTIAL_BYTES,
    EventSplitter,
    last_event_end,
    split_events,
)
from traces.replay.sse import StreamState

STREAM = (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
          b'data: {"choices":[{"delta":{"content":"b"}}]}\r\n\r\n'
          b'event: response.output_text.delta\ndata: {"delta":"c"}\n\n'
          b'data: [DONE]\n\n')
EVENTS = split_events(STREAM)


def test_events_end_at_lf_and_crlf_blank_lines_alike():
    assert len(EVENTS) == 4 and b"".join(EVENTS) == STREAM
    assert EVENTS[1].endswith(b"\r\n\r\n") and EVENTS[2].startswith(b"event:")
    assert last_event_end(b"data: x\n\ndata: y") == len(b"data: x\n\n")
    assert last_event_end(b"data: x\r\n\r\n") == len(b"data: x\r\n\r\n")
    assert last_event_end(b"data: half") == 0
    assert split_events(b"data: x\n\ndata: y") == [b"data: x\n\n", b"data: y"]


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=8))
def test_any_cut_of_the_stream_gives_the_same_events(cuts):
    splitter, got, start = EventSplitter(), [], 0
    for cut in [*sorted(set(cuts)), len(STREAM)]:
        got += splitter.feed(STREAM[start:cut])
        start = cut
    assert got == EVENTS and splitter.rest() == b""


def test_a_stream_that_is_not_events_is_given_up_not_held_without_end():
    splitter = EventSplitter()
    assert splitter.feed(b"x" * MAX_PARTIAL_BYTES) == []
    assert splitter.feed(b"yy") == [b"x" * MAX_PARTIAL_BYTES + b"yy"]
    assert splitter.partial == b""


@pytest.mark.parametrize("end", [b"\n\n", b"\r\n\r\n"])
def test_the_usage_tap_reads_lf_and_crlf_streams_and_an_unterminated_last_event(end):
    tap = UsageTap(stream=True)
    body = (b'data: {"choices":[{"delta":{"content":"hi"}}]}' + end
            + b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}')
    for i in range(0, len(body), 7):
        tap.chunk(body[i:i + 7])
    assert tap.events == 1 and tap.prompt_tokens is None  # the last event is unterminated
    tap.finish()
    assert (tap.prompt_tokens, tap.completion_tokens) == (3, 2)


def test_trace_replay_counts_tokens_of_a_crlf_stream():
    state = StreamState()
    for i in range(0, len(STREAM), 5):
        state.feed(STREAM[i:i + 5], float(i))
    assert len(state.token_times) == 2 and state.done
