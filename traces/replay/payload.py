"""Request bodies for replayed records: exact token counts without a tokenizer.

`/v1/completions` accepts a prompt given as token ids, so a record's `input_tokens` is sent
exactly (vLLM, SGLang, otela's echo engine all accept it). Ids are slices of one seeded
random sequence at random offsets, so unrelated requests share no prefix (no accidental
prefix-cache hits), while records with the same `prefix_hash` share their first
`prefix_len` ids (the hits the trace asks for). Output length is pinned with `max_tokens`,
`min_tokens` and `ignore_eos` (vLLM/SGLang extensions that other servers ignore).
The chat API is available too, with one word per input token (approximate).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from otela.tracing.schema import TraceRecord

POOL_TOKENS = 1 << 17
ID_LOW, ID_HIGH = 10, 500  # valid in any vocabulary of >= 512 tokens (the tiny test model)


@dataclass
class PayloadBuilder:
    """Builds the HTTP request bytes for one record (a few microseconds each)."""

    host: str
    path_prefix: str = ""
    api: str = "completions"  # or "chat"
    stream: bool = True
    api_key: str | None = None
    model_override: str | None = None
    exact_output: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        ids = rng.integers(ID_LOW, ID_HIGH, size=POOL_TOKENS)
        parts = [str(int(i)) for i in ids]
        # byte offset where each id starts in "a,b,c,...": slice [starts[s], starts[s+n]-1)
        self._text = ",".join(parts) + ","
        lens = np.fromiter((len(p) + 1 for p in parts), dtype=np.int64, count=len(parts))
        self._starts = np.concatenate([[0], np.cumsum(lens)])
        self._words = " ".join(f"w{int(i)}" for i in ids[:8192]) + " "
        self._word_ends = [i for i, c in enumerate(self._words) if c == " "]
        self._rng = np.random.default_rng(self.seed + 1)
        self.path = self.path_prefix.rstrip("/") + (
            "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        )
        auth = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
        accept = "text/event-stream" if self.stream else "application/json"
        self._head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nAccept: {accept}\r\n{auth}"
            "User-Agent: otela-trace-replay\r\n"
        )

    def _ids(self, n: int, start: int) -> str:
        n = min(n, POOL_TOKENS - 1)
        start = start % (POOL_TOKENS - n)
        return self._text[int(self._starts[start]) : int(self._starts[start + n]) - 1]

    def _prompt_ids(self, rec: TraceRecord) -> str:
        n = max(1, rec.input_tokens)
        rand = int(self._rng.integers(0, POOL_TOKENS))
        if rec.prefix_hash and rec.prefix_len:
            k = min(rec.prefix_len, n)
            anchor = int.from_bytes(hashlib.sha256(rec.prefix_hash.encode()).digest()[:4], "big")
            head = self._ids(k, anchor)
            return head + ("," + self._ids(n - k, rand) if n > k else "")
        return self._ids(n, rand)

    def body(self, rec: TraceRecord) -> bytes:
        model = json.dumps(self.model_override or rec.model)
        out = max(1, rec.output_tokens)
        tail = f',"max_tokens":{out}'
        if self.exact_output:
            tail += f',"min_tokens":{out},"ignore_eos":true'
        if self.stream:
            tail += ',"stream":true,"stream_options":{"include_usage":true}'
        if self.api == "chat":
            n = max(1, rec.input_tokens)
            reps, rest = divmod(n, len(self._word_ends))
            text = self._words * reps + self._words[: self._word_ends[rest - 1] if rest else 0]
            content = json.dumps(text.rstrip())
            return (
                f'{{"model":{model},"messages":[{{"role":"user","content":{content}}}]{tail}}}'
            ).encode()
        return f'{{"model":{model},"prompt":[{self._prompt_ids(rec)}]{tail}}}'.encode()

    def request(self, rec: TraceRecord) -> bytes:
        body = self.body(rec)
        rid = f"X-Otela-Request-Id: replay-{rec.request_id}\r\n" if rec.request_id else ""
        return f"{self._head}{rid}Content-Length: {len(body)}\r\n\r\n".encode() + body
