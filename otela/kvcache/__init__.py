"""Cache-aware routing's parts: what an engine's KV cache holds (from its own events), a
compact summary of it for the ingresses, and the ingress's view of every node's summary.
docs/routing.md ("cache_aware") explains the design."""
