"""Replay protection: assignment ids seen, each kept until its assignment expires.

Assignments live at most `Policy.max_ttl_s`, so the memory is bounded by the accept rate
times that TTL; `to_json`/`from_json` let a daemon keep it across restarts (an assignment
replayed after a restart is otherwise refused only by its expiry). Pure: callers pass `now`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class ReplayGuard:
    seen: dict[str, float] = field(default_factory=dict)  # id -> expires_at
    limit: int = 100_000

    def __contains__(self, assignment_id: str) -> bool:
        return assignment_id in self.seen

    def remember(self, assignment_id: str, expires_at: float, now: float) -> None:
        self.prune(now)
        if len(self.seen) >= self.limit:  # never grow without bound: drop the oldest
            oldest = min(self.seen, key=self.seen.__getitem__)
            del self.seen[oldest]
        self.seen[assignment_id] = expires_at

    def prune(self, now: float) -> None:
        for k in [k for k, exp in self.seen.items() if exp <= now]:
            del self.seen[k]

    def to_json(self) -> str:
        return json.dumps(self.seen)

    @classmethod
    def from_json(cls, text: str) -> ReplayGuard:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("replay memory must be a JSON object")
        return cls({str(k): float(v) for k, v in data.items()})
