"""Request traces: schema, generators, replay, analysis and recording (docs/traces.md)."""
