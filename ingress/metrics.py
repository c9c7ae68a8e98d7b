"""Prometheus metrics per API key, counted as requests finish (an observer of the request
path, like ``otela.api.observe.RequestMetrics``; data-path workers' counts are added up
by the control process when ``/metrics`` is scraped).

Keys are labelled by id, never by secret; a request without a key (``--open``) is
labelled ``anonymous``. One series per key and status: cardinality grows with the number
of keys, which is what an operator watching per-key traffic wants.

Requests are counted in batches (every ``_BATCH`` requests, and before every scrape): on
the request path a finished request is only remembered.
"""

from __future__ import annotations

from collections.abc import Callable

from otela.api.visibility import Audience, series_filter
from otela.dataplane.exchange import Exchange
from otela.metrics import LabelValues, Registry

_BATCH = 256


class KeyMetrics:
    """Per-key series, shown on ``/metrics`` only to whom ``[ingress] visibility``'s
    ``key_metrics`` allows (default: the admin; at ``key``, a key holder sees its own)."""

    def __init__(self, registry: Registry, audience: Audience | None = None) -> None:
        self.requests = registry.counter(
            "otela_api_key_requests_total", "Requests by API key id and status (the "
            "ingress service; 'anonymous' with --open).", ("key", "status"))
        self.tokens = registry.counter(
            "otela_api_key_tokens_total", "Tokens the engines reported, by API key id and "
            "kind (prompt, completion).", ("key", "kind"))
        self._pending: list[Exchange] = []
        registry.collect(self.count)
        if audience is not None:
            def viewer(authorization: str | None) -> Callable[[LabelValues], bool] | None:
                return series_filter(audience, "key_metrics", 0, authorization)
            self.requests.viewer = self.tokens.viewer = viewer

    def finished(self, exchange: Exchange) -> None:
        self._pending.append(exchange)
        if len(self._pending) >= _BATCH:
            self.count()

    def count(self) -> None:
        """Add the requests finished since the last count to the series."""
        pending, self._pending = self._pending, []
        requests, tokens = self.requests, self.tokens
        for exchange in pending:
            key = exchange.api_key or "anonymous"
            if not exchange.model and exchange.status == 401:
                key = "unauthenticated"  # one series for every wrong key, whatever was sent
            requests.inc(key, str(exchange.status))
            tap = exchange.tap
            if tap is not None:
                if tap.prompt_tokens:
                    tokens.inc(key, "prompt", by=tap.prompt_tokens)
                if tap.output_tokens:
                    tokens.inc(key, "completion", by=tap.output_tokens)
