"""Per-key rate limits: token buckets for requests and tokens per minute, a count of
requests in flight, and a sliding minute for requests. Pure: the caller passes the time.

A bucket refills continuously at the per-minute rate and holds up to ``BURST_S`` seconds
of it (at least one request), so a key cannot spend a whole minute's allowance in one
instant: what it gets over any window of ``t`` seconds is at most the burst plus
``rate * t / 60``, which is what lets several ingress nodes hold a shared limit closely.

A bucket alone lets ``rpm`` plus its burst through in some minutes (7/6 of the limit).
Requests therefore also pass a **sliding minute** (``MinuteWindow``): requests admitted are
counted per second, and a request is admitted only while the current second and the 60
before it hold fewer than ``rpm``. Any 60-second interval lies within 61 such seconds, so
a limit of N per minute admits at most N in any minute, as it says.

A request takes one request token on arrival, and waits for nothing else: the tokens it
used are known only when its answer is over, so they are charged then (``charge``), from
the usage the engine reported, and the bucket may go below zero. A key whose token bucket
is empty (or below) is refused until it refills, so a minute's use converges on ``tpm``
however long the answers are.

Several ingress nodes on one database each keep their own buckets and also charge them
with what the others served (``ingress.access`` reads that from the usage table every
second): a key's global rate then exceeds its limit by at most what the other nodes serve
in one refresh interval; docs/ingress.md works the bound out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from otela.dataplane.errors import RequestError

WINDOW_S = 60.0
BURST_S = 10.0  # a bucket holds this many seconds of its rate


@dataclass
class TokenBucket:
    """``rate`` units per minute, holding at most ``BURST_S`` seconds of them."""

    rate: float
    level: float = math.nan  # nan: full
    at: float = 0.0

    def __post_init__(self) -> None:
        self.capacity = max(1.0, self.rate * BURST_S / WINDOW_S)
        if math.isnan(self.level):
            self.level = self.capacity

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.level = min(self.capacity,
                             self.level + (now - self.at) * self.rate / WINDOW_S)
            self.at = now

    def available(self, now: float) -> float:
        self._refill(now)
        return self.level

    def take(self, amount: float, now: float) -> None:
        """Charge ``amount`` (the level may go negative: see the module docstring)."""
        self._refill(now)
        self.level -= amount

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until the bucket holds ``amount`` (0: it does)."""
        self._refill(now)
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing * WINDOW_S / self.rate


@dataclass
class MinuteWindow:
    """At most ``limit`` units in any 60 s: counts per whole second of the clock, the
    current second and the 60 before it (a running total; expired seconds drop off the
    front, so each call is O(1) amortised)."""

    limit: int
    total: int = 0
    seconds: deque[list[int]] = field(default_factory=deque)  # [second, count], in order

    def _expire(self, now: float) -> None:
        horizon = math.floor(now) - 60
        seconds = self.seconds
        while seconds and seconds[0][0] < horizon:
            self.total -= seconds.popleft()[1]

    def room(self, now: float) -> bool:
        self._expire(now)
        return self.total < self.limit

    def take(self, amount: int, now: float) -> None:
        self._expire(now)
        second = math.floor(now)
        if self.seconds and self.seconds[-1][0] >= second:
            self.seconds[-1][1] += amount
        else:
            self.seconds.append([second, amount])
        self.total += amount

    def wait_for(self, now: float) -> float:
        """Seconds until one more unit fits."""
        self._expire(now)
        excess = self.total - self.limit + 1
        for second, count in self.seconds:
            excess -= count
            if excess <= 0:
                return max(0.0, second + 61 - now)
        return 61.0


@dataclass
class KeyLimits:
    """One key's state on this ingress node."""

    requests: TokenBucket | None
    tokens: TokenBucket | None
    max_concurrent: int | None
    in_flight: int = 0
    minute: MinuteWindow | None = None  # requests in any 60 s (with ``requests``)
    subject: str = "This API key"  # whose limits, in the 429's message (or "Team x")

    def admit(self, now: float) -> None:
        """Take a request slot, or raise the 429 the caller gets (with ``Retry-After``)."""
        self.check(now)
        if self.requests is not None:
            self.requests.take(1.0, now)
        if self.minute is not None:
            self.minute.take(1, now)
        self.in_flight += 1

    def check(self, now: float) -> None:
        """Raise the 429 ``admit`` would raise now, taking nothing (a request screened
        from its headers, before its body is read)."""
        if self.max_concurrent is not None and self.in_flight >= self.max_concurrent:
            raise _too_many(f"{self.subject} has {self.max_concurrent} requests in flight, "
                            "its limit; retry when one has finished.", 1.0,
                            "concurrency_limit_exceeded")
        if self.requests is not None and self.requests.available(now) < 1.0:
            raise _too_many(f"{self.subject}'s limit of {self.requests.rate:g} requests per "
                            "minute is reached.", self.requests.wait_for(1.0, now),
                            "rate_limit_exceeded")
        if self.minute is not None and not self.minute.room(now):
            raise _too_many(f"{self.subject}'s limit of {self.minute.limit} requests per "
                            "minute is reached.", self.minute.wait_for(now),
                            "rate_limit_exceeded")
        if self.tokens is not None and self.tokens.available(now) <= 0.0:
            raise _too_many(f"{self.subject}'s limit of {self.tokens.rate:g} tokens per "
                            "minute is reached.", self.tokens.wait_for(1e-9, now),
                            "token_rate_limit_exceeded")

    def finished(self, tokens: int, now: float) -> None:
        """A request admitted here is over; it used ``tokens``."""
        self.in_flight = max(0, self.in_flight - 1)
        self.charge(0, tokens, now)

    def charge(self, requests: int, tokens: int, now: float) -> None:
        """Use made elsewhere (another ingress node) counts against this key here too."""
        if requests and self.requests is not None:
            self.requests.take(requests, now)
        if requests and self.minute is not None:
            self.minute.take(requests, now)
        if tokens and self.tokens is not None:
            self.tokens.take(tokens, now)

    def reconfigure(self, rpm: int | None, tpm: int | None, max_concurrent: int | None) -> None:
        """The key's limits changed in the database: keep what was used, at the new rates."""
        self.requests = _resized(self.requests, rpm)
        self.tokens = _resized(self.tokens, tpm)
        self.max_concurrent = max_concurrent
        if rpm is None:
            self.minute = None
        elif self.minute is None:
            self.minute = MinuteWindow(rpm)
        else:
            self.minute.limit = rpm  # what was admitted in the last minute still counts


def _resized(bucket: TokenBucket | None, rate: int | None) -> TokenBucket | None:
    if rate is None:
        return None
    if bucket is None:
        return TokenBucket(float(rate))
    if bucket.rate != rate:
        resized = TokenBucket(float(rate), at=bucket.at)
        used = bucket.capacity - bucket.level
        resized.level = max(-resized.capacity, resized.capacity - used)
        return resized
    return bucket


def limits_for(rpm: int | None, tpm: int | None, max_concurrent: int | None,
               subject: str = "This API key") -> KeyLimits:
    return KeyLimits(None if rpm is None else TokenBucket(float(rpm)),
                     None if tpm is None else TokenBucket(float(tpm)), max_concurrent,
                     minute=None if rpm is None else MinuteWindow(rpm), subject=subject)


def _too_many(message: str, retry_after: float, code: str) -> RequestError:
    return RequestError(429, message, code=code,
                        headers={"Retry-After": str(max(1, math.ceil(retry_after)))})
