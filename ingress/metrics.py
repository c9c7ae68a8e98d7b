"""Prometheus metrics per API key, counted as requests finish (an observer of the request
path, like ``otela.api.observe.RequestMetrics``; data-path workers' counts are added up
by the control process when ``/metrics`` is scraped).

Keys are labelled by id, never by secret; a request without a key (``--open``) is
labelled ``anonymous``. One series per key and status: cardinality grows with the number
of keys, which is what an operator watching per-key traffic wants.
"""

from __future__ import annotations

from otela.dataplane.exchange import Exchange
from otela.metrics import Registry


class KeyMetrics:
    def __init__(self, registry: Registry) -> None:
        self.requests = registry.counter(
            "otela_api_key_requests_total", "Requests by API key id and status (the "
            "ingress service; 'anonymous' with --open).", ("key", "status"))
        self.tokens = registry.counter(
            "otela_api_key_tokens_total", "Tokens the engines reported, by API key id and "
            "kind (prompt, completion).", ("key", "kind"))

    def finished(self, exchange: Exchange) -> None:
        key = exchange.api_key or "anonymous"
        if not exchange.model and exchange.status == 401:
            key = "unauthenticated"  # one series for every wrong key, whatever was sent
        self.requests.inc(key, str(exchange.status))
        tap = exchange.tap
        if tap is not None:
            if tap.prompt_tokens:
                self.tokens.inc(key, "prompt", by=tap.prompt_tokens)
            if tap.output_tokens:
                self.tokens.inc(key, "completion", by=tap.output_tokens)
