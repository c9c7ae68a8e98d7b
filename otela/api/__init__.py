"""The node's HTTP API: OpenAI-compatible routing and read-only registry inspection."""
