"""A long body's fields, read without parsing the prompt, are what a full parse reads, and
bodies that are not acceptable JSON objects are refused as a full parse refuses them."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otela.dataplane.jsonbody import MAX_DEPTH, BodyError
from otela.dataplane.jsonfields import (
    LAZY_FROM,
    MAX_ESCAPED_QUOTES,
    BodyReader,
    LazyObject,
    materialized,
    read_fields,
)

LONG = "x" * LAZY_FROM

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(fields=st.dictionaries(st.text(max_size=10), json_values, max_size=6),
       indent=st.sampled_from([None, 1]), prompt=st.text(max_size=40))
def test_every_field_reads_as_a_full_parse_reads_it(fields: dict, indent: int | None,
                                                    prompt: str) -> None:
    body = {**fields, "messages": [{"role": "user", "content": prompt + LONG}]}
    raw = json.dumps(body, indent=indent, ensure_ascii=False).encode()
    read = read_fields(raw)
    assert dict(read.items()) == orjson.loads(raw)
    assert materialized(read) == orjson.loads(raw)


def test_a_long_prompt_is_scanned_and_decoded_only_when_read() -> None:
    raw = orjson.dumps({"messages": [{"role": "user", "content": 'say "hi"\\' + LONG}],
                        "model": "m", "stream": True, "max_tokens": 7})
    read = read_fields(raw)
    assert isinstance(read, LazyObject)
    assert (read["model"], read.get("stream"), read.get("max_tokens")) == ("m", True, 7)
    assert "messages" in read and "user" not in read and read.get("user") is None
    assert read["messages"][0]["content"].startswith('say "hi"\\')


def test_short_bodies_and_bodies_full_of_quotes_are_parsed_in_full() -> None:
    assert type(read_fields(b'{"model": "m"}')) is dict
    quoted = '"q" ' * (MAX_ESCAPED_QUOTES + 1)
    raw = orjson.dumps({"model": "m", "messages": [{"content": quoted + LONG}]})
    assert type(read_fields(raw)) is dict


@pytest.mark.parametrize("raw, code", [
    (b'[1, "' + LONG.encode() + b'"]', "invalid_json"),  # not an object
    (b'{"model": "m", "p": "' + LONG.encode() + b'"', "invalid_json"),  # not closed
    (b'{"model": "m", "p": "' + LONG.encode() + b'"} x', "invalid_json"),  # trailing
    (b'{"model": tru, "p": "' + LONG.encode() + b'"}', "invalid_json"),  # a bad scalar
    (b'{"model": "m", "p": "' + LONG.encode() + b'", }', "invalid_json"),
    (b'{"model": "m", "p": [' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b'], "q": "'
     + LONG.encode() + b'"}', "json_too_deep"),
])
def test_what_a_full_parse_refuses_is_refused(raw: bytes, code: str) -> None:
    with pytest.raises(BodyError) as caught:
        read_fields(raw)
    assert caught.value.code == code


def test_a_repeated_key_is_decided_by_the_full_parse() -> None:
    raw = b'{"model": "a", "model": "b", "p": "' + LONG.encode() + b'"}'
    assert read_fields(raw)["model"] == orjson.loads(raw)["model"] == "b"


def test_a_bad_escape_deep_in_a_long_prompt_is_left_to_the_engine() -> None:
    raw = b'{"model": "m", "messages": [{"content": "\\q' + LONG.encode() + b'"}]}'
    read = read_fields(raw)
    assert read["model"] == "m"
    assert read.get("messages") is None  # reads as absent here
    with pytest.raises(BodyError):
        materialized(read)


def test_a_reader_stops_scanning_where_scans_do_not_pay_and_resumes_where_they_do() -> None:
    conversation = orjson.dumps({"model": "m", "messages": [
        {"role": "user", "content": f"message {i} " * 40} for i in range(400)]})
    long_prompt = orjson.dumps({"model": "m", "messages": [{"content": LONG}]})
    reader = BodyReader()
    tried = []
    for _ in range(8):  # give-ups: 1 tried, then 1, 2, 4 skipped between tries
        before = reader.skip
        assert reader.read(conversation)["model"] == "m"
        tried.append(before == 0)
    assert tried == [True, False, True, False, False, True, False, False]
    assert reader.scanned == 0
    while reader.skip:  # still backing off: long prompts are parsed in full meanwhile
        assert type(reader.read(long_prompt)) is dict
    assert isinstance(reader.read(long_prompt), LazyObject)  # a scan that pays...
    assert reader.backoff == 1 and reader.scanned == 1  # ...resets the backoff
