"""Cooperative tasks on the simulated clock: generators that yield what they wait for.

A task yields ``Sleep(seconds)``, ``Request(peer, message, timeout)`` (the peer's reply,
or None when it did not come in time), ``Gather([Request or Connect...])`` (every
answer, all at once) or ``Connect(peer)`` (how its address answers a TCP connect). This
lets the simulator write the probe loop's I/O in the order ``otela/liveness/prober.py``
awaits it, around the same sans-IO decisions (``otela/liveness/rounds.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Request:
    peer: int
    message: dict[str, Any]
    timeout: float


@dataclass(frozen=True)
class Gather:
    requests: list[Request | Connect]


@dataclass(frozen=True)
class Connect:
    peer: int


Task = Generator[Any, Any, Any]


class Runner:
    """Steps one task: ``wait`` carries out what it yields and calls back with the value."""

    def __init__(self, task: Task, wait: Callable[[Any, Callable[[Any], None]], None],
                 done: Callable[[Any], None] = lambda value: None) -> None:
        self.task = task
        self.wait = wait
        self.done = done
        self.stopped = False

    def start(self) -> None:
        self.step(None)

    def step(self, value: Any) -> None:
        if self.stopped:
            return
        try:
            op = self.task.send(value)
        except StopIteration as finished:
            self.done(finished.value)
            return
        self.wait(op, self.step)

    def stop(self) -> None:
        self.stopped = True
        self.task.close()
