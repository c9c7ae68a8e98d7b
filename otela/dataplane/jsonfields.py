"""A long request body's top-level fields, read without parsing the prompt.

The request path reads a handful of top-level fields (``model``, ``stream``,
``max_tokens``, ``user``, the ``otela`` extension, ...) and relays the body as the client
sent it. Parsing a 200 KB prompt to read them costs ~180 us per hop in ``orjson`` (more
with non-ASCII text), and the prompt itself is never looked at unless a policy or a trace
needs its text. So a body of ``LAZY_FROM`` bytes or more is *scanned* instead: one pass
over its top-level object records where each member's value starts and ends, jumping
over strings with ``bytes.find`` (memchr speed) and walking only the brackets between
them. Members up to ``EAGER_BYTES`` long (``model``, ``stream``, ``max_tokens``, the
extension, ...) are decoded at once, strictly, by ``orjson``, so a malformed field otela
reads is otela's 400 as before; longer ones (the prompt, the messages) when first read.

What the scan checks: the body is one JSON object; its keys are strings, each once (a
repeated key: parsed in full, as before, the last one wins); brackets balance outside
strings and nest at most ``max_depth`` deep; strings end. What it leaves to the engine:
the inside of long values (a bad escape in a prompt, a malformed number in a message)
reaches the engine, which refuses it with its own 400, where a short body gets otela's;
read here (a prompt for prefix affinity or a trace), such a value reads as absent.

Bodies the scan does not take on (more than ``MAX_TOKENS`` structural tokens, as with
a long conversation of short messages, or ``MAX_ESCAPED_QUOTES`` escaped quotes, as in
code) are parsed in full, as are short ones: each token costs the scan a step in Python
(~0.5 us) where ``orjson`` pays nanoseconds, so for those it is the faster of the two.
A scan that gave up cost time for nothing, so a ``BodyReader`` backs off: after a give-up
it parses the next 1, 2, 4, ... up to ``MAX_BACKOFF`` long bodies in full without trying,
and a scan that pays resets that. A workload of long conversations then pays the scan's
give-up on one long body in 64; one of long single prompts never parses them. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from otela.dataplane.jsonbody import MAX_DEPTH, BodyError, parse_json_object

LAZY_FROM = 32 * 1024  # bytes: shorter bodies are parsed in full (~30 us at this size)
MAX_TOKENS = 256  # brackets and strings the scan walks before it hands over to orjson
MAX_ESCAPED_QUOTES = 64  # \" in strings: each costs a step in Python (code, quoted JSON)
EAGER_BYTES = 1024  # members up to this long are decoded (and checked) at once
MAX_BACKOFF = 64  # long bodies parsed in full, at most, after scans that did not pay

_STRUCTURE = re.compile(rb'["\[\]{}]')
_SCALAR_END = re.compile(rb"[,}\]\s]")
_SPACE = frozenset(b" \t\r\n")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_OPENERS, _CLOSERS = frozenset(b"[{"), frozenset(b"]}")


class _Unscanned(Exception):
    """The scan gives up: parse the body in full (which also says what is wrong)."""


def read_fields(raw: bytes, max_depth: int = MAX_DEPTH) -> Mapping[str, Any]:
    """The body's top-level object: a ``dict`` for a short body, a ``LazyObject`` for a
    long one; ``BodyError`` if it is not an acceptable JSON object (module docstring). A
    one-off read: the request path keeps a ``BodyReader``, which remembers scans that did
    not pay."""
    return BodyReader(max_depth).read(raw)


class BodyReader:
    """``read_fields`` that stops trying to scan where scans do not pay (module
    docstring); one per request path (the ingress's routes, the engine hop's gate)."""

    def __init__(self, max_depth: int = MAX_DEPTH) -> None:
        self.max_depth = max_depth
        self.skip = 0  # long bodies still to parse in full without scanning
        self.backoff = 1
        self.scanned = 0  # long bodies read without parsing the prompt (for tests, metrics)

    def read(self, raw: bytes) -> Mapping[str, Any]:
        if len(raw) < LAZY_FROM:
            return parse_json_object(raw, self.max_depth)
        if self.skip > 0:
            self.skip -= 1
            return parse_json_object(raw, self.max_depth)
        try:
            fields = LazyObject(raw, _scan(raw, self.max_depth))
        except (_Unscanned, orjson.JSONDecodeError):
            self.skip, self.backoff = self.backoff, min(self.backoff * 2, MAX_BACKOFF)
            return parse_json_object(raw, self.max_depth)
        self.backoff = 1
        self.scanned += 1
        return fields


def materialized(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` as a mutable ``dict`` (parsed in full once, for the rare paths that
    rewrite the body: the ``otela`` extension, usage asked for on a client's behalf)."""
    return body if isinstance(body, dict) else body.full()  # type: ignore[attr-defined]


class LazyObject(Mapping[str, Any]):
    """A JSON object whose members are decoded when first read."""

    def __init__(self, raw: bytes, spans: dict[str, tuple[int, int]]) -> None:
        self._raw = raw
        self._spans = spans
        self._values: dict[str, Any] = {
            key: orjson.loads(raw[start:end]) for key, (start, end) in spans.items()
            if end - start <= EAGER_BYTES}
        self._full: dict[str, Any] | None = None

    def __getitem__(self, key: str) -> Any:
        if key in self._values:
            return self._values[key]
        start, end = self._spans[key]
        try:
            value = orjson.loads(self._raw[start:end])
        except orjson.JSONDecodeError:
            value = None  # the engine refuses the body; here it reads as absent
        self._values[key] = value
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._spans

    def __iter__(self) -> Iterator[str]:
        return iter(self._spans)

    def __len__(self) -> int:
        return len(self._spans)

    def full(self) -> dict[str, Any]:
        """Every member decoded, as a ``dict`` (once; later calls give the same dict);
        ``BodyError`` if a long member is not valid JSON after all."""
        if self._full is None:
            self._full = parse_json_object(self._raw)
        return self._full


def _scan(raw: bytes, max_depth: int) -> dict[str, tuple[int, int]]:
    """Where each top-level member's value is: key -> (start, end) in ``raw``."""
    end = len(raw)
    at = _skip_space(raw, 0, end)
    if at >= end or raw[at] != ord("{"):
        raise _Unscanned
    at = _skip_space(raw, at + 1, end)
    spans: dict[str, tuple[int, int]] = {}
    budget = [MAX_TOKENS, MAX_ESCAPED_QUOTES]
    if at < end and raw[at] == ord("}"):
        return _finish(raw, at + 1, end, spans)
    while True:
        if at >= end or raw[at] != _QUOTE:
            raise _Unscanned
        key_end = _string_end(raw, at, end, budget)
        try:
            key = orjson.loads(raw[at:key_end])
        except orjson.JSONDecodeError:
            raise _Unscanned from None
        if key in spans:
            raise _Unscanned  # a repeated key: let the full parse decide which wins
        at = _skip_space(raw, key_end, end)
        if at >= end or raw[at] != ord(":"):
            raise _Unscanned
        start = _skip_space(raw, at + 1, end)
        stop = _value_end(raw, start, end, max_depth, budget)
        spans[key] = (start, stop)
        at = _skip_space(raw, stop, end)
        if at < end and raw[at] == ord(","):
            at = _skip_space(raw, at + 1, end)
            continue
        if at < end and raw[at] == ord("}"):
            return _finish(raw, at + 1, end, spans)
        raise _Unscanned


def _finish(raw: bytes, at: int, end: int, spans: dict[str, tuple[int, int]]
            ) -> dict[str, tuple[int, int]]:
    if _skip_space(raw, at, end) != end:
        raise _Unscanned  # something after the object
    return spans


def _skip_space(raw: bytes, at: int, end: int) -> int:
    while at < end and raw[at] in _SPACE:
        at += 1
    return at


def _string_end(raw: bytes, at: int, end: int, budget: list[int]) -> int:
    """Just past the string starting at ``raw[at]`` (a quote); ``budget[1]``: escaped
    quotes the scan may still step over."""
    find = raw.find
    quote = at + 1
    while True:
        quote = find(b'"', quote, end)
        if quote < 0:
            raise _Unscanned
        slash = quote - 1
        while raw[slash] == _BACKSLASH:
            slash -= 1
        if (quote - 1 - slash) % 2 == 0:  # not escaped
            return quote + 1
        budget[1] -= 1
        if budget[1] < 0:
            raise _Unscanned
        quote += 1


def _value_end(raw: bytes, at: int, end: int, max_depth: int, budget: list[int]) -> int:
    """Just past the value starting at ``raw[at]``."""
    if at >= end:
        raise _Unscanned
    first = raw[at]
    if first == _QUOTE:
        return _string_end(raw, at, end, budget)
    if first not in _OPENERS:
        found = _SCALAR_END.search(raw, at, end)
        stop = found.start() if found else end
        if stop == at:
            raise _Unscanned
        return stop
    depth = 0
    search = _STRUCTURE.search
    while True:
        budget[0] -= 1
        if budget[0] < 0:
            raise _Unscanned
        found = search(raw, at, end)
        if found is None:
            raise _Unscanned
        at = found.start()
        char = raw[at]
        if char == _QUOTE:
            at = _string_end(raw, at, end, budget)
            continue
        if char in _OPENERS:
            depth += 1
            if depth + 1 > max_depth:  # the top-level object is one level
                raise BodyError(f"request body nests deeper than {max_depth} levels",
                                code="json_too_deep")
        else:
            depth -= 1
        at += 1
        if depth == 0:
            return at
