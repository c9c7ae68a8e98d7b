"""Engine output: rotating log files, fatal-pattern detection, and the post-mortem sink.

The engine writes into a pipe that otela reads line by line (``EngineOutput``), so otela
can both keep bounded, rotated log files under the node's home and notice lines after
which the engine cannot be trusted (an NCCL timeout, a CUDA out-of-memory) the moment
they are printed. On fail-stop the logs are copied to a sink directory (paper §7.1), as
nobody can SSH into a Slurm node after its job ended.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import trio

MAX_LINE_BYTES = 64 * 1024  # longer lines are written, but only this much is pattern-checked


class RotatingLog:
    """Append-only log file rotated by size: ``engine.log``, ``engine.log.1``, ... ``.N``."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab")  # noqa: SIM115 - owned for the engine's lifetime
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        if self._size and self._size + len(data) > self.max_bytes:
            self._rotate()
        self._file.write(data)
        self._file.flush()
        self._size += len(data)

    def files(self) -> list[Path]:
        """The current file and its existing backups, newest first."""
        candidates = [self.path] + [self._backup(i) for i in range(1, self.backups + 1)]
        return [p for p in candidates if p.exists()]

    def close(self) -> None:
        self._file.close()

    def _backup(self, index: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{index}")

    def _rotate(self) -> None:
        self._file.close()
        if self.backups > 0:
            self._backup(self.backups).unlink(missing_ok=True)
            for index in range(self.backups - 1, 0, -1):
                if self._backup(index).exists():
                    self._backup(index).replace(self._backup(index + 1))
            self.path.replace(self._backup(1))
        else:
            self.path.unlink(missing_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._size = 0


class FatalPatterns:
    """Case-insensitive regexes; a matching engine log line means fail-stop."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.patterns = [re.compile(p, re.IGNORECASE) for p in patterns]

    def match(self, line: str) -> str | None:
        """The pattern ``line`` matches, if any."""
        for pattern in self.patterns:
            if pattern.search(line):
                return pattern.pattern
        return None


async def pump_output(
    stream: trio.abc.ReceiveStream,
    log: RotatingLog,
    patterns: FatalPatterns,
    on_fatal: Callable[[str, str], None],
) -> None:
    """Copy ``stream`` into ``log`` until EOF, calling ``on_fatal(pattern, line)`` on matches."""
    pending = b""
    async with stream:
        while chunk := await stream.receive_some(65536):
            log.write(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > MAX_LINE_BYTES:
                lines.append(pending[:MAX_LINE_BYTES])
                pending = b""
            for raw in lines:
                line = raw[:MAX_LINE_BYTES].decode("utf-8", errors="replace")
                hit = patterns.match(line)
                if hit is not None:
                    on_fatal(hit, line.strip())


def copy_to_sink(sink: Path, name: str, files: Iterable[Path], note: str) -> Path:
    """Copy ``files`` into a fresh ``sink/name-<timestamp>/`` with a ``reason.txt``."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    target = sink / f"{name}-{stamp}"
    target.mkdir(parents=True, exist_ok=True)
    for path in files:
        if path.exists():
            shutil.copy2(path, target / path.name)
    (target / "reason.txt").write_text(note + "\n")
    return target
