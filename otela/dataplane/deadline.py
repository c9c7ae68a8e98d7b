"""How long an engine may take to send the first byte of its answer, per request. Pure.

A hung engine (a deadlocked worker, a GPU fault that does not kill the process) takes a
request and sends nothing; its client learns only when this runs out (a 504). One fixed
limit cannot suit both kinds of answer: a stream's first byte comes once the prompt is
processed (seconds, a minute under heavy queueing), a non-streamed answer's first byte is
its last (it grows with the tokens asked for). So:

- streams: ``stream_s`` (``--first-byte-timeout``, 60 s);
- non-streamed answers: ``stream_s`` plus ``per_token_s`` (0.1 s: decoding at 10 tokens a
  second, slower than any engine that is not stuck) per requested output token
  (``max_tokens`` or ``max_completion_tokens``), at most ``ceiling_s``
  (``--response-timeout``, 300 s), and ``ceiling_s`` when the request sets no limit.

A hung engine then costs a streaming client 60 s, and a non-streaming client asking for
256 tokens 86 s, instead of 300 s for everyone. The ingress and the serving node's hop
compute the same value from the same body.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otela.config.schema import default_of

PER_TOKEN_S = 0.1  # decoding at 10 tokens a second: slower than any engine not stuck


@dataclass(frozen=True)
class FirstByteTimeouts:
    stream_s: float = default_of("first_byte_timeout")
    per_token_s: float = PER_TOKEN_S
    ceiling_s: float = default_of("response_timeout")

    def for_request(self, stream: bool, max_tokens: int | None) -> float:
        if stream:
            return self.stream_s
        if max_tokens is None:
            return max(self.stream_s, self.ceiling_s)
        return max(self.stream_s, min(self.ceiling_s,
                                      self.stream_s + self.per_token_s * max_tokens))

    def for_body(self, body: Mapping[str, Any]) -> float:
        """The timeout for a request whose JSON body is ``body``."""
        return self.for_request(body.get("stream") is True, requested_tokens(body))


def requested_tokens(body: Mapping[str, Any]) -> int | None:
    """The output tokens a request asks for at most, if it says."""
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
