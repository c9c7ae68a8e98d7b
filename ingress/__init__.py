"""Public ingress service: API keys, usage accounting, rate limits, dashboard (later issue)."""
