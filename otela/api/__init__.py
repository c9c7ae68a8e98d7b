"""The node's HTTP API (FastAPI, served in process by ``otela.dataplane``): the
OpenAI-compatible routes, read-only registry and network inspection, and the engine hop
other members use (``app``); OpenAI-style errors (``errors``)."""
