"""Recording served requests as an otela trace, off the request path (`--record-trace PATH`).

The request path calls `TraceRecorder.record(...)` once per finished request: it appends the
raw values to a bounded in-memory queue and returns at once (no hashing, no formatting, no
I/O, never an exception; when the queue is full the record is dropped and counted). A trio
task, `TraceRecorder.run()`, started once in the node's nursery, drains the queue every
`flush_interval` seconds, builds the records (hashing the API key always, and provider/node
ids when asked), writes them as JSON Lines and rotates the file by size: PATH is the live
file, older ones are PATH.1 ... PATH.<backups> (like logging's RotatingFileHandler), each a
complete trace with its own header. Arrivals in every file count from the recorder's
start (header `start_time`), so rotated files concatenate without adjustment.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import trio

from otela.tracing.schema import TraceRecord, hash_id, make_header

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
MAX_BATCH = 5000  # records written per pass before yielding to the event loop


@dataclass
class RecorderStats:
    recorded: int = 0  # written to a file
    dropped: int = 0  # queue full when record() was called
    invalid: int = 0  # could not be turned into a record (bad values); never raised
    rotations: int = 0
    write_errors: int = 0


class TraceRecorder:
    """Bounded, non-blocking trace recording with a background writer (see module doc)."""

    def __init__(
        self,
        path: str | Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = 10,
        queue_size: int = 100_000,
        flush_interval: float = 1.0,
        hash_ids: bool = False,
        record_prompts: bool = False,
        salt: str = "",
        source: str = "otela ingress",
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self.queue_size = queue_size
        self.flush_interval = flush_interval
        self.hash_ids = hash_ids
        self.record_prompts = record_prompts
        self.salt = salt
        self.source = source
        self.stats = RecorderStats()
        self.start_time = time.time()
        self._queue: deque[dict[str, Any]] = deque()
        self._fh: TextIO | None = None
        self._size = 0

    # ---- the hot path -----------------------------------------------------------------
    def record(
        self,
        *,
        arrival: float,
        model: str,
        input_tokens: int,
        output_tokens: int,
        status: int,
        ttft_s: float | None = None,
        e2e_s: float | None = None,
        itl_s: Sequence[float] | None = None,
        error: str | None = None,
        provider: str | None = None,
        node: str | None = None,
        api_key: str | None = None,
        stream: bool | None = None,
        max_tokens: int | None = None,
        request_id: str = "",
        prompt: str | None = None,
    ) -> bool:
        """Queue one finished request; True if queued, False if dropped (queue full).

        `arrival` is the wall-clock time (time.time()) the request reached the node;
        `ttft_s`/`e2e_s` durations from then; `itl_s` the gaps between streamed chunks (the
        writer summarises them). Never blocks, never raises.
        """
        try:
            if len(self._queue) >= self.queue_size:
                self.stats.dropped += 1
                return False
            self._queue.append(
                {
                    "arrival": arrival,
                    "model": model,
                    "input_tokens": input_tokens,
                    "output_tokens": output_tokens,
                    "status": status,
                    "ttft": ttft_s,
                    "e2e": e2e_s,
                    "itl": itl_s,
                    "error": error,
                    "provider": provider,
                    "node": node,
                    "key": api_key,
                    "stream": stream,
                    "max_tokens": max_tokens,
                    "request_id": request_id,
                    "prompt": prompt if self.record_prompts else None,
                }
            )
            return True
        except Exception:  # the request path must never see an error from here
            self.stats.dropped += 1
            return False

    @property
    def pending(self) -> int:
        return len(self._queue)

    # ---- the writer task --------------------------------------------------------------
    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Write queued records until cancelled; flush what is left when cancelled."""
        self._open()
        task_status.started()
        try:
            while True:
                await trio.sleep(self.flush_interval)
                await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                while self._queue:
                    self._write_batch()
            self._close()

    async def flush(self) -> None:
        """Write everything queued so far, yielding between batches."""
        while self._queue:
            self._write_batch()
            await trio.lowlevel.checkpoint()

    def _write_batch(self) -> None:
        lines = []
        for _ in range(min(MAX_BATCH, len(self._queue))):
            raw = self._queue.popleft()
            try:
                lines.append(json.dumps(self._build(raw).to_json(), separators=(",", ":")))
            except Exception:  # a bad value must not stop the recorder
                self.stats.invalid += 1
        if not lines:
            return
        text = "\n".join(lines) + "\n"
        try:
            if self._fh is None:
                self._open()
            elif self._size + len(text) > self.max_bytes:
                self._rotate()
            assert self._fh is not None
            self._fh.write(text)
            self._fh.flush()
            self._size += len(text)
            self.stats.recorded += len(lines)
        except OSError:
            self.stats.write_errors += 1

    def _build(self, raw: dict[str, Any]) -> TraceRecord:
        itl = sorted(float(x) for x in raw.pop("itl") or ())
        key = raw.pop("key")
        arrival = float(raw.pop("arrival")) - self.start_time
        if not math.isfinite(arrival):
            raise ValueError("arrival is not finite")
        rec = TraceRecord(
            arrival=max(0.0, arrival),
            model=str(raw.pop("model")),
            input_tokens=int(raw.pop("input_tokens")),
            output_tokens=int(raw.pop("output_tokens")),
            **{k: v for k, v in raw.items() if v is not None and v != ""},
        )
        if key:
            rec.key = hash_id(str(key), self.salt)
        if self.hash_ids:
            rec.provider = hash_id(rec.provider, self.salt) if rec.provider else None
            rec.node = hash_id(rec.node, self.salt) if rec.node else None
        if itl:
            k = len(itl)
            rec.itl_mean = sum(itl) / k
            rec.itl_p50 = itl[k // 2] if k % 2 else (itl[k // 2 - 1] + itl[k // 2]) / 2
            rec.itl_p99 = itl[min(k - 1, round(0.99 * (k - 1)))]
            rec.itl_max = itl[-1]
        return rec

    # ---- files ------------------------------------------------------------------------
    def _header_line(self) -> str:
        header = make_header(
            self.source,
            start_time=self.start_time,
            prompts=self.record_prompts,
            hashed_ids=self.hash_ids,
        )
        return json.dumps(header, separators=(",", ":")) + "\n"

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size > 0:
            self._shift()  # never append to a previous run's file: it has another header
        self._fh = self.path.open("w", encoding="utf-8")
        line = self._header_line()
        self._fh.write(line)
        self._fh.flush()
        self._size = len(line)

    def _shift(self) -> None:
        for i in range(self.backups - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()

    def _rotate(self) -> None:
        self._close()
        self.stats.rotations += 1
        self._open()

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
