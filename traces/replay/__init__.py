"""Trace replay against any OpenAI-compatible endpoint (trio, raw sockets, httptools)."""
