"""Request bodies as JSON objects: the depth limit holds whatever the body's shape, and
the common shapes (long prompts, many messages) pass."""

from __future__ import annotations

import orjson
import pytest

from otela.dataplane.jsonbody import (
    MAX_DEPTH,
    WALK_BUDGET,
    BodyError,
    _depth,
    parse_json_object,
)


def nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth - 1):
        value = [value]
    return {"model": "m", "messages": value}  # the object adds one level


def test_a_long_prompt_and_many_messages_pass() -> None:
    long_prompt = {"model": "m", "messages": [{"role": "user", "content": "x" * 200_000}]}
    assert parse_json_object(orjson.dumps(long_prompt)) == long_prompt
    many = {"model": "m", "messages": [{"role": "user", "content": str(i)}
                                       for i in range(WALK_BUDGET * 4)]}
    assert parse_json_object(orjson.dumps(many)) == many


@pytest.mark.parametrize("depth", [MAX_DEPTH, MAX_DEPTH + 1])
def test_the_depth_limit_is_exact(depth: int) -> None:
    raw = orjson.dumps(nested(depth))
    if depth <= MAX_DEPTH:
        assert parse_json_object(raw)["model"] == "m"
    else:
        with pytest.raises(BodyError) as caught:
            parse_json_object(raw)
        assert caught.value.code == "json_too_deep"


def test_too_deep_behind_more_containers_than_the_walk_budget_is_still_refused() -> None:
    # the walk gives up after WALK_BUDGET containers; the deep part comes after them
    body = {"model": "m", "a_wide": [{} for _ in range(WALK_BUDGET * 2)],
            "z_deep": nested(MAX_DEPTH + 5)}
    assert _depth(body, WALK_BUDGET) is None  # so the bracket count decides
    with pytest.raises(BodyError) as caught:
        parse_json_object(orjson.dumps(body))
    assert caught.value.code == "json_too_deep"


@pytest.mark.parametrize("raw, message", [
    (b"{", "not valid JSON"), (b"[1]", "must be a JSON object"), (b"", "not valid JSON")])
def test_bad_bodies_say_why(raw: bytes, message: str) -> None:
    with pytest.raises(BodyError, match=message):
        parse_json_object(raw)
